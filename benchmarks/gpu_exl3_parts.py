"""EXL3 on the GPU, part by part: the input and output Hadamard transforms alone (``kernels/triton/hadamard.py``
over its launch choices, and the same transform through cuBLAS on the ``[M * K / 128, 128]`` view), each checked
against float64, at M = 1, 16 and 256; and the lane-wise M = 1 decode GEMV (``kernels/triton/exl3_gemv.py``) over its
launch choices, checked against the block decode kernel first.

    PYTHONPATH=src python benchmarks/gpu_exl3_parts.py [--shapes 4096x14336,14336x4096] [--bits 2,4] [--no-gemv]

Times (us, median of CUDA graph replays over enough weight copies to exceed 4x L2, ``gpu_linear.timed``) next to
bf16 ``F.linear`` at M = 1. GEMV variants: n tiles per program (``tiles_n``), prefetch of the next k tile's words,
warps per program; the K split is the launcher's rule (``--splits``: multiples of it, over smaller launches).
``$OUT``, when set, receives ``gpu_exl3_parts.md``.
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
#: the ``--splits`` sweep's launches: more, smaller programs (more warps resident to hide the decode's latency)
SPLIT_TILES, SPLIT_WARPS = (4, 8, 16), (2, 4, 8)
TRANSFORM_MS = (1, 16, 256)
#: (rows per program, warps) launches of the butterflies besides the default rule; None: the rule
TRANSFORM_LAUNCHES = ((None, None), (1, 1), (1, 4), (2, 1), (4, 1), (4, 4), (8, 4), (16, 4), (16, 8))


def transform_runs(s: torch.Tensor, y: torch.Tensor, had: torch.Tensor) -> dict[str, tuple]:
    """name -> (input transform of v, output transform of ``y``) with the scale vector ``s``."""
    from qlinear.kernels.triton import hadamard
    from qlinear.layouts import exl3

    runs = {f"butterfly {r or 'rule'} rows x {w or 'rule'} warps": (
        lambda v, r=r, w=w: hadamard.input_transform(v, s, r, w),
        lambda v, r=r, w=w: hadamard.output_transform(y, s, None, torch.bfloat16, r, w))
        for r, w in TRANSFORM_LAUNCHES}
    runs["cuBLAS on the [M*K/128, 128] view"] = (lambda v: exl3.had_last(v.float() * s, had).half(),
                                                 lambda v: (exl3.had_last(y, had) * s).bfloat16())
    return runs


def transforms(args: argparse.Namespace) -> None:
    """Both transforms per launch and through cuBLAS, against float64 ``had_last``; each timed as 20 calls in one
    graph on an L2-resident activation (as in a decoder step)."""
    from gpu_linear import timed
    from qlinear.layouts import exl3

    gen = torch.Generator(device=DEV).manual_seed(1)
    had, had64 = exl3.hadamard(DEV), exl3.hadamard(DEV, torch.float64)
    say("## Hadamard transforms (us per call; input: max |diff| to float64 in float16 ulps; output: relative error)")
    say()
    say("| K or N | M | launch | input us | input err | output us | output rel err |")
    say("|---|---|---|---|---|---|---|")
    for width in sorted({d for shape in args.shapes for d in shape}):
        s = torch.randn(width, device=DEV, generator=gen)
        for m in TRANSFORM_MS:
            x = torch.randn(m, width, device=DEV, dtype=torch.bfloat16, generator=gen)
            y = torch.randn(m, width, device=DEV, generator=gen)
            want_in = exl3.had_last(x.double() * s.double(), had64)
            want_out = exl3.had_last(y.double(), had64) * s.double()
            ulp = want_in.abs().clamp_min(2 ** -14).log2().floor().exp2() * 2 ** -10
            for name, (fin, fout) in transform_runs(s, y, had).items():
                err_in = float(((fin(x).double() - want_in).abs() / ulp).max())
                err_out = float((fout(x).double() - want_out).norm() / want_out.norm())
                t_in, t_out = timed([fin] * 20, x, args.reps), timed([fout] * 20, x, args.reps)
                say(f"| {width} | {m} | {name} | {t_in:.1f} | {err_in:.2f} ulp | {t_out:.1f} | {err_out:.1e} |")
    say()


def sweep(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed
    from qlinear.kernels.triton import exl3_gemv, exl3_mv, hadamard

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    gen = torch.Generator(device=DEV).manual_seed(0)
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, gen)
        x = torch.randn(args.m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        tb = timed(wb, x, args.reps)
        su = torch.randn(k, device=DEV, generator=gen)
        say(f"## {k}x{n} M = {args.m} GEMV: bf16 F.linear {tb:.1f} us")
        say()
        say("| bits | tiles_n | prefetch | warps | rows a program | K split | us | / bf16 | rel diff vs block kernel |")
        say("|---|---|---|---|---|---|---|---|---|")
        xh = hadamard.input_transform(x, su)
        for bits, cb in itertools.product(args.bits, args.codebooks):
            trs = [torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), device=DEV, dtype=torch.int16,
                                 generator=gen) for _ in range(copies(k * n * bits // 8))]
            want = exl3_mv.fused_product(xh, trs[0], bits, cb, sms).double()
            tblock = timed([lambda v, t=t, b=bits, cb=cb: exl3_mv.fused_product(v, t, b, cb, sms) for t in trs], xh,
                           args.reps)
            label = f"{bits} {cb}"
            say(f"| {label} | block kernel (tl.dot) | - | 4 | - | - | {tblock:.1f} | {tblock / tb:.2f} | - |")
            if args.rule:
                variants = [(None, exl3_gemv.PREFETCH, None, None, None, None)]
            elif args.maxnreg:
                variants = [(None, exl3_gemv.PREFETCH, None, r, None, None) for r in args.maxnreg]
            elif args.splits:
                variants = [(tn, exl3_gemv.PREFETCH, w, None, f, r) for tn, w, f, r in
                            itertools.product(SPLIT_TILES, SPLIT_WARPS, args.splits, args.row_blocks)]
            else:
                variants = [(*v, None, None, None) for v in VARIANTS]
            for tiles_n, pre, warps, regs, factor, rows in variants:
                split = None
                if factor:  # the rule's split for this launch, times factor (capped at one k tile a slice)
                    kt, nt = k // 16, n // 16
                    split = min(kt, exl3_gemv.k_split(nt // (tiles_n or exl3_gemv.launch_shape(bits)[0]), kt, sms)
                                * factor)

                def gemv(v, t, b=bits, cb=cb, tiles_n=tiles_n, pre=pre, warps=warps, regs=regs, split=split,
                         rows=rows):
                    return exl3_gemv.gemv_product(v, t, b, cb, sms, tiles_n=tiles_n, warps=warps, prefetch=pre,
                                                  maxnreg=regs or None, split=split, rows=rows)
                got = gemv(xh, trs[0]).double()
                rel = float((got - want).norm() / want.norm())
                tv = timed([lambda v, t=t, f=gemv: f(v, t) for t in trs], xh, args.reps)
                regs_note = f" (regs {regs})" if regs else ""
                say(f"| {label} | {tiles_n or 'rule'} | {pre} | {warps or 'rule'} | {rows or 'rule'}{regs_note} | "
                    f"{split or 'rule'} | {tv:.1f} | {tv / tb:.2f} | {rel:.1e} |")
            del trs
        say()
        del wb
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> str:
    p = parser(__doc__, SHAPES, (1,), reps=30)
    p.add_argument("--bits", default="2,4")
    p.add_argument("--codebooks", default="3inst", help="comma-separated: 3inst, mcg, mul1")
    p.add_argument("--rule", action="store_true", help="GEMV at the launch rule only")
    p.add_argument("--m", type=int, default=1, help="rows of x for the GEMV sweep")
    p.add_argument("--row-blocks", default="", help="with --splits: rows a program takes (1, 2, 4, 8; default the "
                                                    "rule's)")
    p.add_argument("--no-gemv", action="store_true", help="time the transforms only")
    p.add_argument("--no-transforms", action="store_true", help="time the GEMV only")
    p.add_argument("--maxnreg", default="", help="GEMV at the launch rule with these register caps (0: none) "
                                                 "instead of the launch sweep")
    p.add_argument("--splits", default="", help="GEMV over n tiles 4/8/16 x warps 2/4/8 with the K split this many "
                                                "times the launcher's rule (1: the rule), instead of the launch sweep")

    args = parse_args(p, argv, "bits")
    args.maxnreg = [int(v) for v in args.maxnreg.split(",") if v]
    args.splits = [int(v) for v in args.splits.split(",") if v]
    args.codebooks = args.codebooks.split(",")
    args.row_blocks = [int(v) for v in args.row_blocks.split(",") if v] or [None]

    def body() -> None:
        if not args.no_transforms:
            transforms(args)
        if not args.no_gemv:
            sweep(args)

    return run("gpu_exl3_parts", "EXL3 parts", argv, args.out, body)


if __name__ == "__main__":
    main()
