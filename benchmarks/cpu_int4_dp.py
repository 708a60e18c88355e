"""The native extra's ``int4_mm_dp`` (AVX512-BF16 without AMX) by chunk and M, one thread, and where its time goes.

Each chunk (output channels x K rows decoded at once) is timed at every M; a least-squares line through
``ms = decode + M * per_row`` per chunk splits the time into the once-per-call decode of the weight and the
dot products of each row (the data behind ``native_int4.DP_CHUNK``).

    python benchmarks/cpu_int4_dp.py --shapes 4096x14336 --chunks 64x256,64x2048,256x256 --ms 2,16,256
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable

import torch

from qlinear.kernels import native_int4


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def fit(ms: list[int], times: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (M, ms)."""
    mx, my = statistics.fmean(ms), statistics.fmean(times)
    var = sum((m - mx) ** 2 for m in ms)
    slope = sum((m - mx) * (t - my) for m, t in zip(ms, times, strict=True)) / var if var else 0.0
    return my - slope * mx, slope


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x14336", help="KxN[,KxN...] (in x out)")
    ap.add_argument("--chunks", default="64x256,64x2048,256x256", help="NGxKC[,...]: channels x K rows")
    ap.add_argument("--ms", default="2,16,256", help="M values, comma separated")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    mod = native_int4.native_int4()
    if mod is None or not mod.mv_available():
        raise SystemExit("cpu_int4_dp: needs the native extra on an AVX512-BF16 + VBMI CPU (pip install ./native)")
    ms = [int(v) for v in args.ms.split(",")]
    chunks = [tuple(int(v) for v in c.split("x")) for c in args.chunks.split(",")]
    lines = [f"command: python benchmarks/cpu_int4_dp.py {' '.join(argv if argv is not None else sys.argv[1:])}",
             f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}; "
             f"one thread; median of {args.reps} calls; group {args.group}", "",
             "| K x N | chunk | " + " | ".join(f"M={m} ms" for m in ms) + " | decode ms | per row ms |",
             "|---|---|" + "---|" * (len(ms) + 2)]
    g = torch.Generator().manual_seed(0)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        sz = (torch.rand(k // args.group, n, 2, generator=g) * 0.02).to(torch.bfloat16)
        for ng, kc in chunks:
            times: list[float] = []
            for m in ms:
                x = torch.randn(m, k, generator=g).to(torch.bfloat16)
                out = torch.empty(m, n, dtype=torch.bfloat16)
                call = (x.data_ptr(), packed.data_ptr(), sz.data_ptr(), out.data_ptr(), m, k, n, args.group, k, n, 1,
                        ng, kc)
                times.append(median_ms(lambda call=call: mod.int4_mm_dp(*call), args.reps))
            decode, per_row = fit(ms, times)
            lines.append(f"| {k}x{n} | {ng}x{kc} | " + " | ".join(f"{t:.3g}" for t in times)
                         + f" | {decode:.3g} | {per_row:.3g} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
