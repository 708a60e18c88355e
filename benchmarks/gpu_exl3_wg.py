"""EXL3 decoded into wgmma A fragments (``exl3_wg.py``, Gluon, sm_90) against the route it may take over at M = 33 and
up: the Triton fused kernel (to 64) and decode + float16 matmul (above).

    PYTHONPATH=src:benchmarks python benchmarks/gpu_exl3_wg.py [--shapes 4096x14336,14336x4096] [--ms 48,64,128,256]

Checks first, on CUDA: ``exl3_wg.wg_product`` decodes bit for bit (64 rows of the identity give 64 rows of the Torch
layout's inner weight) and matches the float64 product within 1e-5 (relative) at 100 rows with a K split, at every
width 1-8 x every codebook. Then us per call (median of CUDA graph replays over weight copies exceeding L2) beside
bf16 ``F.linear``: the shipped route (``exl3_mv.inner_product``), the fused kernel, decode + matmul, and the wgmma
kernel over launches (n tiles, k tiles a step, warps, x stages, programs per SM), each checked against float64
before it is timed. ``$OUT``, when set, receives ``gpu_exl3_wg.md``.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from exl3_sweep import rel, sweep
from gpu_report import checks_then_timing, parser, say
from gpu_report import parse as parse_args

SHAPES = ((4096, 14336), (14336, 4096))
DEV = torch.device("cuda")
#: (n tiles, k tiles a step, warps, x stages, programs per SM) of the sweep
LAUNCHES = ((8, 2, 4, 4, 4), (4, 2, 4, 4, 4), (4, 4, 4, 4, 4), (16, 2, 8, 4, 4), (8, 2, 4, 4, 8))
WIDTHS = ((2, "3inst"), (4, "3inst"), (2, "mul1"), (2, "mcg"))


def checks(gen: torch.Generator) -> int:
    from qlinear.kernels.triton import exl3_wg
    from qlinear.layouts import exl3

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    failed = 0
    say("| bits codebook | decode bit-exact (identity rows) | relative error at M = 100, split 2 (<= 1e-5) |")
    say("|---|---|---|")
    eye = torch.eye(1024, device=DEV, dtype=torch.float16)
    for bits, cb in itertools.product(range(1, 9), exl3.CODEBOOKS):
        tr = torch.randint(-(1 << 15), 1 << 15, (64, 48, 16 * bits), device=DEV, dtype=torch.int16, generator=gen)
        inner16 = exl3.inner_weight(tr.cpu(), bits, exl3.codebook_table(cb)).to(DEV)
        exact = all(torch.equal(exl3_wg.wg_product(eye[k0:k0 + 64], tr, bits, cb, sms).half().view(torch.int16),
                                inner16[k0:k0 + 64].view(torch.int16)) for k0 in range(0, 1024, 64))
        xh = torch.randn(100, 1024, device=DEV, generator=gen).half()
        err = rel(exl3_wg.wg_product(xh, tr, bits, cb, sms, split=2), xh.double() @ inner16.double())
        failed += (not exact) + (not err <= 1e-5)
        say(f"| {bits} {cb} | {exact} | {err:.2e} |")
    say()
    return failed


def timing(args, gen: torch.Generator) -> int:
    from qlinear.kernels.triton import exl3_mv, exl3_wg

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count

    def others(m: int, bits: int, cb: str) -> dict:
        return {"shipped route": lambda v, t: exl3_mv.inner_product(v, t, bits, cb, sms),
                "fused (Triton)": lambda v, t: exl3_mv.fused_product(v, t, bits, cb, sms),
                "decode + matmul": lambda v, t: v @ exl3_mv.decode_inner(t, bits, cb)}

    def launched(launch: tuple, bits: int, cb: str):
        nt_, kt_, w, st, per = launch
        return lambda v, t: exl3_wg.wg_product(v, t, bits, cb, sms, tiles_n=nt_, tiles_k=kt_, warps=w, stages=st,
                                               per_sm=per)

    return sweep(args, gen, "wgmma (n tiles, k tiles, warps, stages, per SM)", others, args.launches, launched,
                 lambda m: (*exl3_wg.LAUNCH, exl3_wg.PROGRAMS_PER_SM))


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, SHAPES, (48, 64, 128, 256), reps=20)
    p.add_argument("--launches", default=",".join("x".join(map(str, la)) for la in LAUNCHES),
                   help="n tiles x k tiles x warps x stages x programs per SM, comma separated")
    p.add_argument("--widths", default=",".join(f"{b}:{c}" for b, c in WIDTHS), help="bits:codebook, comma separated")
    args = parse_args(p, argv)
    args.widths = [(int(w.split(":")[0]), w.split(":")[1]) for w in args.widths.split(",")]
    args.launches = [tuple(int(v) for v in la.split("x")) for la in args.launches.split(",")]
    gen = torch.Generator(device=DEV).manual_seed(5)
    return checks_then_timing("gpu_exl3_wg", "EXL3 into wgmma fragments (Gluon) against the fused kernel and "
                              "decode + matmul", argv, args, lambda: checks(gen), lambda a: timing(a, gen))


if __name__ == "__main__":
    sys.exit(main())
