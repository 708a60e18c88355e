"""Side-by-side CPU timing of the native FP8 / FP4 weight kernels (``qlinear_native._float``) against dense
bfloat16 ``F.linear``, on one thread, in one process on the same activations.

Contenders per shape and M: dense bfloat16 ``F.linear(x, w)`` (the weight kept dense), FP8 e4m3fn with one
scale per channel (bk = K) and with 128-wide blocks, NVFP4 and MXFP4, each through ``*_mv`` (AVX-512) and
``*_mm`` (AMX tiles). Weights are random codes (no NaN) with realistic scales; the kernels' time does not depend
on the values. Prints a Markdown table per shape (median ms and speed-up vs dense bf16, >1 = faster), the
faster kernel per format and M, the largest M at which ``*_mv`` beats ``*_mm``, a streaming-read bound (the
weight's bytes summed by one thread) and the targets (M=1: FP8 >= 1.8x, NVFP4/MXFP4 >= 3x dense bf16).

    python benchmarks/cpu_float.py                      # 4096x14336, M in 1, 2, 4, 8, 16, 64
    python benchmarks/cpu_float.py --quick              # 1024x1024, few repetitions (smoke test)
    python benchmarks/cpu_float.py --shapes 4096x4096,14336x4096 --ms 1,3,32 --reps 15
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_linear
from cpu_linear import cpu_name

SHAPES = ((4096, 14336),)  # (in_features K, out_features N)
MS = (1, 2, 4, 8, 16, 64)
BF16 = torch.bfloat16


def native() -> object | None:
    try:
        from qlinear_native import _float
    except ImportError:
        return None
    return _float if _float.available() else None


def median_ms(fn: Callable[[], object], reps: int, budget_s: float) -> float:
    """Median of up to ``reps`` timed calls (at least 7, stopping early once ``budget_s`` is spent)."""
    return cpu_linear.median_ms(fn, reps, budget_s, least=7)


def weights(k: int, n: int, seed: int = 0) -> dict[str, tuple]:
    """Per format: (kind, weight bytes, scales, bk or g, format name)."""
    g = torch.Generator().manual_seed(seed)
    w8 = torch.randint(0, 256, (n, k), dtype=torch.uint8, generator=g)
    w8[(w8 & 0x7F) == 0x7F] ^= 0x40  # e4m3fn NaN codes -> finite ones
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    return {
        "FP8 e4m3 per-channel": ("fp8", w8, torch.rand(n, 1, generator=g) * 0.01 + 1e-3, k, "e4m3fn"),
        "FP8 e4m3 block 128": ("fp8", w8, torch.rand(n, -(-k // 128), generator=g) * 0.01 + 1e-3, 128, "e4m3fn"),
        "NVFP4": ("fp4", packed, torch.randint(0x20, 0x48, (n, k // 16), dtype=torch.uint8, generator=g), 0.01,
                  "nvfp4"),
        "MXFP4": ("fp4", packed, torch.randint(118, 128, (n, k // 32), dtype=torch.uint8, generator=g), 1.0, "mxfp4"),
    }


def caller(mod: object, kernel: str, spec: tuple, x: torch.Tensor, out: torch.Tensor, threads: int) -> Callable:
    kind, w, s, arg, fmt = spec
    m, k = x.shape
    n = out.shape[1]
    fn = getattr(mod, f"{kind}_{kernel}")
    args = (x.data_ptr(), w.data_ptr(), s.data_ptr(), out.data_ptr(), m, k, n, arg, k, n, fmt, "bfloat16", threads)
    return lambda: fn(*args)


@torch.no_grad()
def read_ms(t: torch.Tensor, reps: int, budget_s: float) -> float:
    """One thread summing the tensor's bytes (viewed as int64): a streaming-read time for those bytes."""
    flat = t.reshape(-1)
    flat = flat[: flat.numel() // 8 * 8].view(torch.int64)
    return median_ms(flat.sum, reps, budget_s)


def last_win(ms: tuple[int, ...], wins: list[bool]) -> int:
    """Largest M up to which the first contender won at every M (0: never)."""
    last = 0
    for m, won in zip(ms, wins):
        if not won:
            break
        last = m
    return last


@torch.no_grad()
def run_table(mod: object, shapes: tuple[tuple[int, int], ...], ms: tuple[int, ...], reps: int, budget_s: float,
              threads: int) -> str:
    amx = mod.amx_available()
    kernels = ("mv", "mm") if amx else ("mv",)
    lines: list[str] = []
    notes: list[str] = []
    for k, n in shapes:
        dense = torch.randn(n, k, generator=torch.Generator().manual_seed(1)).mul(0.02).to(BF16)
        specs = weights(k, n)
        times: dict[str, dict[int, float]] = {"dense bf16 F.linear": {}}
        for m in ms:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(BF16)
            out = torch.empty(m, n, dtype=BF16)
            times["dense bf16 F.linear"][m] = median_ms(lambda x=x, w=dense: F.linear(x, w), reps, budget_s)
            for name, spec in specs.items():
                for kern in kernels:
                    label = f"{name} {spec[0]}_{kern}"
                    times.setdefault(label, {})[m] = median_ms(caller(mod, kern, spec, x, out, threads), reps,
                                                               budget_s)
        base = times["dense bf16 F.linear"]
        lines += ["", f"### K={k} (in) x N={n} (out), bfloat16 activations and output, {threads} thread(s)", "",
                  "| contender | " + " | ".join(f"M={m}: ms, x bf16" for m in ms) + " |",
                  "|---|" + "---|" * len(ms)]
        for label, row in times.items():
            lines.append(f"| {label} | " + " | ".join(f"{row[m]:.3g}, {base[m] / row[m]:.2f}x" for m in ms) + " |")
        lines.append("| **best native per format** | " + " | ".join(
            "<br>".join(f"{name}: {base[m] / min(times[f'{name} {spec[0]}_{kk}'][m] for kk in kernels):.2f}x"
                        for name, spec in specs.items()) for m in ms) + " |")
        for name, spec in specs.items():
            if amx:
                mv, mm = times[f"{name} {spec[0]}_mv"], times[f"{name} {spec[0]}_mm"]
                notes.append(f"- {k}x{n} {name}: {spec[0]}_mv beat {spec[0]}_mm up to "
                             f"M={last_win(ms, [mv[m] <= mm[m] for m in ms])}")
        if 1 in ms:
            fp8_bytes, fp4_bytes = specs["FP8 e4m3 per-channel"][1], specs["NVFP4"][1]
            r8, r4 = read_ms(fp8_bytes, reps, budget_s), read_ms(fp4_bytes, reps, budget_s)
            for name, spec in specs.items():
                best = min(times[f"{name} {spec[0]}_{kk}"][1] for kk in kernels)
                target = 1.8 if spec[0] == "fp8" else 3.0
                ratio = base[1] / best
                notes.append(f"- {k}x{n} M=1 {name}: {best:.3g} ms, {ratio:.2f}x dense bf16 (target >= {target}: "
                             f"{'met' if ratio >= target else 'missed'})")
            notes.append(f"- {k}x{n} streaming read by one thread (torch int64 sum of the bytes): FP8 codes "
                         f"{fp8_bytes.numel() / 2**20:.0f} MiB {r8:.3g} ms, FP4 codes {fp4_bytes.numel() / 2**20:.0f} "
                         f"MiB {r4:.3g} ms; dense bf16 weight {2 * k * n / 2**20:.0f} MiB in {base[1]:.3g} ms at M=1")
    return "\n".join([*lines, "", "Notes:", *notes])


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1024x1024 unless --shapes, few repetitions")
    ap.add_argument("--shapes", help="KxN[,KxN...] (in x out; K a multiple of 32)")
    ap.add_argument("--ms", help="M values, comma separated")
    ap.add_argument("--reps", type=int, help="most timed calls per cell (default 15, --quick 7)")
    ap.add_argument("--threads", type=int, default=1, help="torch and kernel threads (default 1: per core)")
    args = ap.parse_args(argv)
    mod = native()
    if mod is None:
        raise SystemExit("needs qlinear_native._float on an AVX-512 VBMI CPU: pip install ./native")
    torch.set_num_threads(args.threads)
    shapes = (tuple(tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")) if args.shapes
              else ((1024, 1024),) if args.quick else SHAPES)
    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else MS
    reps = args.reps or (7 if args.quick else 15)
    budget = 0.2 if args.quick else 3.0
    head = [f"command: python benchmarks/cpu_float.py {' '.join(argv if argv is not None else sys.argv[1:])}",
            f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; CPU: {cpu_name()}; "
            f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); threads: {args.threads}; "
            f"median of up to {reps} calls (at least 7); AMX kernels: {mod.amx_available()}"]
    text = "\n".join(head) + "\n" + run_table(mod, shapes, ms, reps, budget, args.threads)
    print(text)
    return text


if __name__ == "__main__":
    main()
