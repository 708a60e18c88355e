"""4-bit look-up-table weights (bitsandbytes NF4 / FP4) in qlinear's native extra (``pip install ./native``), on a CPU.

``qlinear_native._lut4`` reads bitsandbytes' own tensors: the packed codes ``[N, K/2]`` (high nibble first), the
float32 ``absmax [N, K/block]`` and the 16-entry float32 table, and computes ``y = x @ W^T`` with
``W[n, k] = table[c(n, k)] * absmax[n, k // block]`` formed in float32 (the float32 weight bitsandbytes'
dequantization computes), exact products and float32 sums (arithmetic: the C sources' header comments). Two
kernels, picked by M and the activation dtype:

* ``lut4_mv`` (AVX-512 float32 FMAs, bfloat16 or float32 activations): up to ``MV_MAX_M`` rows (bfloat16 with
  AMX), ``MV_MAX_M_WITHOUT_AMX`` (bfloat16 without), ``FP32_MAX_M`` (float32);
* ``lut4_mm`` (AMX-BF16 tiles, bfloat16 activations; each weight split exactly into three bfloat16 terms): up
  to ``MM_MAX_M`` rows.

Beyond those M (and for float16 activations) ``linear`` returns None and the caller's torch path runs: there the
native kernels measured more than 10% slower than dense bfloat16 ``F.linear`` (``benchmarks/cpu_bnb.py``,
``benchmarks/results/cpu_bnb_2026-12-04.md``).
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from . import native_int4

INSTALL = "pip install ./native (qlinear's native extra, built for this CPU)"
#: Largest M for ``lut4_mv`` with bfloat16 activations where AMX runs the rest. Measured one thread, NF4 block
#: 64 (``benchmarks/results/cpu_bnb_2026-12-04.md``, section 2), lut4_mv vs lut4_mm ms: 4096x14336 M=3 5.61 vs
#: 8.01, M=5 8.58 vs 8.44, M=6 9.89 vs 8.68; 14336x4096 M=3 5.49 vs 8.26, M=5 8.21 vs 8.49, M=6 8.95 vs 8.50.
MV_MAX_M = 4
#: Largest M for ``lut4_mm`` (above: None, the caller's path): its three bfloat16 terms cost three TDPBF16PS per
#: tile. Same file, ours vs dense bf16 ``F.linear`` ms: M=64 18.0 vs 18.4 and 19.8 vs 23.7 (section 1); M=96
#: 29.9 vs 20.3 and 35.8 vs 24.9, M=256 81.9 vs 40.5 and 95 vs 39.5 (sections 2, 1).
MM_MAX_M = 64
#: Largest M for ``lut4_mv`` with bfloat16 activations on a CPU without AMX: M=6 9.89 ms vs dense bf16 11.1, M=8
#: 12.6 vs 11.1 (4096x14336, section 2; dense ran on AMX there, so the bound is conservative).
MV_MAX_M_WITHOUT_AMX = 6
#: Largest M for ``lut4_mv`` with float32 activations, against dense float32 ``F.linear`` (section 3): M=32 49.4
#: ms vs 56 and 53.1 vs 56; M=48 74.2 vs 62.9 and 99.4 vs 64.1.
FP32_MAX_M = 32
DTYPES = (torch.bfloat16, torch.float32)


def module() -> ModuleType | None:
    """``qlinear_native._lut4`` when installed, else None."""
    try:
        return importlib.import_module("qlinear_native._lut4")
    except ImportError:
        return None


def unavailable_reason(k: int, block: int, dtype: torch.dtype) -> str:
    """Why the native kernels cannot take a layer of ``k`` inputs, absmax blocks of ``block`` and activations of
    ``dtype`` on this machine, or '' (some M may still fall back: see ``max_m``)."""
    if dtype not in DTYPES:
        return f"activations are {dtype}, the native LUT4 kernels take bfloat16 or float32"
    if block <= 0 or block % 32:
        return f"absmax block {block} is not a positive multiple of 32"
    if k <= 0 or k % block:
        return f"in_features {k} is not a positive multiple of the absmax block {block}"
    mod = module()
    if mod is None:
        return f"the native extra is not installed ({INSTALL})"
    if not mod.available():
        return "this CPU or OS offers no AVX-512 (F, BW, DQ, VL) for the native LUT4 kernels"
    return ""


def max_m(dtype: torch.dtype) -> int:
    """The largest M the native kernels take for activations of ``dtype`` on this CPU (0: none)."""
    mod = module()
    if mod is None or not mod.available() or dtype not in DTYPES:
        return 0
    if dtype == torch.float32:
        return FP32_MAX_M
    return MM_MAX_M if native_int4.amx_available(mod) else MV_MAX_M_WITHOUT_AMX


def kernel_for(m: int, dtype: torch.dtype) -> str | None:
    """``"lut4_mv"``, ``"lut4_mm"`` or None (fall back) for ``m`` rows of ``dtype`` activations on this CPU."""
    if m < 1 or m > max_m(dtype):
        return None
    mod = module()
    amx = mod is not None and native_int4.amx_available(mod)
    return "lut4_mm" if dtype == torch.bfloat16 and m > MV_MAX_M and amx else "lut4_mv"


def _check(x2: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, table: torch.Tensor, block: int) -> None:
    """Raise ValueError naming the tensor, the expected and the found shape or dtype."""
    if x2.dim() != 2:
        raise ValueError(f"native_lut4.linear: expected x2 [M, K], got shape {tuple(x2.shape)}")
    k = x2.shape[1]
    if not isinstance(block, int) or block <= 0:
        raise ValueError(f"native_lut4.linear: expected a positive int block, got {block!r}")
    if codes.dtype != torch.uint8 or codes.dim() != 2 or 2 * codes.shape[1] != k:
        raise ValueError(f"native_lut4.linear: expected codes uint8 [N, {k // 2}] (K={k} from x2), got "
                         f"{codes.dtype} {tuple(codes.shape)}")
    want = (codes.shape[0], k // block)
    if absmax.dtype != torch.float32 or (k % block == 0 and tuple(absmax.shape) != want):
        raise ValueError(f"native_lut4.linear: expected absmax float32 {list(want)} (N, K // block), got "
                         f"{absmax.dtype} {tuple(absmax.shape)}")
    if table.dtype != torch.float32 or tuple(table.shape) != (16,):
        raise ValueError(f"native_lut4.linear: expected table float32 [16], got {table.dtype} {tuple(table.shape)}")


def linear(x2: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, table: torch.Tensor,
           block: int) -> torch.Tensor | None:
    """``x2 @ W^T`` ``[M, N]`` in ``x2``'s dtype, or None when the extra is missing or does not take this case
    (activation dtype, block, K, device, M beyond what beats the caller's fallback, or x2 needing a gradient: the
    kernels have no backward). Shapes and dtypes that do not fit together raise ValueError."""
    _check(x2, codes, absmax, table, block)
    m, k = x2.shape
    n = codes.shape[0]
    devices = {t.device.type for t in (x2, codes, absmax, table)}
    if devices != {"cpu"} or unavailable_reason(k, block, x2.dtype) or (x2.requires_grad and torch.is_grad_enabled()):
        return None
    if m == 0 or n == 0:
        return torch.zeros(m, n, dtype=x2.dtype)
    kernel = kernel_for(m, x2.dtype)
    mod = module()
    if kernel is None or mod is None:
        return None
    x = x2 if x2.stride(1) == 1 and x2.stride(0) >= k else x2.contiguous()
    c, a, t = codes.contiguous(), absmax.contiguous(), table.contiguous()
    out = torch.empty(m, n, dtype=x2.dtype)
    getattr(mod, kernel)(x.data_ptr(), c.data_ptr(), a.data_ptr(), t.data_ptr(), out.data_ptr(), m, k, n, block,
                         x.stride(0), n, "bfloat16" if x2.dtype == torch.bfloat16 else "float32",
                         torch.get_num_threads())
    return out


def describe(k: int, block: int, dtype: torch.dtype, m: int | None = None) -> str:
    """One line for ``explain()``: which native path runs (for ``m`` rows, or by M), or why none does."""
    why = unavailable_reason(k, block, dtype)
    if why:
        return f"native LUT4 kernels: no ({why})"
    mod = module()
    amx = mod is not None and native_int4.amx_available(mod)
    top = max_m(dtype)
    if m is not None:
        kernel = kernel_for(m, dtype)
        if kernel is None:
            return (f"native LUT4 kernels: M={m} falls back (above M={top}, where they measured more than 1.1x "
                    "the dense F.linear)")
        return f"native LUT4: {'AMX three-term tiles' if kernel == 'lut4_mm' else 'AVX-512 vector path'} ({kernel})"
    if dtype == torch.bfloat16 and amx:
        return (f"native LUT4: AVX-512 vector path (lut4_mv) at M=1..{MV_MAX_M}, AMX three-term tiles (lut4_mm) "
                f"at M={MV_MAX_M + 1}..{top}, falls back above")
    return f"native LUT4: AVX-512 vector path (lut4_mv) at M=1..{top}, falls back above" + (
        "" if dtype == torch.float32 else " (no AMX here)")
