"""Shared pieces of ``gpu_float.py`` and its sibling scripts (``gpu_float_numerics``, ``gpu_float_sweep``): the
report lines, random inputs with float64 references built by torch ops (no qlinear decoding), the peers (vLLM's
FP8 Marlin and cutlass_scaled_mm, torch._scaled_mm) and the timing helpers.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

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


