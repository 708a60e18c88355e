"""EXL3 decoded straight into mma fragments (``exl3_tc.py``, Gluon) against the lane-wise GEMV and the Triton fused
kernel it may replace, at M = 1..64.

    PYTHONPATH=src:benchmarks python benchmarks/gpu_exl3_tc.py [--shapes 4096x14336,14336x4096] [--ms 1,4,16,64]

Checks first, on CUDA: ``exl3_tc.tc_product`` against the float64 product of the Torch layout's inner weight at
every width 1-8 x every codebook, at row counts and launches that cover a K split, a partial row block and
three-word widths (relative error <= 1e-5). Then us per call (median of CUDA graph replays over weight copies
exceeding L2) beside bf16 ``F.linear``: the shipped route (``exl3_mv.inner_product``), the GEMV, the fused
kernel, and the tensor-core kernel over launches (n tiles, k tiles a step, warps, programs per SM), each checked
against float64 before it is timed. ``$OUT``, when set, receives ``gpu_exl3_tc.md``.
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
#: (n tiles, k tiles a step, warps, programs per SM, paired codebook PTX) of the sweep
LAUNCHES = ((8, 4, 4, 16, True), (8, 4, 4, 16, False), (8, 2, 2, 16, True), (8, 2, 2, 16, False),
            (16, 2, 4, 16, True), (8, 2, 4, 16, True))
WIDTHS = ((2, "3inst"), (4, "3inst"), (2, "mul1"), (2, "mcg"))


def checks(args, gen: torch.Generator) -> int:
    from qlinear.kernels.triton import exl3_tc
    from qlinear.layouts import exl3

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    failed = 0
    say("| bits codebook | worst relative error over M = 3, 40 x two launches (<= 1e-5) | decode bit-exact (rows of "
        "the identity give the weight's rows), paired PTX / plain |")
    say("|---|---|---|")
    eye = torch.eye(1024, device=DEV, dtype=torch.float16)
    for bits, cb in itertools.product(range(1, 9), exl3.CODEBOOKS):
        tr = torch.randint(-(1 << 15), 1 << 15, (64, 48, 16 * bits), device=DEV, dtype=torch.int16, generator=gen)
        inner16 = exl3.inner_weight(tr.cpu(), bits, exl3.codebook_table(cb)).to(DEV)
        inner = inner16.double()
        worst = 0.0
        for m, launch in itertools.product(args.check_ms, ({"split": 4}, {"warps": 2, "tiles_n": 4, "tiles_k": 4})):
            xh = torch.randn(m, 1024, device=DEV, generator=gen).half()
            worst = max(worst, rel(exl3_tc.tc_product(xh, tr, bits, cb, sms, **launch), xh.double() @ inner))
        exact = [all(torch.equal(exl3_tc.tc_product(eye[k0:k0 + 32], tr, bits, cb, sms, pairs=p).half()
                                 .view(torch.int16), inner16[k0:k0 + 32].view(torch.int16))
                     for k0 in range(0, 1024, 32)) for p in args.check_pairs]
        failed += (not worst <= 1e-5) + exact.count(False)
        say(f"| {bits} {cb} | {worst:.2e} | {' / '.join(map(str, exact))} |")
    say()
    return failed


def timing(args, gen: torch.Generator) -> int:
    from qlinear.kernels.triton import exl3_gemv, exl3_mv, exl3_tc

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count

    def others(m: int, bits: int, cb: str) -> dict:
        return {"shipped route": lambda v, t: exl3_mv.inner_product(v, t, bits, cb, sms),
                "GEMV": (lambda v, t: exl3_gemv.gemv_product(v, t, bits, cb, sms)) if m <= exl3_gemv.MAX_ROWS else None,
                "fused (Triton)": lambda v, t: exl3_mv.fused_product(v, t, bits, cb, sms)}

    def launched(launch: tuple, bits: int, cb: str):
        nt_, kt_, w, per, pairs = launch
        return lambda v, t: exl3_tc.tc_product(v, t, bits, cb, sms, tiles_n=nt_, tiles_k=kt_, warps=w, per_sm=per,
                                               pairs=pairs)

    def shipped(m: int) -> tuple:
        return (*(exl3_tc.LAUNCH_FEW if exl3_tc.tc_rows(m) <= 8 else exl3_tc.LAUNCH), exl3_tc.PROGRAMS_PER_SM,
                exl3_tc.PAIRS)

    return sweep(args, gen, "tc (n tiles, k tiles, warps, per SM, pairs)", others, LAUNCHES, launched, shipped)


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, SHAPES, (1, 4, 8, 16, 32), reps=20)
    p.add_argument("--check-ms", default="3,40", help="rows of the float64 checks (none: empty)")
    p.add_argument("--check-pairs", default="1,0", help="codebook forms of the bit-exact check: 1 paired PTX, 0 plain")
    p.add_argument("--widths", default=",".join(f"{b}:{c}" for b, c in WIDTHS), help="bits:codebook, comma separated")
    args = parse_args(p, argv)
    args.widths = [(int(w.split(":")[0]), w.split(":")[1]) for w in args.widths.split(",")]
    args.check_ms = [int(v) for v in args.check_ms.split(",") if v]
    args.check_pairs = [v == "1" for v in args.check_pairs.split(",") if v]
    gen = torch.Generator(device=DEV).manual_seed(3)
    return checks_then_timing("gpu_exl3_tc", "EXL3 into mma fragments (Gluon) against the GEMV and fused kernel",
                              argv, args, lambda: checks(args, gen), lambda a: timing(a, gen))


if __name__ == "__main__":
    sys.exit(main())
