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
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DEV = torch.device("cuda")
LINES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def main() -> None:
    from gpu_linear import copies, timed
    from gpu_report import bf16_baseline
    from qlinear.kernels.triton import exl3_gemv, exl3_mv
    from qlinear.layouts import exl3

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x14336,14336x4096")
    p.add_argument("--bits", default="2,4")
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    bits_list = [int(b) for b in a.bits.split(",")]
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    variants = list(itertools.product((8, 16, 32), (False, True), (4, 8)))
    say(f"# EXL3 M = 1 parts on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    say()
    say("command: python benchmarks/gpu_exl3_parts.py " + " ".join(sys.argv[1:]))
    say()
    gen = torch.Generator(device=DEV).manual_seed(0)
    had = exl3.hadamard(DEV)
    for k, n in shapes:
        wb = bf16_baseline(k, n, gen)
        x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        tb = timed(wb, x, a.reps)
        su, sv = torch.randn(k, device=DEV, generator=gen), torch.randn(n, device=DEV, generator=gen)
        t_in = timed([lambda v, su=su: exl3_mv.input_transform(v, su, had)], x, a.reps)
        y32 = torch.randn(1, n, device=DEV, generator=gen)
        t_out = timed([lambda v, y=y32, s=sv: exl3_mv.output_transform(y, s, None, had, torch.bfloat16)], x,
                      a.reps)
        say(f"## {k}x{n}: bf16 F.linear {tb:.1f} us; input transform {t_in:.1f} us; output transform "
            f"{t_out:.1f} us")
        say()
        say("| bits | tiles_n | prefetch | warps | us | / bf16 | rel diff vs block kernel |")
        say("|---|---|---|---|---|---|---|")
        for bits in bits_list:
            trs = [torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), device=DEV, dtype=torch.int16,
                                 generator=gen) for _ in range(copies(k * n * bits // 8))]
            xh = exl3_mv.input_transform(x, su, had)
            want = exl3_mv.fused_product(xh, trs[0], bits, "3inst", sms).double()
            tblock = timed([lambda v, t=t, b=bits: exl3_mv.fused_product(v, t, b, "3inst", sms) for t in trs], xh,
                           a.reps)
            say(f"| {bits} | block kernel (tl.dot) | - | 4 | {tblock:.1f} | {tblock / tb:.2f} | - |")
            for tiles_n, pre, warps in variants:
                def f(v, t, b=bits, tiles_n=tiles_n, pre=pre, warps=warps):
                    return exl3_gemv.gemv_product(v, t, b, "3inst", sms, tiles_n=tiles_n, warps=warps, prefetch=pre)
                got = f(xh, trs[0]).double()
                rel = float((got - want).norm() / want.norm())
                tv = timed([lambda v, t=t: f(v, t) for t in trs], xh, a.reps)
                say(f"| {bits} | {tiles_n} | {pre} | {warps} | {tv:.1f} | {tv / tb:.2f} | {rel:.1e} |")
            del trs
        say()
        del wb
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_exl3_parts.md").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
