"""EXL3 at M = 1 on the GPU, part by part: the input and output transforms alone, and the lane-wise decode GEMV
(``kernels/triton/exl3_gemv.py``) over its launch choices, each checked against the block decode kernel first.

    PYTHONPATH=src python benchmarks/gpu_exl3_parts.py [--shapes 4096x14336,14336x4096] [--bits 2,4]

Times (us, median of CUDA graph replays over enough weight copies to exceed 4x L2, ``gpu_linear.timed``) next to
bf16 ``F.linear`` at M = 1. GEMV variants: n tiles per program (``tiles_n``), prefetch of the next k tile's words,
warps per program; the K split is the launcher's rule. ``$OUT``, when set, receives ``gpu_exl3_parts.md``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import bf16_baseline, parser, run, say
from gpu_report import parse as parse_args

SHAPES = ((4096, 14336), (14336, 4096))
DEV = torch.device("cuda")
VARIANTS = tuple(itertools.product((8, 16, 32), (False, True), (4, 8)))  # (tiles_n, prefetch, warps)


def sweep(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed
    from qlinear.kernels.triton import exl3_gemv, exl3_mv
    from qlinear.layouts import exl3

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    gen = torch.Generator(device=DEV).manual_seed(0)
    had = exl3.hadamard(DEV)
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, gen)
        x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        tb = timed(wb, x, args.reps)
        su, sv = torch.randn(k, device=DEV, generator=gen), torch.randn(n, device=DEV, generator=gen)
        y32 = torch.randn(1, n, device=DEV, generator=gen)
        t_in = timed([lambda v, su=su: exl3_mv.input_transform(v, su, had)], x, args.reps)
        t_out = timed([lambda v, y=y32, s=sv: exl3_mv.output_transform(y, s, None, had, torch.bfloat16)], x,
                      args.reps)
        say(f"## {k}x{n}: bf16 F.linear {tb:.1f} us; input transform {t_in:.1f} us; output transform "
            f"{t_out:.1f} us")
        say()
        say("| bits | tiles_n | prefetch | warps | us | / bf16 | rel diff vs block kernel |")
        say("|---|---|---|---|---|---|---|")
        xh = exl3_mv.input_transform(x, su, had)
        for bits in args.bits:
            trs = [torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), device=DEV, dtype=torch.int16,
                                 generator=gen) for _ in range(copies(k * n * bits // 8))]
            want = exl3_mv.fused_product(xh, trs[0], bits, "3inst", sms).double()
            tblock = timed([lambda v, t=t, b=bits: exl3_mv.fused_product(v, t, b, "3inst", sms) for t in trs], xh,
                           args.reps)
            say(f"| {bits} | block kernel (tl.dot) | - | 4 | {tblock:.1f} | {tblock / tb:.2f} | - |")
            for tiles_n, pre, warps in VARIANTS:
                def gemv(v, t, b=bits, tiles_n=tiles_n, pre=pre, warps=warps):
                    return exl3_gemv.gemv_product(v, t, b, "3inst", sms, tiles_n=tiles_n, warps=warps, prefetch=pre)
                got = gemv(xh, trs[0]).double()
                rel = float((got - want).norm() / want.norm())
                tv = timed([lambda v, t=t, f=gemv: f(v, t) for t in trs], xh, args.reps)
                say(f"| {bits} | {tiles_n} | {pre} | {warps} | {tv:.1f} | {tv / tb:.2f} | {rel:.1e} |")
            del trs
        say()
        del wb
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> str:
    p = parser(__doc__, SHAPES, (1,), reps=30)
    p.add_argument("--bits", default="2,4")
    args = parse_args(p, argv, "bits")
    return run("gpu_exl3_parts", "EXL3 M = 1 parts", argv, args.out, lambda: sweep(args))


if __name__ == "__main__":
    main()
