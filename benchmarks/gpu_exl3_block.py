"""EXL3's block decode on the GPU (``exl3_mv._stream_block``): the fused decode + ``tl.dot`` kernel over blocks and
warps, and the decode pass + matmul of the large-M route, beside the shipped route, at M = 1..256.

    PYTHONPATH=src:benchmarks python benchmarks/gpu_exl3_block.py [--shapes 4096x14336,14336x4096] [--ms 1,4,16,64]

Checks first, on CUDA: the decode gives the Torch layout's float16 inner weight bit for bit, and every fused
launch timed equals the float64 product within 1e-5 (relative). Then us per call (median of CUDA graph replays over
weight copies exceeding L2) beside bf16 ``F.linear``: the shipped route (``exl3_mv.inner_product``), the fused
kernel over blocks (rows x k x n, warps), and the decode pass + float16 matmul. (Until 2026-12-08 it also timed the
per-element decode the stream decode replaced: ``results/h100-gpu_exl3_block-2026-12-07.md``.) ``$OUT``, when
set, receives ``gpu_exl3_block.md``.
"""

from __future__ import annotations

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
#: (k, n) blocks and warps of the stream kernel's sweep; rows follow M (16 up to 16 rows, then M up to 64)
BLOCKS = ((32, 128), (64, 64), (64, 128), (32, 64), (128, 64))
WARPS = (4, 8)
WIDTHS = ((2, "3inst"), (4, "3inst"), (2, "mul1"))


def checks(gen: torch.Generator) -> int:
    from qlinear.kernels.triton import exl3_mv
    from qlinear.layouts import exl3

    failed = 0
    say("| bits codebook | decode == Torch layout |")
    say("|---|---|")
    for bits, cb in itertools.product(range(1, 9), exl3.CODEBOOKS):
        tr = torch.randint(-(1 << 15), 1 << 15, (64, 48, 16 * bits), device=DEV, dtype=torch.int16, generator=gen)
        want = exl3.inner_weight(tr.cpu(), bits, exl3.codebook_table(cb)).view(torch.int16)
        ok = torch.equal(exl3_mv.decode_inner(tr, bits, cb).cpu().view(torch.int16), want)
        failed += not ok
        say(f"| {bits} {cb} | {ok} |")
    say()
    return failed


def timing(args, gen: torch.Generator) -> int:
    from gpu_linear import copies, timed
    from qlinear.kernels.triton import exl3_mv
    from qlinear.layouts import exl3

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    failed = 0
    for (k, n), (bits, cb) in itertools.product(args.shapes, WIDTHS):
        trs = [torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), device=DEV, dtype=torch.int16,
                             generator=gen) for _ in range(copies(k * n * bits // 8))]
        inner64 = exl3.inner_weight(trs[0].cpu(), bits, exl3.codebook_table(cb)).double().to(DEV)
        wb = bf16_baseline(k, n, gen)
        runs = {"shipped route": lambda v, t, b=bits, c=cb: exl3_mv.inner_product(v, t, b, c, sms),
                "decode + matmul": lambda v, t, b=bits, c=cb: v @ exl3_mv.decode_inner(t, b, c)}
        say(f"## {k}x{n}, {bits}-bit {cb}: us per call (/ bf16)")
        say()
        say("| M | bf16 | " + " | ".join(runs) + " | best fused (rows x k x n, warps) | its us (/ bf16) | "
            "fused at the shipped block |")
        say("|---" * (len(runs) + 5) + "|")
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            xh = x.half()
            ref = xh.double() @ inner64
            tb = timed(wb, x, args.reps)
            cells = [f"{timed([lambda v, t=t, f=f: f(v, t) for t in trs], xh, args.reps):.1f}" for f in runs.values()]
            fused = {}
            bm = exl3_mv.fused_rows(m)
            for (bk, bn), w in itertools.product(BLOCKS, WARPS):
                def f(v, t, blk=(bm, bk, bn), w=w, b=bits, c=cb):
                    return exl3_mv.fused_product(v, t, b, c, sms, block=blk, warps=w)
                got = f(xh, trs[0]).double()
                rel = float((got - ref).norm() / ref.norm())
                if not rel < 1e-5:
                    say(f"<!-- WRONG {k}x{n} {bits} {cb} M={m} {bm}x{bk}x{bn} w{w}: {rel:.2e} -->")
                    failed += 1
                    continue
                fused[(bm, bk, bn, w)] = timed([lambda v, t=t, f=f: f(v, t) for t in trs], xh, args.reps)
            best = min(fused, key=fused.get)
            shipped = (exl3_mv.fused_rows(m), exl3_mv.BLOCK_K, exl3_mv.BLOCK_N, 4)
            at_shipped = fused.get(shipped)
            say(f"| {m} | {tb:.1f} | " + " | ".join(f"{c} ({float(c) / tb:.2f})" for c in cells)
                + f" | {best[0]}x{best[1]}x{best[2]} w{best[3]} | {fused[best]:.1f} ({fused[best] / tb:.2f}) | "
                + (f"{at_shipped:.1f}" if at_shipped else "-") + " |")
            say("<!-- " + ", ".join(f"{a}x{b}x{c} w{d}: {t:.1f}" for (a, b, c, d), t in fused.items()) + " -->")
        say()
        del trs, wb
        torch.cuda.empty_cache()
    return failed


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, SHAPES, (1, 2, 4, 8, 16, 32, 64, 128, 256), reps=20)
    args = parse_args(p, argv)
    failed = []

    def body() -> None:
        gen = torch.Generator(device=DEV).manual_seed(3)
        failed.append(0 if args.no_check else checks(gen))
        failed[0] += timing(args, gen)
        say(f"{failed[0]} check(s) failed")

    run("gpu_exl3_block", "EXL3 block decode: the fused kernel over blocks, and decode + matmul", argv, args.out, body)
    return 1 if failed[0] else 0


if __name__ == "__main__":
    sys.exit(main())
