"""Side-by-side CPU timing of qlinear's native LUT4 kernels (``qlinear.kernels.native_lut4``, bitsandbytes NF4)
against dense bfloat16 ``F.linear`` and bitsandbytes' own CPU path, one thread, in one process.

Per shape and M, on the same bfloat16 activations, interleaved call by call (each contender's weight is evicted
by the others' between its calls, as in a model's forward) and timed over many rounds (median):

* dense bf16 ``F.linear(x, w)`` (the weight kept dense);
* ``native_lut4.linear`` (what qlinear runs: ``lut4_mv`` / ``lut4_mm`` by M, None above ``MM_MAX_M``, where the
  caller falls back); the raw kernels ``lut4_mv`` and ``lut4_mm`` are timed too, to show where the policy's
  bounds come from (``lut4_mv`` only up to M=64: it pays per row);
* bitsandbytes ``matmul_4bit`` with the ``QuantState`` of ``quantize_4bit(w, blocksize=64, quant_type="nf4")``
  (bitsandbytes' CPU path), when bitsandbytes is installed. Our kernels read the same packed bytes, absmax and
  table; the largest difference of our output from bitsandbytes' (which rounds the weight to bfloat16) is printed.

Prints Markdown: ms per contender and M, the time ratios ours / dense bf16 and ours / bitsandbytes (< 1: ours
faster) and the targets (M=1: at least 3x faster than dense bf16 and faster than bitsandbytes; at every M not
more than 10% slower than dense bf16, or ``linear`` returns None there).

    python benchmarks/cpu_bnb.py                                  # 4096x14336, 14336x4096; M 1, 4, 16, 64, 256
    python benchmarks/cpu_bnb.py --quick                          # 1024x1024, few rounds (smoke test)
    python benchmarks/cpu_bnb.py --ms 1,2,3,4,6,8,16,32,64,128 --write benchmarks/results/x.md
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_linear import cpu_name
from qlinear.kernels import native_lut4

SHAPES = ((4096, 14336), (14336, 4096))  # (in_features K, out_features N)
MS = (1, 4, 16, 64, 256)
BLOCK = 64
RAW_MV_MAX_M = 64
BF16 = torch.bfloat16


def bnb_state(w: torch.Tensor) -> tuple[Callable | None, torch.Tensor, object]:
    """bitsandbytes' matmul, packed weight and QuantState for ``w`` (NF4, blocksize 64, absmax kept float32), or
    (None, codes, (absmax, table)) quantized here when bitsandbytes is missing."""
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as bf
    except ImportError:
        return None, *quantize_here(w)
    q, qs = bf.quantize_4bit(w, blocksize=BLOCK, quant_type="nf4", compress_statistics=False,
                             quant_storage=torch.uint8)
    return bnb.matmul_4bit, q, qs


def quantize_here(w: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """NF4 codes (nearest table entry of w / absmax, high nibble first) without bitsandbytes: timing only."""
    n, k = w.shape
    table = torch.tensor([-1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
                          0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0])
    blocks = w.float().reshape(n, k // BLOCK, BLOCK)
    absmax = blocks.abs().amax(-1).clamp_min(1e-12)
    c = ((blocks / absmax[..., None])[..., None] - table).abs().argmin(-1).reshape(n, k).to(torch.uint8)
    return (c[:, 0::2] << 4 | c[:, 1::2]).contiguous(), (absmax.contiguous(), table)


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, budget_s: float) -> dict[str, float]:
    """Median ms per contender, the contenders called in turn each round (at least 5 rounds, then until
    ``rounds`` or ``budget_s``)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    start = time.perf_counter()
    done = 0
    while done < rounds and (done < 5 or time.perf_counter() - start < budget_s):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
        done += 1
    return {name: statistics.median(v) * 1e3 for name, v in times.items()}


