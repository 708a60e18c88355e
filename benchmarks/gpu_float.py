"""Float-weight Triton kernels on the GPU: numerics of every variant, then side-by-side timing against bf16
cuBLAS, torch._scaled_mm (cuBLAS FP8, rowwise scales) and, where vLLM's op library is carried, vLLM's FP8
Marlin and cutlass_scaled_mm.

    python3 benchmarks/gpu_float.py --out benchmarks/results/h200-gpu_float-<date>.md   # checks + table
    python3 benchmarks/gpu_float.py --quick                       # 2 shapes, 4 Ms, few checks
    python3 benchmarks/gpu_float.py --shapes 4096x14336 --ms 1,16 --no-check
    python3 benchmarks/gpu_float.py --sweep --shapes 8192x28672 --ms 1,16,256   # a few tile configs per variant
    python3 benchmarks/gpu_float.py --sweep --families w8a8 --variants mma --ms 256,4096  # one kernel
    TRITON_INTERPRET=1 python3 benchmarks/gpu_float.py --interpret   # the script itself on CPU, tiny shapes

Method (``gpu_linear.timed``/``copies``): each point is a CUDA graph calling the op once per weight copy, the
copies together over 4x L2 (HBM, not cache, is measured), replayed ``--reps`` times; the median per call.
Shapes are ``K x N`` (``y [M, N] = x [M, K] @ W^T``). FP8 weights are random e4m3 codes with per-channel
float32 scales (``--granularity block``: 128x128 blocks); bf16 multiplies the same weights decoded, and the
FP8 peers the same codes. W8A8 "mm" is the product of already-quantized activations (as ``_scaled_mm`` and
cutlass are timed); "e2e" adds our per-token quantization. Ratios are time ours / time peer (< 1: faster).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))
MS = (1, 4, 16, 64, 256, 1024, 4096)
QUICK_SHAPES = ((4096, 14336), (8192, 28672))
QUICK_MS = (1, 16, 256, 4096)
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
Fn = Callable[[torch.Tensor], torch.Tensor]
OUT: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    OUT.append(line)


# ---- inputs and float64 references (torch ops on the device, no qlinear decoding) -------------------------

def fp8_weight(n: int, k: int, fmt: torch.dtype, gen: torch.Generator, dev: torch.device) -> torch.Tensor:
    codes = torch.randint(0, 256, (n, k), dtype=torch.uint8, device=dev, generator=gen)
    if fmt == torch.float8_e4m3fn:
        codes[(codes & 0x7F) == 0x7F] = 0x7E  # no NaN codes
    else:
        codes[(codes & 0x7C) == 0x7C] &= 0xFB  # no inf/NaN: exponent 31 -> 30
    return codes.view(fmt)


def fp8_scales(n: int, k: int, block: tuple[int, int], gen: torch.Generator, dev: torch.device,
               fmt: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    mag = 2.0**-9 if fmt == torch.float8_e4m3fn else 2.0**-16
    shape = (-(-n // block[0]), -(-k // block[1]))
    return (torch.rand(shape, device=dev, generator=gen) + 0.5) * mag


def fp8_dense(w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    n, k = w.shape
    s = scale.double().repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    return w.double() * s


def fp4_weight(n: int, k: int, kind: str, gen: torch.Generator, dev: torch.device):
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev, generator=gen)
    if kind == "nvfp4":  # e4m3 codes 0x20..0x5F (2^-4 .. 15), a global 1/2^8
        codes = torch.randint(0x20, 0x60, (n, k // 16), dtype=torch.uint8, device=dev, generator=gen)
        return packed, codes.view(torch.float8_e4m3fn), 2.0**-8
    return packed, torch.randint(116, 124, (n, k // 32), dtype=torch.uint8, device=dev, generator=gen), 1.0


def fp4_dense(packed: torch.Tensor, scales: torch.Tensor, kind: str, gmul: float) -> torch.Tensor:
    table = torch.tensor(E2M1 + tuple(-v for v in E2M1), dtype=torch.float64, device=packed.device)
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(packed.shape[0], -1).long()
    if kind == "nvfp4":
        s = scales.double().repeat_interleave(16, 1)
    else:
        s = torch.exp2(scales.double() - 127).repeat_interleave(32, 1)
    return table[codes] * s * gmul


def bind(f: Callable[..., torch.Tensor], *args: object, **kw: object) -> Fn:
    """``x -> f(x, *args, **kw)``: one timed call on one weight copy."""
    return lambda x: f(x, *args, **kw)


def const(f: Callable[..., torch.Tensor], *args: object, **kw: object) -> Fn:
    """``_ -> f(*args, **kw)``: a call on fixed (already quantized) inputs."""
    return lambda _x: f(*args, **kw)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


# ---- peers ------------------------------------------------------------------------------------------------------

def scalar_type_id(exponent: int, mantissa: int, signed: bool, bias: int, finite: bool, nan_repr: int) -> int:
    """vLLM's ScalarType.id: exponent(8) mantissa(8) signed(1) bias(32) finite_values_only(1) nan_repr(8)."""
    val, off = 0, 0
    for member, width in ((exponent, 8), (mantissa, 8), (int(signed), 1), (bias, 32), (int(finite), 1),
                          (nan_repr, 8)):
        val |= (int(member) & ((1 << width) - 1)) << off
        off += width
    return val


