"""Mid-M sweep (M = 32..512): ``gemm3`` configs against ``gemm2`` (shipped config), bf16 cuBLAS, Marlin and
Machete, side by side in one run; every config's output checked against a float reference first.

    python3 benchmarks/gemm3_sweep.py [--shapes 4096x14336,...] [--m 64,128,256] [--peers] [--json out.json]

``gemm3`` is skinny3's swap-AB wgmma (``triton/qmm3.py``: the dequantized weight tile is the MMA's A operand,
straight from registers; x^T the B operand from shared memory) tiled over M as well. Weights rotate over
copies totalling > 4x L2; CUDA-graph replay; median.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mid_m_sweep import arguments, sweep
from qlinear.kernels.triton import configs


def tiles_for(m: int) -> list[tuple[int, int, int, int, int]]:
    """(block_m, block_n, block_k, warps, stages) worth timing at this M: rows per tile up to the bucket."""
    out = []
    for bm in (64, 128, 256):
        if bm > max(64, configs.m_bucket(m)) or bm < configs.m_bucket(m) // 2:
            continue
        for bn, w in ((128, 4), (128, 8), (256, 8)):
            for bk, st in ((64, 4), (128, 3)):
                if bm == 256 and bn == 256:
                    continue
                out.append((bm, bn, bk, w, st))
    return out


def main() -> int:
    args = arguments(__doc__, "64,128,256").parse_args()
    return sweep(args, "gemm3", tiles_for, "gemm2")


if __name__ == "__main__":
    sys.exit(main())
