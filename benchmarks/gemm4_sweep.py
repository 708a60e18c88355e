"""gemm4 (Gluon, ``triton/qmm4.py``) configs against the layer's shipped choice, bf16 cuBLAS, Marlin and Machete,
side by side in one run (``mid_m_sweep.py``: every config checked first, two calls bit-identical).

    python3 benchmarks/gemm4_sweep.py [--shapes 4096x14336,...] [--m 16,64,128,256] [--peers] [--quick] [--json out]

gemm4 is gemm3's swap-AB product with the pipeline written out: the next step's dequantization runs while this
step's wgmma does.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mid_m_sweep import arguments, sweep
from qlinear.kernels.triton import configs


def tiles_for(m: int, quick: bool) -> list[tuple[int, int, int, int, int]]:
    """(block_m, block_n, block_k, warps, stages) worth timing at this M: M tiles of the bucket or half it (128
    and 256 above 256 rows)."""
    b = configs.m_bucket(m)
    out = []
    for bm in (16, 32, 64, 128, 256):
        if bm > max(16, b) or (bm < b // 2 and not (b > 256 and bm >= 128)):
            continue
        for bn, w in ((64, 4), (128, 4), (128, 8), (256, 8)):
            for bk, st in ((64, 4), (128, 4)) if quick else ((64, 4), (64, 6), (128, 3), (128, 4)):
                if bm * bn > 256 * 128:
                    continue
                out.append((bm, bn, bk, w, st))
    return out


def main() -> int:
    ap = arguments(__doc__, "16,64,128,256")
    ap.add_argument("--quick", action="store_true", help="two (block_k, stages) pairs instead of four")
    args = ap.parse_args()
    return sweep(args, "gemm4", lambda m: tiles_for(m, args.quick), None)


if __name__ == "__main__":
    sys.exit(main())
