"""Side-by-side CPU timing of qlinear's CPU kernels against dense matmul, on one thread.

Contenders, in one run on the same inputs: dense float32 and bfloat16 ``x @ w.T`` (the weight kept dense,
which no kernel may do), TorchLinear, every CPU kernel (GPTQ and AWQ, 4-bit g128 symmetric; TorchInt8Linear
on the 8-bit quantization of the same weight) and the kernel AUTO picks for a GPTQ bfloat16 layer.
Prints a Markdown table per shape: median milliseconds and speed-up vs dense bf16 / fp32 (>1 = faster),
then the issue's targets. ``--crossover`` instead times each path per M: the int4pack / int8pack ops, decode +
bf16 GEMM, and the four kernels of the native extra (the data behind ``cpu_int4.INT4PACK_MAX_M``,
``native_int4.MV_MAX_M``, ``native_int4.CODES_MAX_M``, the no-AMX bounds and ``cpu_int8.INT8PACK_MAX_M``).

    python benchmarks/cpu_linear.py                 # full run: 3 shapes x M in 1, 4, 16, 64, 256
    python benchmarks/cpu_linear.py --quick         # one shape, few repetitions (smoke test)
    python benchmarks/cpu_linear.py --crossover     # op vs decode, M in 1..256, 4096x4096 and 4096x14336
    python benchmarks/cpu_linear.py --no-amx --kernels AUTO   # as on an AVX512-BF16 CPU without AMX (issue 25)
    python benchmarks/cpu_linear.py --no-amx --no-vbmi --kernels AUTO   # ... and without VBMI (Cooper Lake)

``--no-amx`` emulates such a CPU (Zen 4 class) on one with AMX: oneDNN is limited to
AVX512-BF16 (``ONEDNN_MAX_CPU_ISA``, which oneDNN reads once, so it is set here before torch is imported;
run as a script) and qlinear's native int4 routing told that AMX is absent (``native_int4.set_amx_allowed``).
``--no-vbmi`` adds what a Cooper Lake lacks besides AMX: VBMI (``native_int4.set_vbmi_allowed``), so AUTO routes
and runs as there: no ``int4_mv``, the int4pack op at small M, ``int4_mm_dp`` with its VBMI-free decode above. It
emulates the routing, the instructions and oneDNN's instruction set, not that CPU's speed: the times are this
CPU's.
"""

from __future__ import annotations

import os
import sys

#: oneDNN's instruction-set cap for ``--no-amx``: AVX512 with BF16 dot products, no AMX tiles.
NO_AMX_ISA = "AVX512_CORE_BF16"
if __name__ == "__main__" and "--no-amx" in sys.argv[1:]:
    os.environ["ONEDNN_MAX_CPU_ISA"] = NO_AMX_ISA  # before torch (below) loads oneDNN

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

from qlinear import QuantLinear, create_layer, quantize_rtn  # noqa: E402
from qlinear.kernels import cpu_int4, cpu_int8, native_int4  # noqa: E402
from qlinear.layouts.int4pack import OP_GROUP_SIZES  # noqa: E402

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))  # (in_features K, out_features N)
MS = (1, 4, 16, 64, 256)
CROSS_MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: (label, backend, checkpoint format, bits)
KERNELS = (
    ("TorchLinear", "gptq_torch", "gptq_v2", 4),
    ("TorchAtenLinear", "gptq_torch_aten", "gptq_v2", 4),
    ("TorchFusedLinear", "gptq_torch_fused", "gptq_v2", 4),
    ("TorchCpuAvx512Linear", "gptq_torch_cpu_avx512", "gptq_v2", 4),
    ("TorchAtenAwqLinear", "awq_torch_aten", "gemm", 4),
    ("TorchFusedAwqLinear", "awq_torch_fused", "gemm", 4),
    ("TorchCpuAvx512AwqLinear", "awq_torch_cpu_avx512", "gemm", 4),
    ("TorchInt8Linear (8-bit)", "gptq_torch_int8", "gptq_v2", 8),
    ("AUTO", "auto", "gptq_v2", 4),
)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def median_ms(fn: Callable[[], object], reps: int, budget_s: float, least: int = 3) -> float:
    """Median of up to ``reps`` timed calls (at least ``least``, stopping early once ``budget_s`` is spent)."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < reps and (len(times) < least or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def build(k: int, n: int, seed: int = 0, only: tuple[str, ...] = ()) -> dict[str, Callable[[torch.Tensor],
                                                                                          torch.Tensor]]:
    """Every contender for a ``[n, k]`` weight, as ``name -> fn(x_bf16)``; with ``only``, the dense ones and
    the kernels whose label starts with one of those names."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    q = {4: quantize_rtn(w, bits=4, group_size=128), 8: quantize_rtn(w, bits=8, group_size=128)}
    w32, w16 = w.contiguous(), w.to(torch.bfloat16).contiguous()
    out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "dense fp32": lambda x: x.float() @ w32.t(),
        "dense bf16": lambda x: x @ w16.t(),
    }
    for label, backend, fmt, bits in KERNELS:
        if only and not label.startswith(only):
            continue
        layer = create_layer(q[bits], format=fmt, backend=backend, dtype=torch.bfloat16)
        if backend == "auto":
            label = f"AUTO = {type(layer).__name__}"
        out[label] = layer
    return out


