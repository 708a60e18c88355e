"""The timing table ``gpu_exl3_tc.py`` and ``gpu_exl3_wg.py`` share: per shape x EXL3 width, per M, bf16 ``F.linear``,
a few reference routes, and one kernel over launches, each launch checked against float64 before it is timed."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from gpu_report import bf16_baseline, say

Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (xh, trellis) -> float32 product


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).norm() / ref.norm())


def sweep(args, gen: torch.Generator, kernel: str, others: Callable[[int, int, str], dict[str, Product | None]],
          launches: list[tuple], launched: Callable[[tuple, int, str], Product],
          shipped: Callable[[int], tuple]) -> int:
    """Time, for every shape of ``args.shapes``, width of ``args.widths`` and M of ``args.ms``: bf16, the routes
    ``others(m, bits, codebook)`` names (None: not run at this M), and ``launched(launch, bits, codebook)`` for each
    of ``launches``; report the best launch and the one ``shipped(m)`` names. Returns the failed checks."""
    from gpu_linear import DEV, copies, timed
    from qlinear.layouts import exl3

    failed = 0
    for (k, n), (bits, cb) in itertools.product(args.shapes, args.widths):
        trs = [torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), device=DEV, dtype=torch.int16,
                             generator=gen) for _ in range(copies(k * n * bits // 8))]
        inner64 = exl3.inner_weight(trs[0].cpu(), bits, exl3.codebook_table(cb)).double().to(DEV)
        wb = bf16_baseline(k, n, gen)
        names = list(others(1, bits, cb))
        say(f"## {k}x{n}, {bits}-bit {cb}: us per call (/ bf16)")
        say()
        say(f"| M | bf16 | {' | '.join(names)} | best {kernel} launch | {kernel} at the shipped launch |")
        say("|---" * (len(names) + 4) + "|")
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            xh = x.half()
            ref = xh.double() @ inner64
            tb = timed(wb, x, args.reps)
            cells = [None if f is None else timed([lambda v, t=t, f=f: f(v, t) for t in trs], xh, args.reps)
                     for f in others(m, bits, cb).values()]
            times = {}
            for launch in launches:
                f = launched(launch, bits, cb)
                err = rel(f(xh, trs[0]), ref)
                if not err <= 1e-5:
                    say(f"<!-- WRONG {k}x{n} {bits} {cb} M={m} {launch}: {err:.2e} -->")
                    failed += 1
                    continue
                times[launch] = timed([lambda v, t=t, f=f: f(v, t) for t in trs], xh, args.reps)
            best = min(times, key=times.get) if times else None
            at = times.get(shipped(m))
            say(f"| {m} | {tb:.1f} | " + " | ".join("-" if c is None else f"{c:.1f} ({c / tb:.2f})" for c in cells)
                + (f" | {best} {times[best]:.1f} ({times[best] / tb:.2f}) | " if best else " | - | ")
                + (f"{at:.1f}" if at else "-") + " |")
            say("<!-- " + ", ".join(f"{key}: {t:.1f}" for key, t in times.items()) + " -->")
        say()
        del trs, wb
        torch.cuda.empty_cache()
    return failed