assert scalar_type_id(0, 4, False, 8, False, 1) == 1125899907892224  # uint4b8, as gpu_peers.UINT4B8
FE4M3FN = scalar_type_id(4, 3, True, 0, True, 2)  # float8_e4m3fn: finite only, NaN = S.1111.111


def note_schema(op: object, seen: set[str] = set()) -> None:  # noqa: B006 (a deliberate once-per-run memo)
    """Record a vLLM op's schema in the report, once (what the columns were called with)."""
    text = str(op.default._schema)  # type: ignore[attr-defined]
    if text not in seen:
        seen.add(text)
        say(f"<!-- schema: {text} -->")


def marlin_scales(s: torch.Tensor, k: int, n: int, group: int, dtype: torch.dtype) -> torch.Tensor:
    """vLLM's marlin_permute_scales, then the FP8 exponent bias folded in (x 2^120 bf16, x 2^8 fp16)."""
    if group < k:
        perm = [i + 8 * j for i in range(8) for j in range(8)]
        s = s.reshape(-1, 64)[:, perm]
    else:
        perm = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
        s = s.reshape(-1, 32)[:, perm]
    s = s.reshape(-1, n).to(dtype).contiguous()
    return s * (2.0**120 if dtype == torch.bfloat16 else 2.0**8)


def marlin_fp8(w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype: torch.dtype) -> Fn:
    """vLLM 0.33 FP8 Marlin (weight-only): codes packed 4 along K into int32 ``[K/4, N]``, repacked; scales
    ``[K/G, N]`` (per-channel: one row) permuted; the op called through its runtime schema."""
    from gpu_peers import call_by_schema, load_vllm

    reason = load_vllm()
    if reason:
        raise RuntimeError(reason)
    n, k = w.shape
    q = w.view(torch.int32).t().contiguous()  # [K/4, N], byte j of word r = k 4r + j
    empty = torch.empty(0, dtype=torch.int32, device=w.device)
    b_q = call_by_schema(torch.ops._C.gptq_marlin_repack, b_q_weight=q, perm=empty, size_k=k, size_n=n, num_bits=8,
                         is_a_8bit=False)
    if block[1] >= k:
        s = scale[:, 0].repeat_interleave(block[0])[:n].view(1, n).float()
        group = -1
    else:
        s = scale.t().repeat_interleave(block[0], 1)[:, :n].float()  # [K/bk, N]
        group = block[1]
    s = marlin_scales(s, k, n, k if group == -1 else group, dtype)
    sms = torch.cuda.get_device_properties(w.device).multi_processor_count
    ws = torch.zeros(4 * sms, dtype=torch.int32, device=w.device)
    op = torch.ops._C.marlin_gemm
    type_id = {a.name: FE4M3FN for a in op.default._schema.arguments if "type" in a.name}  # b_q_type(_id)
    note_schema(op)

    def run(x: torch.Tensor) -> torch.Tensor:
        # vLLM 0.33's schema names the optional tensors c_or_none, b_bias_or_none, b_zeros_or_none (and has no
        # g_idx / perm / is_k_full); both spellings are given, call_by_schema takes the schema's
        return call_by_schema(op, a=x, c=None, c_or_none=None, b_q_weight=b_q, b_bias=None, b_bias_or_none=None,
                              b_scales=s, a_scales=None, global_scale=None, b_zeros=None, b_zeros_or_none=None,
                              g_idx=None, perm=None, workspace=ws, **type_id,
                              size_m=x.shape[0], size_n=n, size_k=k, is_k_full=True, use_atomic_add=False,
                              use_fp32_reduce=True, is_zp_float=False)

    return run