@torch.no_grad()
def read_bandwidth_gbs(mib: int = 256) -> float:
    """One thread's streaming read bandwidth (median ``sum`` over a buffer far larger than the caches)."""
    a = torch.ones(mib << 18, dtype=torch.float32)
    return (mib / 1024) / (median_ms(a.sum, 7, 5.0) / 1e3)


def bytes_bound(k: int, n: int, gbs: float, bf16_ms: float, fp32_ms: float) -> str:
    """The most a 4-bit GEMV can gain at M=1 from bytes alone: its weight streamed at the best bandwidth seen
    (``gbs`` or what the dense GEMVs achieved), against the dense times measured."""
    dense, four = 2 * k * n, k * n // 2 + 2 * 2 * (k // 128) * n  # bf16 weight; 4-bit codes + scales/zeros
    best = max(gbs, dense / bf16_ms / 1e6, 2 * dense / fp32_ms / 1e6)
    floor = four / best / 1e6
    return (f"bytes bound: 4-bit g128 reads {four / 2**20:.0f} MiB, >= {floor:.2f} ms at the best one-thread "
            f"bandwidth seen ({best:.1f} GB/s), so at most {bf16_ms / floor:.1f}x dense bf16 and "
            f"{fp32_ms / floor:.1f}x dense fp32 as measured")


def run_table(shapes: tuple[tuple[int, int], ...], ms: tuple[int, ...], reps: int, budget_s: float,
              only: tuple[str, ...] = ()) -> str:
    lines: list[str] = []
    notes: list[str] = []
    gbs = read_bandwidth_gbs()
    for k, n in shapes:
        fns = build(k, n, only=only)
        times = {name: {} for name in fns}
        for m in ms:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
            for name, fn in fns.items():
                times[name][m] = median_ms(lambda fn=fn, x=x: fn(x), reps, budget_s)
        lines += ["", f"### K={k} (in) x N={n} (out), bfloat16 activations", "",
                  "| contender | " + " | ".join(f"M={m}: ms, x bf16, x fp32" for m in ms) + " |",
                  "|---|" + "---|" * len(ms)]
        for name in fns:
            cells = [f"{times[name][m]:.3g} ms, {times['dense bf16'][m] / times[name][m]:.2f}x, "
                     f"{times['dense fp32'][m] / times[name][m]:.2f}x" for m in ms]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        four_bit = [nm for nm in fns if not nm.startswith(("dense", "TorchInt8", "AUTO"))]
        auto = next((nm for nm in fns if nm.startswith("AUTO")), None)
        if 1 in ms and four_bit:
            best = min(four_bit, key=lambda nm: times[nm][1])
            notes.append(f"- {k}x{n} M=1: best 4-bit {best}: {times['dense bf16'][1] / times[best][1]:.2f}x dense "
                         f"bf16 (target >= 5), {times['dense fp32'][1] / times[best][1]:.2f}x dense fp32 "
                         f"(target >= 10); {bytes_bound(k, n, gbs, times['dense bf16'][1], times['dense fp32'][1])}")
        if auto is None:
            continue
        worst = min(ms, key=lambda m: times["dense bf16"][m] / times[auto][m])
        ratio = times["dense bf16"][worst] / times[auto][worst]
        notes.append(f"- {k}x{n} {auto}: worst M={worst} at {ratio:.2f}x dense bf16 "
                     f"({'meets' if ratio >= 1 / 1.1 else 'misses'} 'never >10% slower')")
    return "\n".join([*lines, "", "Targets:", *notes])


