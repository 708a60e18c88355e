"""GGUF linear layers side by side: qlinear's Torch and Triton kernels, ggml's CPU matmul, dense baselines.

    python benchmarks/gguf_linear.py --cpu                 # one thread: GGUFTorchLinear (fp32 exact, bf16 int4pack
                                                           # route), ggml's own matmul, dense bf16
    python benchmarks/gguf_linear.py --gpu --check --sweep # H200: Triton vs bf16 cuBLAS vs GGUFTorchLinear,
                                                           # every Triton variant checked, a GEMV config sweep

Weights are random GGML blocks with small finite scales (timing does not depend on the values; encoding
58M values with the K-quant search would take a minute). GPU: weights rotated over enough copies to
exceed 4x L2 (60 MB), one CUDA graph calling each copy once, replayed; median per call. CPU: median of
``--reps`` calls on one thread. Shapes are ``in x out``. ``--check`` exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from qlinear.kernels.gguf_torch import GGUFTorchLinear
from qlinear.kernels.gguf_triton import RUNNABLE, GGUFTritonKernel
from qlinear.layouts import gguf as G

QTYPES = ("Q4_0", "Q4_K", "Q8_0")
SHAPES = ((4096, 4096), (4096, 14336))
#: byte offsets of each type's float16 scale fields (d, dmin / m) within a block
SCALE_AT = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
            "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,),
            "Q1_0": (0,), "Q1_0_G128": (0,)}
L2_BYTES = 60 << 20


def random_blocks(qtype: str, n: int, k: int, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    """uint8 ``[N, row bytes]`` of random blocks whose float16 scales are small and finite."""
    info = G.type_info(qtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    raw = torch.randint(0, 256, (n, info.row_bytes(k)), dtype=torch.uint8, device=device, generator=gen)
    blocks = raw.view(n, -1, info.type_size)
    for at in SCALE_AT[G.ggml_type(qtype).name]:
        d = (torch.rand((n, blocks.shape[1]), device=device, generator=gen) * 0.01 + 1e-3).half()
        blocks[:, :, at:at + 2] = d.unsqueeze(-1).view(torch.uint8)
    return raw


def layer(cls: type, qtype: str, k: int, n: int, raw: torch.Tensor, dtype: torch.dtype,
          **options: object) -> torch.nn.Module:
    """A prepared layer of ``cls`` on ``raw``'s device (``options``: constructor keywords, as ``affine_runtime``)."""
    lay = cls(G.scheme_for(qtype, k, n), dtype=dtype, **options).to(raw.device)
    lay.load_blocks(raw, share=True)
    lay.prepare()
    return lay