@torch.no_grad()
def run_shape(k: int, n: int, ms: tuple[int, ...], rounds: int, budget_s: float,
              dtype: torch.dtype = BF16) -> tuple[list[str], list[str]]:
    mod = native_lut4.module()
    w = (torch.randn(n, k, generator=torch.Generator().manual_seed(1)) * 0.02).to(BF16)
    wd = w.to(dtype)
    dname = "bfloat16" if dtype == BF16 else "float32"
    dense_label = f"dense {'bf16' if dtype == BF16 else 'fp32'} F.linear"
    matmul_4bit, q, qs = bnb_state(w)
    if matmul_4bit is not None:
        codes, absmax, table = q.view(n, k // 2), qs.absmax.view(n, k // BLOCK), qs.code.float()
    else:
        codes, (absmax, table) = q, qs
    times: dict[str, dict[int, float]] = {}
    diffs: list[str] = []
    for m in ms:
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        fns: dict[str, Callable[[], object]] = {dense_label: lambda x=x: F.linear(x, wd)}
        if native_lut4.linear(x, codes, absmax, table, BLOCK) is not None:
            fns["qlinear native_lut4.linear"] = lambda x=x: native_lut4.linear(x, codes, absmax, table, BLOCK)
        out = torch.empty(m, n, dtype=dtype)
        args = (x.data_ptr(), codes.data_ptr(), absmax.data_ptr(), table.data_ptr(), out.data_ptr(), m, k, n, BLOCK,
                k, n, dname, torch.get_num_threads())
        if m <= RAW_MV_MAX_M:
            fns["raw lut4_mv"] = lambda args=args: mod.lut4_mv(*args)
        if mod.amx_available() and dtype == BF16:
            fns["raw lut4_mm"] = lambda args=args: mod.lut4_mm(*args)
        if matmul_4bit is not None:
            fns["bitsandbytes matmul_4bit"] = lambda x=x: matmul_4bit(x, q.t(), quant_state=qs)
            ours = native_lut4.linear(x, codes, absmax, table, BLOCK)
            if ours is not None:
                theirs = matmul_4bit(x, q.t(), quant_state=qs).float()
                diffs.append(f"M={m}: max |ours - bnb| / max |bnb| = "
                             f"{(ours.float() - theirs).abs().max().item() / theirs.abs().max().item():.2e}")
        for label, ms_ in interleaved(fns, rounds, budget_s).items():
            times.setdefault(label, {})[m] = ms_
    dense, ours = times[dense_label], times.get("qlinear native_lut4.linear", {})
    bnb = times.get("bitsandbytes matmul_4bit", {})
    lines = ["", f"### K={k} (in) x N={n} (out), NF4 blocksize {BLOCK}, {dname} activations, "
             f"{torch.get_num_threads()} thread(s)", "", "| contender | " + " | ".join(f"M={m} ms" for m in ms) + " |",
             "|---|" + "---|" * len(ms)]
    for label, row in times.items():
        lines.append(f"| {label} | " + " | ".join(f"{row[m]:.3g}" if m in row else "-" for m in ms) + " |")
    lines.append(f"| ours / {dense_label.split(' F.')[0]} (time) | " + " | ".join(
        f"{ours[m] / dense[m]:.2f}" if m in ours else "falls back" for m in ms) + " |")
    if bnb:
        lines.append("| ours / bitsandbytes (time) | " + " | ".join(
            f"{ours[m] / bnb[m]:.2f}" if m in ours else "falls back" for m in ms) + " |")
    notes = [f"- {k}x{n}: " + ", ".join(diffs)] if diffs else []
    for m in ms:
        if m not in ours:
            raw = times.get("raw lut4_mm", times.get("raw lut4_mv", {}))
            notes.append(f"- {k}x{n} M={m}: linear returns None (the caller falls back)" + (
                f"; the raw kernel {raw[m]:.3g} ms vs dense {dense[m]:.3g}" if m in raw else ""))
            continue
        ratio = ours[m] / dense[m]
        if m == 1:
            met = dense[1] >= 3 * ours[1] and (not bnb or bnb[1] > ours[1])
            vs_bnb = f", {bnb[1] / ours[1]:.1f}x faster than bitsandbytes" if bnb else ""
            notes.append(f"- {k}x{n} M=1: {dense[1] / ours[1]:.2f}x faster than {dense_label}{vs_bnb} (target: "
                         f">= 3x and faster than bitsandbytes: {'met' if met else 'missed'})")
        notes.append(f"- {k}x{n} M={m}: ours / dense {ratio:.2f} (target <= 1.10: "
                     f"{'met' if ratio <= 1.1 else 'missed'})")
    return lines, notes


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1024x1024 unless --shapes, few rounds")
    ap.add_argument("--shapes", help="KxN[,KxN...] (in x out; K a multiple of 64)")
    ap.add_argument("--ms", help="M values, comma separated")
    ap.add_argument("--rounds", type=int, help="most timed rounds per M (default 15, --quick 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch and kernel threads (default 1)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="activation dtype")
    ap.add_argument("--write", help="also write the Markdown to this file")
    args = ap.parse_args(argv)
    if native_lut4.module() is None or not native_lut4.module().available():
        raise SystemExit(f"needs qlinear_native._lut4 on an AVX-512 CPU: {native_lut4.INSTALL}")
    torch.set_num_threads(args.threads)
    shapes = (tuple(tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")) if args.shapes
              else ((1024, 1024),) if args.quick else SHAPES)
    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else MS
    rounds = args.rounds or (5 if args.quick else 15)
    budget = 0.5 if args.quick else 20.0
    try:
        import bitsandbytes
        bnb_version = bitsandbytes.__version__
    except ImportError:
        bnb_version = "not installed (pip install bitsandbytes==0.50.2)"
    head = [f"command: python benchmarks/cpu_bnb.py {' '.join(argv if argv is not None else sys.argv[1:])}",
            f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; CPU: {cpu_name()}; "
            f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); bitsandbytes {bnb_version}; "
            f"threads: {args.threads}; median of up to {rounds} interleaved rounds; AMX: "
            f"{native_lut4.module().amx_available()}"]
    lines: list[str] = []
    notes: list[str] = []
    for k, n in shapes:
        more, more_notes = run_shape(k, n, ms, rounds, budget, getattr(torch, args.dtype))
        lines += more
        notes += more_notes
    text = "\n".join([*head, *lines, "", "Notes:", *notes])
    print(text)
    if args.write:
        Path(args.write).write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