def path_layers(k: int, n: int, group: int = 128) -> tuple[QuantLinear, QuantLinear]:
    """A 4-bit TorchAtenLinear and an 8-bit TorchInt8Linear of one random ``[n, k]`` weight."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1)) * 0.02
    backend = "gptq_torch_aten" if group in OP_GROUP_SIZES else "gptq_torch_cpu_avx512"  # g16: no op group
    return (create_layer(quantize_rtn(w, bits=4, group_size=group), backend=backend,
                               dtype=torch.bfloat16),
            create_layer(quantize_rtn(w, bits=8, group_size=group), backend="gptq_torch_int8",
                               dtype=torch.bfloat16))


def time_paths(layers: tuple[QuantLinear, QuantLinear], m: int, reps: int, budget_s: float) -> list[float]:
    """ms of (int4pack op, 4-bit decode + GEMM, native int4_mv (M <= 8), int4_mm_codes, int4_mm_weights,
    int4_mm_dp, int8pack op, 8-bit decode + GEMM) for ``m`` rows; nan where a native kernel is not available."""
    int4, int8 = layers
    x = torch.randn(m, int4.in_features, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    out = []
    int4.ensure_prepared()
    for path in (cpu_int4.Path.OP, cpu_int4.Path.DECODE):
        int4.path = lambda m, grad, path=path: path
        ok = path is not cpu_int4.Path.OP or int4._rt.op  # the op takes no group of 16
        out.append(median_ms(lambda: int4(x), reps, budget_s) if ok else float("nan"))
    int4.path = lambda m, grad: cpu_int4.Path.NATIVE
    saved = native_int4.kernel_for
    mod = native_int4.native_int4()
    try:
        group = int4._rt.group
        for kernel, ok in ((native_int4.Kernel.MV, m <= 8 and mod and mod.mv_available() and group % 16 == 0),
                           (native_int4.Kernel.CODES, mod and native_int4.amx_available(mod) and group % 32 == 0),
                           (native_int4.Kernel.WEIGHTS, mod and native_int4.amx_available(mod)),
                           (native_int4.Kernel.DP, mod and mod.mv_available())):
            native_int4.kernel_for = lambda *a, kernel=kernel: kernel
            out.append(median_ms(lambda: int4(x), reps, budget_s) if ok else float("nan"))
    finally:
        native_int4.kernel_for = saved
    del int4.path
    saved = cpu_int8.INT8PACK_MAX_M
    try:
        for limit in (1 << 30, 0):
            cpu_int8.INT8PACK_MAX_M = limit
            out.append(median_ms(lambda: int8(x), reps, budget_s))
    finally:
        cpu_int8.INT8PACK_MAX_M = saved
    return out


def nanmin(values: list[float]) -> float:
    """The smallest value that is not nan (inf when all are)."""
    return min((v for v in values if v == v), default=float("inf"))


def last_win(ms: tuple[int, ...], wins: list[bool]) -> int:
    """Largest M up to which the op won at every M (0: never)."""
    last = 0
    for m, won in zip(ms, wins, strict=True):
        if not won:
            break
        last = m
    return last


@torch.no_grad()
def run_crossover(shapes: tuple[tuple[int, int], ...], ms: tuple[int, ...], reps: int, budget_s: float,
                  group: int = 128) -> str:
    lines = ["| K x N | M | int4pack op ms | 4-bit decode + bf16 GEMM ms | native mv ms | native AMX codes ms | "
             "native AMX weights ms | native dp (no AMX) ms | int8pack op ms | 8-bit decode + bf16 GEMM ms |",
             "|" + "---|" * 10]
    found4, found8, mv, codes, lost, dp_vs_decode = {}, {}, {}, {}, {}, {}
    for k, n in shapes:
        layers = path_layers(k, n, group)
        rows = [time_paths(layers, m, reps, budget_s) for m in ms]
        lines += [f"| {k}x{n} | {m} | " + " | ".join(f"{t:.3g}" for t in r) + " |" for m, r in zip(ms, rows)]
        found4[(k, n)] = last_win(ms, [r[0] <= r[1] for r in rows])
        mv[(k, n)] = last_win(ms, [r[2] <= nanmin(r[3:6]) for r in rows])
        codes[(k, n)] = last_win(ms, [r[3] <= r[4] for r in rows])
        mv_vs_weights = last_win(ms, [r[2] <= r[4] for r in rows])
        dp_vs_decode[(k, n)] = last_win(ms, [not r[5] > r[1] for r in rows])  # nan (no dp) counts as a win
        lines.append(f"| {k}x{n} | mv beat int4_mm_weights up to M={mv_vs_weights} | | | | | | | | |")
        lost[(k, n)] = [m for m, r in zip(ms, rows) if nanmin(r[2:6]) > min(r[:2])]
        found8[(k, n)] = last_win(ms, [r[6] <= r[7] for r in rows])
    native = cpu_int4.native_decoder() is not None
    table = cpu_int4.INT4PACK_MAX_M_NATIVE if native else cpu_int4.INT4PACK_MAX_M
    lines += ["", f"INT4PACK_MAX_M{'_NATIVE' if native else ''} = {found4} (in use: {table})",
              f"native_int4.MV_MAX_M: mv won up to {mv} (in use: {native_int4.MV_MAX_M})",
              f"native_int4.CODES_MAX_M: codes won up to {codes} (in use: {native_int4.CODES_MAX_M})",
              f"native_int4.DP_MAX_M: dp beat decode + GEMM up to {dp_vs_decode} (in use: {native_int4.DP_MAX_M})",
              f"M where the best native kernel lost to the op or decode path: {lost}",
              f"INT8PACK_MAX_M = {found8} (in use: {cpu_int8.INT8PACK_MAX_M})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one shape (4096x4096 unless --shapes), few repetitions")
    ap.add_argument("--crossover", action="store_true", help="int4pack op vs decode + bf16 GEMM per M")
    ap.add_argument("--shapes", help="KxN[,KxN...] (in x out)")
    ap.add_argument("--group", type=int, default=128, help="group size of the --crossover layers (default 128)")
    ap.add_argument("--ms", help="M values, comma separated")
    ap.add_argument("--reps", type=int, help="most timed calls per cell (default 50, --quick 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: timings are per core)")
    ap.add_argument("--kernels", help="table: only the kernels whose labels start with these (comma separated, "
                    "e.g. AUTO,TorchAtenLinear); the dense contenders always run")
    ap.add_argument("--no-amx", action="store_true", help="as on an AVX512-BF16 CPU without AMX: oneDNN capped at "
                    f"{NO_AMX_ISA} and qlinear's native int4 kernels routed without AMX (run as a script)")
    ap.add_argument("--no-vbmi", action="store_true", help="with --no-amx: as on one without VBMI either (Cooper "
                    "Lake): no int4_mv, int4_mm_dp decoding without VPERMI2B")
    args = ap.parse_args(argv)
    if args.no_vbmi and not args.no_amx:
        raise SystemExit("--no-vbmi: expected --no-amx too (every CPU with AMX has VBMI)")
    if args.no_amx and os.environ.get("ONEDNN_MAX_CPU_ISA") != NO_AMX_ISA:
        raise SystemExit(f"--no-amx: expected ONEDNN_MAX_CPU_ISA={NO_AMX_ISA} set before torch loads oneDNN (run "
                         f"benchmarks/cpu_linear.py as a script); found {os.environ.get('ONEDNN_MAX_CPU_ISA')!r}")
    torch.set_num_threads(args.threads)
    shapes = (tuple(tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")) if args.shapes
              else SHAPES[:1] if args.quick else SHAPES[:2] if args.crossover else SHAPES)
    ms = tuple(int(v) for v in args.ms.split(",")) if args.ms else CROSS_MS if args.crossover else MS
    reps = args.reps or (5 if args.quick else 50)
    budget = 0.2 if args.quick else 3.0
    head = [f"command: python benchmarks/cpu_linear.py {' '.join(argv if argv is not None else sys.argv[1:])}",
            f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; CPU: {cpu_name()}; "
            f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); threads: {args.threads}; "
            f"median of up to {reps} calls; AMX: " + (f"off (--no-amx: oneDNN {NO_AMX_ISA}, native routing without "
                                                       "AMX)" if args.no_amx else "as the CPU has it")
            + ("; VBMI: off (--no-vbmi: no int4_mv, int4_mm_dp's VBMI-free decode)" if args.no_vbmi else "")]
    only = tuple(args.kernels.split(",")) if args.kernels else ()
    native_int4.set_amx_allowed(not args.no_amx)
    native_int4.set_vbmi_allowed(not args.no_vbmi)
    try:
        body = (run_crossover(shapes, ms, reps, budget, args.group) if args.crossover
                else run_table(shapes, ms, reps, budget, only))
    finally:
        native_int4.set_amx_allowed(True)
        native_int4.set_vbmi_allowed(True)
    text = "\n".join(head) + "\n" + body
    print(text)
    return text


if __name__ == "__main__":
    main()