def cpu_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def cpu_table(shapes: tuple, qtypes: tuple, ms: tuple, reps: int) -> str:
    """One thread. ``exact``: GGUFTorchLinear with float32 activations (Q8_0/Q4_0/Q4_1 up to ``native_blocks.MAX_M``:
    the native extra's kernel on the stored blocks; else decode + float32 GEMM); ``bf16``: the same
    layer with bfloat16 activations, which routes to the native extra's kernels where installed, else small M
    to the int4pack op (``gguf_int4pack``); ``op`` and ``decode``: the op (native extra switched off) and the
    decode route timed on their own at every M (where the crossover ``MAX_M`` comes from)."""
    import importlib.util

    from qlinear.kernels import gguf_int4pack, native_blocks, native_int4

    def op_only(rt: gguf_int4pack.GGUFInt4Pack, xb: torch.Tensor, n: int) -> torch.Tensor:
        saved, native_int4._MODULE = native_int4._MODULE, False
        try:
            return gguf_int4pack.matmul(rt, xb, n)
        finally:
            native_int4._MODULE = saved

    def decode_only(lay: GGUFTorchLinear, x: torch.Tensor) -> torch.Tensor:
        saved, native_blocks._MODULE = native_blocks._MODULE, False
        try:
            return lay(x)
        finally:
            native_blocks._MODULE = saved

    from qlinear.kernels.gguf_ggml import GGML_IDS, ggml_matmul

    torch.set_num_threads(1)
    have_ggml = importlib.util.find_spec("ggml") is not None
    rows = ["| shape | qtype | M | exact fp32 ms (route) | bf16 ms (route) | op ms | native ms (kernel) | decode ms "
            "| ggml ms | dense bf16 ms | bf16 / ggml | ggml / bf16 | fp32 / ggml |", "| --- " * 13 + "|"]
    for k, n in shapes:
        dense = torch.randn(n, k, dtype=torch.bfloat16)
        for qt in qtypes:
            raw = random_blocks(qt, n, k)
            exact = layer(GGUFTorchLinear, qt, k, n, raw, torch.float32)
            fast = layer(GGUFTorchLinear, qt, k, n, raw, torch.bfloat16)
            rt = gguf_int4pack.build(raw, qt, k, n) if gguf_int4pack.supported(qt) else None
            for m in ms:
                x = torch.randn(m, k)
                xb = x.to(torch.bfloat16)
                t_exact = cpu_ms(lambda: exact(x), reps)  # noqa: B023
                t_fast = cpu_ms(lambda: fast(xb), reps)  # noqa: B023
                kernel = rt.native_kernel(m) if rt else None
                route = ("native blocks" if fast.uses_native_blocks(xb) else "decode" if not fast.uses_int4pack(xb)
                         else f"native {kernel.value}" if kernel else "op")
                t_op = cpu_ms(lambda: op_only(rt, xb, n), reps) if rt and rt.op else float("nan")  # noqa: B023
                t_nat, k_nat = float("nan"), "-"  # the extra's kernel for this M, whether or not the route takes it
                kn = native_int4.kernel_for(m, rt.group, rt.block, rt.planes * rt.k_pad) if rt else None
                if kn is not None:
                    xk = torch.cat([xb, xb], 1) if rt.planes == 2 else xb
                    xk = torch.nn.functional.pad(xk, (0, rt.planes * rt.k_pad - xk.shape[1]))
                    t_nat = cpu_ms(lambda: native_int4.matmul(xk, rt.packed, rt.scales_zeros, rt.group, kn), reps)  # noqa: B023
                    k_nat = kn.value
                stored = exact.uses_native_blocks(x)
                # the decode route computes in float32 either way
                t_dec = (t_fast if route == "decode" else t_exact if not stored else
                         cpu_ms(lambda: decode_only(exact, x), reps))  # noqa: B023
                t_dense = cpu_ms(lambda: torch.nn.functional.linear(xb, dense), reps)  # noqa: B023
                t_ggml = float("nan")
                if have_ggml:
                    t_ggml = cpu_ms(lambda: ggml_matmul(raw, GGML_IDS[G.ggml_type(qt)], x, 1), reps)  # noqa: B023
                rows.append(f"| {k}x{n} | {qt} | {m} | {t_exact:.2f} ({'native blocks' if stored else 'decode'}) | "
                            f"{t_fast:.2f} ({route}) | {t_op:.2f} | {t_nat:.2f} ({k_nat}) | "
                            f"{t_dec:.2f} | {t_ggml:.2f} | {t_dense:.2f} | {t_fast / t_ggml:.2f}x | "
                            f"{t_ggml / t_fast:.2f}x | {t_exact / t_ggml:.2f}x |")
    return "\n".join(rows)


def gpu_us(fns: list[Callable[[], object]], reps: int = 20, graph: bool = True) -> float:
    """Median microseconds per call of one graph (or, if capture fails, one pass) calling every fn once."""
    for f in fns[:2]:
        f()
    torch.cuda.synchronize()
    g = None
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for f in fns:
                    f()
        except RuntimeError:
            g = None
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        if g is not None:
            g.replay()
        else:
            for f in fns:
                f()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / len(fns))
    return statistics.median(times)


