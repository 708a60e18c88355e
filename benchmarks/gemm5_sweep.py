"""gemm5 (gemm4 with a TMA loader warp, ``triton/qmm5.py``) configs against the layer's shipped choice, bf16
cuBLAS, Marlin and Machete, side by side in one run (``mid_m_sweep.py``: every config checked first, two calls
bit-identical).

    python3 benchmarks/gemm5_sweep.py [--shapes 4096x14336,...] [--m 16,64,128,256,1024] [--peers] [--json out]

Tiles: one consumer warpgroup (with or without a 128-register launch cap, which lets two CTAs share an SM) or
two; 64- or 128-code steps, deeper rings for the shorter steps; up to 32 rows also 80- and 64-register caps
(three and four CTAs an SM).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mid_m_sweep import arguments, sweep
from qlinear.kernels.triton import configs

#: (block_n, consumer warps, register cap): 128 registers at launch fit two 4+4-warp CTAs on an SM
WARPS = ((64, 4, 128), (128, 4, 128), (128, 4, 0), (128, 8, 0), (256, 8, 0))
#: (block_n, warps, cap, block_k, stages) for M tiles up to 32: three CTAs an SM under 80 registers, four under
#: 64 (offline SASS, Triton 3.6: these keep their wgmma pipelined without spills; 16x128 under 96 does not)
SMALL = ((64, 4, 80, 128, 4), (64, 4, 80, 128, 8), (64, 4, 80, 64, 8), (64, 4, 64, 64, 8))


def tiles_for(m: int) -> list[tuple[int, ...]]:
    """(block_m, block_n, block_k, warps, stages, registers) worth timing at this M: M tiles of the bucket and
    half it (128 and 256 above 256 rows), 64- and 128-code steps; no tile whose float32 accumulator takes more
    than 128 registers a thread (256 x 128 on one warpgroup spilled: 930 us where two warpgroups took 256)."""
    b = configs.m_bucket(m)
    out = []
    for bm in (16, 32, 64, 128, 256):
        if not (bm == max(16, min(b, 256)) or (16 <= b // 2 == bm <= 128) or (b > 256 and bm == 128)):
            continue
        for bn, w, regs in WARPS:
            for bk, st in ((64, 6), (128, 4)):
                if bm * bn > 128 * 32 * w:
                    continue
                out.append((bm, bn, bk, w, st, regs))
        if bm <= 32:
            out += [(bm, bn, bk, w, st, regs) for bn, w, regs, bk, st in SMALL]
    return out


def main() -> int:
    args = arguments(__doc__, "16,64,128,256,1024").parse_args()
    return sweep(args, "gemm5", tiles_for, None)


if __name__ == "__main__":
    sys.exit(main())