def cutlass_mm(w: torch.Tensor, ws_rows: torch.Tensor, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """vLLM's cutlass_scaled_mm(out, a, b [K, N] column-major, a_scales [M, 1], b_scales [N, 1], bias)."""
    from gpu_peers import call_by_schema, load_vllm

    reason = load_vllm()
    if reason:
        raise RuntimeError(reason)
    op = torch.ops._C.cutlass_scaled_mm
    note_schema(op)
    wt, sb = w.t(), ws_rows.reshape(-1, 1).contiguous()

    def run(xq: torch.Tensor, sx: torch.Tensor) -> torch.Tensor:
        out = torch.empty((xq.shape[0], w.shape[0]), dtype=dtype, device=xq.device)
        call_by_schema(op, out=out, a=xq, b=wt, a_scales=sx.reshape(-1, 1), b_scales=sb, bias=None)
        return out

    return run


def scaled_mm(w: torch.Tensor, ws_rows: torch.Tensor, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """torch._scaled_mm, rowwise: x per token ``[M, 1]``, w per channel ``[1, N]``, w^T column-major."""
    wt, sb = w.t(), ws_rows.reshape(1, -1).contiguous()
    return lambda xq, sx: torch._scaled_mm(xq, wt, scale_a=sx.reshape(-1, 1), scale_b=sb, out_dtype=dtype)


# ---- numerics ---------------------------------------------------------------------------------------------------

def check(name: str, fn: Fn, x: torch.Tensor, ref: torch.Tensor, tol: float, lock: torch.Tensor | None = None,
          results: list | None = None) -> bool:
    try:
        y1 = fn(x)
        y2 = fn(x)
        sync()
        err = rel(y1, ref)
        same = torch.equal(y1, y2)
        locked = lock is None or int(lock.abs().sum()) == 0
        ok = err < tol and same and locked and bool(torch.isfinite(y1).all())
        extra = ("" if same else " NONDETERMINISTIC") + ("" if locked else " LOCK-NOT-RESET")
        say(f"| {name} | {err:.2e} | {'pass' if ok else 'FAIL'}{extra} |")
    except Exception as err:  # a compile or launch failure is a failed check, the rest still runs
        ok = False
        say(f"| {name} | - | FAIL {type(err).__name__}: {str(err)[:160]} |")
    if results is not None:
        results.append(ok)
    return ok


def code_checks(dev: torch.device, lock: torch.Tensor, res: list[bool], quick: bool) -> None:
    """Every code of every format through every variant, bit for bit: one-hot activation rows pick single
    weights, so ``y`` must equal the code's value times a power-of-two scale (torch's own FP8 conversion and the
    E2M1 table are the oracle). Catches a decode that flushes subnormals or saturates, which a random
    layer's relative error would hide. Each (format, dtype, variant) is a compile, so the rarer pairs get
    fewer variants (``quick``: bfloat16 only)."""
    from qlinear.kernels.triton import fp4mm, fp8mm
    from qlinear.kernels.triton.fp_common import FConfig

    n, k = 256, 64
    ms = {"gemv": 4, "skinny": 16, "mma": 64, "dense": 64}
    for fmt in (torch.float8_e4m3fn, torch.float8_e5m2):
        codes = torch.arange(256, dtype=torch.uint8, device=dev)
        codes = codes[torch.isfinite(codes.view(fmt).float())]
        w = torch.zeros(n, k, dtype=torch.uint8, device=dev)
        w[:, :4] = codes.repeat(-(-4 * n // codes.numel()))[: 4 * n].reshape(n, 4)
        w = w.view(fmt)
        for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16):
            for v, m in ms.items():
                if fmt == torch.float8_e5m2 and v in ("skinny", "dense") and dtype == torch.float16:
                    continue
                x = torch.zeros(m, k, dtype=dtype, device=dev)
                x[torch.arange(m), torch.arange(m) % 4] = 1
                want = (w.view(torch.uint8)[:, torch.arange(m, device=dev) % 4].t().contiguous().view(fmt)
                        .double() * 0.125).to(dtype)
                bit_decode = v != "dense" and fmt == torch.float8_e4m3fn and dtype == torch.bfloat16
                for bits in (False, True) if bit_decode else (False,):
                    cfg = FConfig(**{**fp8mm.fp8_config(v, m, n, k).as_dict(), "fp8_bits": bits})
                    f = "e4m3" if fmt == torch.float8_e4m3fn else "e5m2"
                    name = f"every {f} code, {str(dtype)[6:]}, {cfg.short()}"
                    try:
                        y = fp8mm.fp8_linear(x, w, torch.full((1, 1), 0.125, device=dev), (n, k), config=cfg,
                                             lock=lock)
                        ok = torch.equal(y, want)
                        bad = int((y != want).sum())
                        say(f"| {name} | {bad} differ | {'pass' if ok else 'FAIL'} |")
                    except Exception as err:
                        ok = False
                        say(f"| {name} | - | FAIL {type(err).__name__}: {str(err)[:160]} |")
                    res.append(ok)
    table = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64,
                         device=dev)
    kf = 128
    packed = torch.zeros(n, kf // 2, dtype=torch.uint8, device=dev)
    packed[:, :1] = torch.arange(256, dtype=torch.uint8, device=dev).reshape(n, 1)  # every nibble pair
    for kind in ("nvfp4", "mxfp4"):
        if kind == "nvfp4":
            sc = torch.randint(1, 0x7F, (n, kf // 16), dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
            sv = sc.double()
        else:
            sc = torch.randint(112, 138, (n, kf // 32), dtype=torch.uint8, device=dev)
            sv = torch.exp2(sc.double() - 127)
        for dtype in (torch.bfloat16,) if quick or kind == "mxfp4" else (torch.bfloat16, torch.float16):
            for v, m in ms.items():
                x = torch.zeros(m, kf, dtype=dtype, device=dev)
                x[torch.arange(m), torch.arange(m) % 2] = 1
                col = torch.arange(m, device=dev) % 2
                code = ((packed[:, 0:1].long() >> (4 * col[None, :])) & 15)  # [N, M]
                want = (table[code] * sv[:, 0:1] * 0.5).t().to(dtype)
                cfg = fp4mm.fp4_config(v, m, n, kf)
                name = f"every e2m1 pair, {kind} scales, {str(dtype)[6:]}, {cfg.short()}"
                try:
                    y = fp4mm.fp4_linear(x, packed, sc, kind, 0.5, config=cfg, lock=lock)
                    ok = torch.equal(y, want)
                    say(f"| {name} | {int((y != want).sum())} differ | {'pass' if ok else 'FAIL'} |")
                except Exception as err:
                    ok = False
                    say(f"| {name} | - | FAIL {type(err).__name__}: {str(err)[:160]} |")
                res.append(ok)


def run_checks(args: argparse.Namespace, dev: torch.device) -> bool:
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm
    from qlinear.kernels.triton.fp_common import FConfig

    gen = torch.Generator(device=dev).manual_seed(1)
    lock = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
    res: list[bool] = []
    say("| check | rel err | result |\n| --- | --- | --- |")
    shapes = args.check_shapes
    first = {"gemv": (1, 3), "skinny": (5, 16), "mma": (100, 333), "dense": (1030,)}
    odd = {"gemv": (3,), "skinny": (5,), "mma": (100,), "dense": (1030,)}
    if args.interpret:
        first = odd = {"gemv": (1, 3), "skinny": (5,), "mma": (40,), "dense": (20,)}
    code_checks(dev, lock, res, args.quick)
    for k, n in shapes:
        ms = first if (k, n) == shapes[0] else odd
        for gran in ("channel", "block"):
            blk = (1, k) if gran == "channel" else (128, 128)
            for fmt, dtype in ((torch.float8_e4m3fn, torch.bfloat16), (torch.float8_e5m2, torch.float16)):
                if fmt == torch.float8_e5m2 and (gran == "block" or (k, n) != shapes[0]):
                    continue
                w = fp8_weight(n, k, fmt, gen, dev)
                s = fp8_scales(n, k, blk, gen, dev, fmt)
                wd = fp8_dense(w, s, blk)
                for v, mlist in ms.items():
                    for m in mlist:
                        x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
                        cfg = fp8mm.fp8_config(v, m, n, k, bk=blk[1])
                        f = "e4m3" if fmt == torch.float8_e4m3fn else "e5m2"
                        check(f"fp8 {f} {str(dtype)[6:]} {gran} {k}x{n} M={m} {cfg.short()}",
                              bind(fp8mm.fp8_linear, w, s, blk, config=cfg, lock=lock), x,
                              x.double() @ wd.t(), TOL[dtype], lock, res)
                if gran == "block" and (k, n) == shapes[0]:  # bit decode and TMA, once each
                    x = torch.randn(16, k, device=dev, generator=gen).to(dtype)
                    for cfg in (FConfig(**{**fp8mm.fp8_config("gemv", 1, n, k).as_dict(), "fp8_bits": True}),
                                FConfig(**{**fp8mm.fp8_config("mma", 16, n, k).as_dict(), "fp8_bits": True}),
                                FConfig(**{**fp8mm.fp8_config("skinny", 16, n, k).as_dict(), "tma": True}),
                                FConfig(**{**fp8mm.fp8_config("mma", 16, n, k).as_dict(), "tma": True})):
                        xm = x[:1] if cfg.variant == "gemv" else x
                        check(f"fp8 e4m3 bf16 block {k}x{n} M={xm.shape[0]} {cfg.short()}",
                              bind(fp8mm.fp8_linear, w, s, blk, config=cfg, lock=lock), xm,
                              xm.double() @ wd.t(), TOL[dtype], lock, res)
        # W8A8: the reference multiplies OUR quantized activations (checked bit-exactly below) in float64
        for gran in ("tensor", "channel", "block"):
            blk = {"tensor": (n, k), "channel": (1, k), "block": (128, 128)}[gran]
            if gran == "block" and k % 32:
                continue
            w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
            s = fp8_scales(n, k, blk, gen, dev)
            wd = fp8_dense(w, s, blk)
            wms = ((1, 16, 100, 1030) if (k, n) == shapes[0] else (5, 100)) if not args.interpret else (1, 5, 40)
            for m in wms:
                x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
                xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
                ref = (xq.double() * sx.double()[:, None]) @ wd.t()
                cfgs = [fp8_w8a8.w8a8_config(fp8_w8a8.choose_w8a8_variant(m, n, k), m, n, k, bk=blk[1])]
                if gran == "channel" and (k, n) == shapes[0] and k % 16 == 0:
                    cfgs.append(FConfig(**{**cfgs[0].as_dict(), "tma": True}))
                for cfg in cfgs:
                    check(f"w8a8 bf16 {gran} {k}x{n} M={m} {cfg.short()}",
                          bind(fp8_w8a8.fp8_w8a8_linear, w, s, blk, config=cfg, lock=lock), x, ref,
                          TOL[torch.bfloat16], lock, res)
        for kind in ("nvfp4", "mxfp4"):
            if k % 32:
                continue
            packed, sc, gmul = fp4_weight(n, k, kind, gen, dev)
            wd = fp4_dense(packed, sc, kind, gmul)
            for dtype in (torch.bfloat16, torch.float16):
                if dtype == torch.float16 and (kind == "mxfp4" or (k, n) != shapes[0]):
                    continue
                for v, mlist in ms.items():
                    for m in mlist:
                        x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
                        cfg = fp4mm.fp4_config(v, m, n, k)
                        check(f"{kind} {str(dtype)[6:]} {k}x{n} M={m} {cfg.short()}",
                              bind(fp4mm.fp4_linear, packed, sc, kind, gmul, config=cfg, lock=lock), x,
                              x.double() @ wd.t(), TOL[dtype], lock, res)
    # the per-token quantizer, bit for bit against torch (one-pass and two-pass rows; a zero row)
    for k in (4096, 14336) if not args.interpret else (200, 8200):
        x = torch.randn(7, k, device=dev, generator=gen).to(torch.bfloat16) * 3
        x[2] = 0
        xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
        s_ref = torch.clamp(x.float().abs().amax(1) / 448.0, min=1.0 / (448 * 512))
        q_ref = (x.float() / s_ref[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        ok = torch.equal(sx, s_ref) and torch.equal(xq.view(torch.uint8), q_ref.view(torch.uint8))
        res.append(ok)
        say(f"| quantize_fp8_per_token K={k} vs torch (bitwise) | - | {'pass' if ok else 'FAIL'} |")
    failed = res.count(False)
    say(f"\n{len(res)} checks, {failed} failed\n")
    return failed == 0


# ---- timing -------------------------------------------------------------------------------------------------------

def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timer(args: argparse.Namespace):
    if args.interpret:
        def cpu_timed(fns: list[Fn], x: torch.Tensor, reps: int) -> float:
            t0 = time.perf_counter()
            for f in fns[:1]:
                f(x)
            return (time.perf_counter() - t0) * 1e6

        return cpu_timed, lambda nbytes: 1
    from gpu_linear import copies, timed

    return timed, copies


def fp8_peer(make, name: str, ws: list[torch.Tensor], rows: torch.Tensor, xq: torch.Tensor, sx: torch.Tensor,
             dtype: torch.dtype, notes: list[str]) -> list[Fn] | str:
    """An FP8 x FP8 peer over every weight copy, called on our quantized activations; where it refuses M rows
    that are no multiple of 16, it gets them padded to one (noted in the row)."""
    runs: list[Callable[..., torch.Tensor]] = []
    try:
        runs = [make(wi, rows, dtype) for wi in ws]
        runs[0](xq, sx)
    except Exception as err:
        if not runs or xq.shape[0] % 16 == 0:
            say(f"<!-- {name} unavailable: {type(err).__name__}: {str(err)[:300]} -->")
            return str(err)
        pad = -xq.shape[0] % 16
        xq = torch.cat([xq, xq.new_zeros(pad, xq.shape[1])])
        sx = torch.cat([sx, sx.new_ones(pad)])
        try:
            runs[0](xq, sx)
        except Exception as err2:
            say(f"<!-- {name} unavailable: {type(err2).__name__}: {str(err2)[:300]} -->")
            return str(err2)
        notes.append(f"{name}: M padded to {xq.shape[0]}")
    return [lambda _, f=f, a=xq, b=sx: f(a, b) for f in runs]


def point(timed, fns: list[Fn] | str, x: torch.Tensor, reps: int) -> float | None:
    if isinstance(fns, str):
        return None
    try:
        return timed(fns, x, reps)
    except Exception as err:
        say(f"<!-- timing failed: {type(err).__name__}: {str(err)[:200]} -->")
        return None


def build(make: Callable[[], Fn], r: int, name: str) -> list[Fn] | str:
    try:
        return [make() for _ in range(r)]
    except Exception as err:  # a peer that is missing or refuses drops its column only
        reason = f"{type(err).__name__}: {err}"[:300]
        say(f"<!-- {name} unavailable: {reason} -->")
        return reason


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def main_table(args: argparse.Namespace, dev: torch.device) -> None:
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm

    timed, copies = timer(args)
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16
    cols = ("bf16", "_scaled_mm", "cutlass", "Marlin FP8", "fp8 W8A16", "W8A8 mm", "W8A8 e2e", "NVFP4", "MXFP4")
    say(f"FP8 scales: {args.granularity}; times in us, median of {args.reps} graph replays; ratios = time ours / "
        "time peer\n")
    say("| K x N | M | " + " | ".join(cols) + " | fp8/bf16 | fp8/Marlin | W8A8/_scaled_mm | NVFP4/bf16 | "
        "MXFP4/bf16 | fp8 variant | W8A8 variant | FP4 variant |")
    say("| --- " * (len(cols) + 10) + "|")
    for k, n in args.shapes:
        blk = (1, k) if args.granularity == "channel" else (128, 128)
        w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
        s = fp8_scales(n, k, blk, gen, dev)
        rows = s[:, 0].repeat_interleave(blk[0])[:n].contiguous()  # per-channel view of the scales for peers
        r8 = copies(n * k)
        ws = [w] + [w.clone() for _ in range(r8 - 1)]
        ss = [s] + [s.clone() for _ in range(r8 - 1)]
        lock = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
        wbf = (fp8_dense(w, s, blk)).to(dtype)
        peers: dict[str, list | str] = {
            "bf16": build(lambda src=wbf: bind(F.linear, src.clone()), copies(2 * n * k), "bf16"),
            "Marlin FP8": build(lambda src=w, sc=s, b=blk: marlin_fp8(src.clone(), sc, b, dtype), r8, "Marlin FP8"),
        }
        del wbf
        fp4 = {kind: [fp4_weight(n, k, kind, gen, dev) for _ in range(copies(n * k // 2))] for kind in
               ("nvfp4", "mxfp4")}
        for m in args.ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
            xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
            t: dict[str, float | None] = {}
            notes: list[str] = []
            t["bf16"] = point(timed, peers["bf16"], x, args.reps)
            t["Marlin FP8"] = point(timed, peers["Marlin FP8"], x, args.reps)
            for name, make in (("_scaled_mm", scaled_mm), ("cutlass", cutlass_mm)):
                t[name] = point(timed, fp8_peer(make, name, ws, rows, xq, sx, dtype, notes), x, args.reps)
            v8 = fp8mm.choose_variant(m, n, k)
            t["fp8 W8A16"] = point(timed, [bind(fp8mm.fp8_linear, wi, si, blk, lock=lock) for wi, si in zip(ws, ss)],
                                   x, args.reps)
            vw = fp8_w8a8.choose_w8a8_variant(m, n, k)
            t["W8A8 mm"] = point(timed, [const(fp8_w8a8.fp8_w8a8_mm, xq, sx, wi, si, blk, None, dtype, lock=lock)
                                         for wi, si in zip(ws, ss)], x, args.reps)
            t["W8A8 e2e"] = point(timed, [bind(fp8_w8a8.fp8_w8a8_linear, wi, si, blk, lock=lock)
                                          for wi, si in zip(ws, ss)], x, args.reps)
            for kind, label in (("nvfp4", "NVFP4"), ("mxfp4", "MXFP4")):
                t[label] = point(timed, [bind(fp4mm.fp4_linear, p, c, kind, g, lock=lock) for p, c, g in fp4[kind]],
                                 x, args.reps)
            v4 = fp4mm.choose_fp4_variant(m, n, k)
            say(f"| {k}x{n} | {m} | " + " | ".join(fmt(t.get(c)) for c in cols) + " | "
                f"{ratio(t['fp8 W8A16'], t['bf16'])} | {ratio(t['fp8 W8A16'], t['Marlin FP8'])} | "
                f"{ratio(t['W8A8 mm'], t['_scaled_mm'])} | {ratio(t['NVFP4'], t['bf16'])} | "
                f"{ratio(t['MXFP4'], t['bf16'])} | {v8} | {vw} | {v4} |" + (f" {'; '.join(notes)}" if notes else ""))
        del peers, ws, ss, fp4
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def check_peers(args: argparse.Namespace, dev: torch.device) -> None:
    """Every peer against the float64 product of the same codes (a time means nothing if the peer multiplies
    other numbers)."""
    from qlinear.kernels.triton import fp8_w8a8

    gen = torch.Generator(device=dev).manual_seed(5)
    k, n = args.shapes[0]
    blk = (1, k) if args.granularity == "channel" else (128, 128)
    w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
    s = fp8_scales(n, k, blk, gen, dev)
    rows = s[:, 0].repeat_interleave(blk[0])[:n].contiguous()
    x = torch.randn(16, k, device=dev, generator=gen).to(torch.bfloat16)
    xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
    ref = x.double() @ fp8_dense(w, s, blk).t()
    ref8 = (xq.double() * sx.double()[:, None]) @ fp8_dense(w, s, blk).t()
    say("| peer | rel err vs float64 |\n| --- | --- |")
    for name, run, r in (("Marlin FP8", lambda: marlin_fp8(w, s, blk, torch.bfloat16)(x), ref),
                         ("_scaled_mm", lambda: scaled_mm(w, rows, torch.bfloat16)(xq, sx), ref8),
                         ("cutlass_scaled_mm", lambda: cutlass_mm(w, rows, torch.bfloat16)(xq, sx), ref8)):
        if blk[0] != 1 and name != "Marlin FP8":
            say(f"| {name} | (rowwise scales only: block weights not comparable) |")
            continue
        try:
            err = rel(run(), r)
            say(f"| {name} | {err:.2e}{' MISMATCH' if err > 2e-2 else ''} |")
        except Exception as e:
            say(f"| {name} | unavailable: {type(e).__name__}: {str(e)[:200]} |")
    say()


# ---- sweep --------------------------------------------------------------------------------------------------------

def candidates(family: str, variant: str, m: int, n: int, k: int, bk: int) -> list:
    """A handful of tile configs around the heuristic one (each is a compile: keep it short). GEMV tiles keep the
    float32 accumulators (one ``[BN, BK]`` tile a row; FP4: ``[BN, BK/8]`` plus eight decoded tiles) within
    about 64 registers a thread (offline SASS: more spills); ``STEP`` scales (``bk < K``) skip the
    ``mma`` tiles that spill with their second accumulator."""
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm
    from qlinear.kernels.triton.fp_common import FConfig, split_for

    if family == "fp8":
        base = fp8mm.fp8_config(variant, m, n, k, bk=bk)
    elif family == "w8a8":
        base = fp8_w8a8.w8a8_config(variant, m, n, k, bk=bk)
    else:
        base = fp4mm.fp4_config(variant, m, n, k)
    out = [base]
    bm = base.block_m

    def cfg(bn: int, bkk: int, warps: int, stages: int, bmm: int | None = None, **kw) -> FConfig:
        b = bmm or bm
        tiles = -(-n // bn) * -(-m // b)
        split = split_for(tiles, k, bkk, 132, 8 if variant == "gemv" else 3) if variant != "mma" or m <= 64 else 1
        return FConfig(variant, b, bn, bkk, split, warps, stages, **kw)

    if variant == "gemv":
        fp4 = family in ("nvfp4", "mxfp4")
        for bn, bkk, w in ((32, 512, 8), (16, 512, 4), (32, 256, 4), (64, 256, 8), (16, 256, 4), (8, 512, 4),
                           (16, 128, 4), (32, 128, 8), (8, 256, 4), (32, 1024, 8), (16, 1024, 4)):
            live = (bm + 8) * bn * bkk // 8 if fp4 else bm * bn * bkk
            if live // (32 * w) <= (128 if fp4 else 64):
                out.append(cfg(bn, bkk, w, 3))
        out += [FConfig(**{**base.as_dict(), "split_k": max(1, int(base.split_k * f))}) for f in (0.5, 2)]
    elif variant == "skinny":
        bkk = 256 if family == "w8a8" else 128
        for bn, b, w, st in ((64, bkk, 4, 4), (64, 2 * bkk, 4, 3), (128, bkk, 4, 3), (128, bkk, 8, 3), (64, bkk, 4, 2),
                             (64, bkk, 4, 1)):
            out.append(cfg(bn, b, w, st))
        out += [FConfig(**{**base.as_dict(), "split_k": max(1, int(base.split_k * f))}) for f in (0.5, 2)]
        if family in ("fp8", "w8a8") and k % 16 == 0:
            out.append(FConfig(**{**base.as_dict(), "tma": True}))
    elif variant == "mma":
        bkk = 128 if family == "w8a8" else 64
        step = family in ("fp8", "w8a8") and bk < k
        tiles = ((16, 64, 2 * bkk, 4, 3), (16, 128, bkk, 4, 3), (32, 64, 2 * bkk, 4, 3)) if m <= 32 else ()
        tiles += ((64, 128, bkk, 4, 4), (128, 128, bkk, 8, 4), (128, 256, bkk, 8, 3), (128, 128, 2 * bkk, 8, 3),
                  (64, 256, bkk, 8, 3), (256, 128, bkk, 8, 3))
        for bmm, bn, b, w, st in tiles:
            if not (step and bmm * bn > 128 * 128):
                out.append(cfg(bn, b, w, st, bmm))
        if family in ("fp8", "w8a8") and k % 16 == 0:
            out += [FConfig(**{**c.as_dict(), "tma": True}) for c in out[:3]]
    elif variant == "dense":
        out += [FConfig("dense", 1, bn, b, 1, w, 1) for bn, b, w in ((32, 256, 4), (128, 64, 4), (64, 256, 8))]
    return list(dict.fromkeys(out))


def near(m: int) -> tuple[str, ...]:
    """The variants worth sweeping at M: the heuristic one and its neighbour across the crossover."""
    if m <= 4:
        return ("gemv", "skinny")
    if m <= 64:
        return ("skinny", "mma")
    return ("mma", "dense") if m >= 256 else ("mma",)


def sweep(args: argparse.Namespace, dev: torch.device) -> None:
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm

    timed, copies = timer(args)
    gen = torch.Generator(device=dev).manual_seed(3)
    dtype = torch.bfloat16
    for k, n in args.shapes:
        blk = (1, k) if args.granularity == "channel" else (128, 128)
        w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
        s = fp8_scales(n, k, blk, gen, dev)
        ws = [(w.clone(), s.clone()) for _ in range(copies(n * k))]
        fp4 = {kind: [fp4_weight(n, k, kind, gen, dev) for _ in range(copies(n * k // 2))]
               for kind in ("nvfp4", "mxfp4") if kind in args.families}
        lock = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
        for m in args.ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
            xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
            for family in args.families:
                variants = {"fp8": fp8mm.VARIANTS, "w8a8": fp8_w8a8.VARIANTS}.get(family, fp4mm.VARIANTS)
                for variant in args.variants or near(m):
                    if variant not in variants:
                        continue
                    found = []
                    for c in candidates(family, variant, m, n, k, blk[1]):
                        if family == "fp8":
                            fns = [bind(fp8mm.fp8_linear, a, b, blk, config=c, lock=lock) for a, b in ws]
                        elif family == "w8a8":
                            fns = [const(fp8_w8a8.fp8_w8a8_mm, xq, sx, a, b, blk, None, dtype, config=c, lock=lock)
                                   for a, b in ws]
                        else:
                            fns = [bind(fp4mm.fp4_linear, p, sc, family, g, config=c, lock=lock)
                                   for p, sc, g in fp4[family]]
                        us = point(timed, fns, x, max(5, args.reps // 2))
                        if us is not None:
                            found.append((us, c))
                    found.sort(key=lambda t: t[0])
                    say(f"\n{family} {variant} {k}x{n} M={m}: " + "; ".join(f"{c.short()} {us:.1f}"
                                                                            for us, c in found))
                    if found:
                        say(f"  best: {found[0][1]!r} ({found[0][0]:.1f} us)")


# ---- main -----------------------------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="KxN list (default: the four Llama shapes)")
    ap.add_argument("--ms", help="M list (default 1,4,16,64,256,1024,4096)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="2 shapes, M 1/16/256/4096, fewer checks")
    ap.add_argument("--no-check", action="store_true", help="skip the numerics checks")
    ap.add_argument("--check-only", action="store_true", help="only the numerics checks")
    ap.add_argument("--granularity", choices=("channel", "block"), default="channel", help="FP8 weight scales")
    ap.add_argument("--sweep", action="store_true", help="time a handful of tile configs per variant instead")
    ap.add_argument("--families", default="fp8,w8a8,nvfp4,mxfp4", help="--sweep: which kernels")
    ap.add_argument("--variants", default="", help="--sweep: these variants (default: those near M's crossover)")
    ap.add_argument("--interpret", action="store_true", help="CPU, Triton interpreter, tiny shapes (script check)")
    ap.add_argument("--out", help="write the report (Markdown) here")
    args = ap.parse_args(argv)
    if args.interpret:
        default_shapes, default_ms = ((256, 72),), (1, 5, 40)
    elif args.sweep:
        default_shapes, default_ms = ((8192, 28672),), (1, 16, 256)
    elif args.quick:
        default_shapes, default_ms = QUICK_SHAPES, QUICK_MS
    else:
        default_shapes, default_ms = SHAPES, MS
    args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes \
        else list(default_shapes)
    args.ms = [int(v) for v in args.ms.split(",")] if args.ms else list(default_ms)
    args.families = [f for f in args.families.split(",") if f]
    args.variants = [v for v in args.variants.split(",") if v]
    odd = ((992, 333), (1000, 333)) if not args.interpret else ((96, 40),)
    args.check_shapes = [args.shapes[0]] + ([] if args.quick else list(odd))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.interpret:
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            print("--interpret needs TRITON_INTERPRET=1 in the environment (set before Python starts)")
            return 2
        dev = torch.device("cpu")
        args.reps = 1
    elif not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels (--interpret checks it on CPU)")
        return 2
    else:
        dev = torch.device("cuda")
    t0 = time.time()
    import triton

    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU (interpreter)"
    say(f"# gpu_float: {name}, torch {torch.__version__}, triton {triton.__version__}")
    say(f"command: python benchmarks/gpu_float.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    ok = True
    with interpreter_patch(args):
        ok = run(args, dev)
    say(f"\n{time.time() - t0:.0f} s")
    if args.out:
        Path(args.out).write_text("\n".join(OUT) + "\n")
    return 0 if ok else 1


def interpreter_patch(args: argparse.Namespace):
    """Under ``--interpret``: the tests' interpreter set-up (bfloat16 dot operands multiplied as float32)."""
    if not args.interpret:
        return contextlib.nullcontext()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.triton_interp import interpreted

    from qlinear.kernels.triton import fp8mm

    return interpreted(fp8mm.fp8_dot_kernel)


def run(args: argparse.Namespace, dev: torch.device) -> bool:
    ok = True
    if args.sweep:
        sweep(args, dev)
    else:
        if not args.no_check:
            say("## Numerics (every variant vs float64; tolerance float16 2e-3, bfloat16 1e-2; each call twice: "
                "bitwise equal; split-K counters back at 0)\n")
            ok = run_checks(args, dev)
        if not args.check_only:
            say("## Peers' numerics\n")
            check_peers(args, dev)
            say("## Times\n")
            main_table(args, dev)
    return ok


if __name__ == "__main__":
    sys.exit(main())