def copies(nbytes: int) -> int:
    return max(2, -(-4 * L2_BYTES // max(1, nbytes)) + 1)


def affine_layers(qt: str, k: int, n: int, raw: torch.Tensor) -> list[torch.nn.Module]:
    """GGUFTritonKernel copies with ``affine_runtime`` (the GPTQ kernels on the blocks' affine form)."""
    out = []
    for _ in range(copies(raw.numel() * 4 // 3)):  # the runtime layout is ~6 bits per weight
        lay = GGUFTritonKernel(G.scheme_for(qt, k, n), dtype=torch.bfloat16, affine_runtime=True).to(raw.device)
        lay.load_blocks(raw.clone(), share=True)
        lay.prepare()
        out.append(lay)
    return out


def gpu_table(shapes: tuple, qtypes: tuple, ms: tuple) -> str:
    from qlinear.kernels.gguf_runtime import AFFINE

    rows = ["| shape | qtype | M | bf16 cuBLAS us | Triton us | variant | affine us (rel err) | GGUFTorchLinear us "
            "| Triton vs cuBLAS | affine vs cuBLAS | vs GGUFTorch | Triton GB/s |", "| --- " * 12 + "|"]
    for k, n in shapes:
        dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies(2 * n * k))]
        for qt in qtypes:
            raw = random_blocks(qt, n, k, "cuda")
            lays = [layer(GGUFTritonKernel, qt, k, n, raw.clone(), torch.bfloat16, affine_runtime=False)
                    for _ in range(copies(raw.numel()))]
            ref = layer(GGUFTorchLinear, qt, k, n, raw, torch.bfloat16)
            aff = affine_layers(qt, k, n, raw) if G.ggml_type(qt) in AFFINE else []
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                t_d = gpu_us([lambda w=w: torch.nn.functional.linear(x, w) for w in dense])  # noqa: B023
                t_t = gpu_us([lambda lay=lay: lay(x) for lay in lays])  # noqa: B023
                t_r = gpu_us([lambda r=ref: r(x)], reps=5)  # noqa: B023
                cell, ratio = "-", "-"
                if aff:
                    want = ref(x).float()
                    err = float((aff[0](x).float() - want).norm() / want.norm())
                    t_a = gpu_us([lambda lay=lay: lay(x) for lay in aff])  # noqa: B023
                    cell, ratio = f"{t_a:.1f} ({err:.1e}{'' if err < 1e-2 else ' FAIL'})", f"{t_d / t_a:.2f}x"
                variant = lays[0].config(m, x.device).variant
                gbs = raw.numel() / t_t / 1e3
                rows.append(f"| {k}x{n} | {qt} | {m} | {t_d:.1f} | {t_t:.1f} | {variant} | {cell} | {t_r:.1f} | "
                            f"{t_d / t_t:.2f}x | {ratio} | {t_r / t_t:.1f}x | {gbs:.0f} |")
            del lays, ref, aff
    return "\n".join(rows)


def sweep(k: int = 4096, n: int = 14336, qtypes: tuple[str, ...] = ("Q4_K", "Q4_0")) -> str:
    """GEMV configs at M=1 (block_n, warps, split, tile arrangement): the fastest first, per type."""
    from qlinear.kernels.triton.gguf_configs import GConfig

    out = []
    for qt in qtypes:
        raw = random_blocks(qt, n, k, "cuda")
        lays = [layer(GGUFTritonKernel, qt, k, n, raw.clone(), torch.bfloat16, affine_runtime=False)
                for _ in range(copies(raw.numel()))]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        auto = lays[0].config(1, x.device)
        rows = []
        for bn, warps in ((64, 4), (128, 8), (128, 4)):
            for jt in (0, 1):
                for split in sorted({max(1, auto.split_k // 2), auto.split_k, auto.split_k * 2}):
                    cfg = GConfig("gemv", 1, bn, 0, split, warps, 1, jt)
                    try:
                        t = gpu_us([lambda lay=lay: lay.matmul(x, config=cfg) for lay in lays])  # noqa: B023
                    except Exception as err:  # a config the compiler refuses is reported, not fatal
                        why = type(err).__name__
                        rows.append((float("inf"), f"| {qt} | {bn} | {warps} | {jt} | {split} | {why} |"))
                        continue
                    rows.append((t, f"| {qt} | {bn} | {warps} | {jt} | {split} | {t:.1f} us, "
                                    f"{raw.numel() / t / 1e3:.0f} GB/s |"))
        out += [f"GEMV sweep {qt} {k}x{n} M=1, auto: {auto}", "| qtype | block_n | warps | jt | split | time |",
                "| --- | --- | --- | --- | --- | --- |"] + [r for _, r in sorted(rows)] + [""]
        del lays
    return "\n".join(out)


def check(device: str = "cuda") -> tuple[str, bool]:
    """Every Triton variant of every type on ``device`` vs the CPU torch decoders: bit-exact dequant,
    matmul within the activation dtype's tolerance (float16 2e-3, bfloat16 1e-2)."""
    from qlinear.kernels.triton import gguf_mm
    from qlinear.kernels.triton.gguf_configs import GConfig

    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
    cfgs = {"gemv": (GConfig("gemv", 1, 64, 0, 3, 4, 1), 3), "skinny": (GConfig("skinny", 16, 64, 0, 2, 4, 2), 9),
            "gemm": (GConfig("gemm", 64, 128, 0, 1, 8, 2), 100), "dense": (GConfig("dense", 1, 32, 0), 300)}
    rows = ["| qtype | dequant bit-exact | gemv | skinny | gemm | dense |", "| --- | --- | --- | --- | --- | --- |"]
    ok = True
    k, n = 1000, 300  # partial blocks and steps, partial tiles
    for qt in sorted(RUNNABLE):
        raw = random_blocks(qt.name, n, k, seed=int(qt))
        w = G.dequantize(raw, qt, k)
        got = gguf_mm.dequantize(raw.to(device), int(qt), k).cpu()
        exact = bool(torch.equal(got.view(torch.int32), w.view(torch.int32)))
        cells = [f"{'yes' if exact else 'NO'}"]
        ok &= exact
        lay = layer(GGUFTritonKernel, qt.name, k, n, raw.to(device), torch.float16, affine_runtime=False)
        for i, (cfg, m) in enumerate(cfgs.values()):
            dtype = (torch.bfloat16, torch.float16)[i % 2]
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
            ref = x.double() @ w.double().t()
            y = lay.matmul(x.to(device), config=cfg).double().cpu()
            err = float((y - ref).norm() / ref.norm())
            good = err < tol[dtype]
            ok &= good
            cells.append(f"{err:.1e} {str(dtype)[6:]}{'' if good else ' FAIL'}")
        rows.append(f"| {qt.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows), ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--qtypes", default=",".join(QTYPES))
    ap.add_argument("--ms", default=None)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    shapes = tuple(tuple(int(v) for v in s.split("x")) for s in a.shapes.split(","))
    qtypes = tuple(a.qtypes.split(","))
    print("command: python benchmarks/gguf_linear.py " + " ".join(sys.argv[1:] if argv is None else argv))
    ok, t0 = True, time.time()
    if (a.check or a.gpu or a.sweep) and not torch.cuda.is_available():
        print("--check, --gpu and --sweep need a CUDA device")
        return 2
    if a.check:
        table, ok = check()
        print(f"\n## Triton GGUF variants vs CPU decoders ({time.time() - t0:.0f} s)\n\n{table}\n", flush=True)
    if a.gpu:
        ms = tuple(int(v) for v in (a.ms or "1,4,16,64,256").split(","))
        print(f"## GPU ({torch.cuda.get_device_name()})\n\n{gpu_table(shapes, qtypes, ms)}\n", flush=True)
    if a.sweep:
        print(sweep() + "\n", flush=True)
    if a.cpu:
        ms = tuple(int(v) for v in (a.ms or "1,4,16").split(","))
        print(f"## CPU, one thread\n\n{cpu_table(shapes, qtypes, ms, a.reps)}\n", flush=True)
    print(f"total {time.time() - t0:.0f} s; {'all checks passed' if ok else 'CHECK FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
