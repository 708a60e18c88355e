"""FP8 / FP4 weights times bfloat16 activations in qlinear's native extra (``pip install ./native``), on a CPU.

``qlinear_native._float`` reads the stored codes (FP8 bytes ``[N, K]``, FP4 bytes ``[N, K/2]``) and the block
scales (float32 per row and K block for FP8; the E4M3 / E8M0 bytes for FP4), decodes in registers with
exact products (every FP8 value through a lookup to a normal bfloat16, subnormals included) and sums in
float32 (C sources' header comments). Two kernels, picked by M:

* ``*_mv`` (AVX-512 + VBMI, float32 FMAs): up to ``MV_MAX_M`` rows;
* ``*_mm`` (AMX-BF16 tiles): above it.

Measured one thread, 4096x14336, against dense bfloat16 ``F.linear`` (``benchmarks/cpu_float.py``,
``benchmarks/results/cpu_float-2026-12-04.md``): FP8 M=1 2.69x, NVFP4 3.29x, MXFP4 3.35x; M=4..16 1.7x-2.1x
(AMX); M=64 1.1x-1.5x. Bfloat16 activations only (float32 / float16 layers keep the exact torch tiles); K a
multiple of 32 and FP8 scale blocks a multiple of 32 wide (or the whole row).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from ..blockfloat import ScaleRule
from ..caps import Problem
from ..enums import DEVICE
from ..floats import Element
from ..layouts import float_layouts
from ..target import Target
from . import native_int4

if TYPE_CHECKING:
    from .float_base import FloatQuantLinear

INSTALL = "pip install ./native (qlinear's native extra, built for this CPU)"
#: Largest M for the AVX-512 kernels (above: AMX), measured by ``benchmarks/cpu_float.py`` (2026-12-04): FP8
#: per-channel M=2 3.14 ms vs AMX 3.64, M=4 4.68 vs 3.80; NVFP4 M=2 2.80 vs 3.75, M=4 4.30 vs 3.84.
MV_MAX_M = 2
_FMT = {Element.E4M3: "e4m3fn", Element.E5M2: "e5m2"}


def module() -> ModuleType | None:
    """``qlinear_native._float`` when installed, else None."""
    try:
        return importlib.import_module("qlinear_native._float")
    except ImportError:
        return None


def unsupported(scheme_k: int, block: tuple[int, int], element: Element) -> str:
    """Why the native kernels cannot take a layer of this shape, or ''."""
    if scheme_k % 32:
        return f"in_features {scheme_k} is not a multiple of 32"
    if element is not Element.E2M1 and block[1] < scheme_k and block[1] % 32:
        return f"FP8 scale blocks {block[1]} wide are not a multiple of 32"
    return ""


def _scales(layer: FloatQuantLinear) -> torch.Tensor:
    """The scale operand, derived once per prepare(): FP8 float32 ``[N, Cb]`` factors (reciprocals for a dividing
    rule), FP4 the stored bytes as uint8."""
    cached = getattr(layer, "_native_scales", None)
    if cached is not None and cached[0] == layer._runtime_key:
        return cached[1]
    if layer.scheme.element is Element.E2M1:
        s = layer.weight_scale.view(torch.uint8).contiguous()
    else:
        bn = float_layouts.block_of(layer.scheme)[0]
        f = layer._factors.repeat_interleave(bn, 0)[:layer.out_features]
        s = (1.0 / f if layer.rule() is ScaleRule.DIVIDE else f).to(torch.float32).contiguous()
    layer._native_scales = (layer._runtime_key, s)
    return s


def linear(layer: FloatQuantLinear, x2: torch.Tensor) -> torch.Tensor | None:
    """The native kernels' product ``[M, N]`` (bfloat16), or None when they do not apply (the torch tiles run)."""
    s = layer.scheme
    if x2.device.type != "cpu" or x2.dtype != torch.bfloat16 or unsupported(s.in_features, s.scale_block or (
            1, s.group_size), s.element):
        return None
    mod = module()
    if mod is None or not mod.available():
        return None
    m, k, n = x2.shape[0], s.in_features, s.out_features
    x = x2 if x2.stride(-1) == 1 else x2.contiguous()
    out = torch.empty(m, n, dtype=torch.bfloat16)
    kind = "mv" if m <= MV_MAX_M or not native_int4.amx_available(mod) else "mm"
    threads = torch.get_num_threads()
    if s.element is Element.E2M1:
        glob = getattr(layer, "weight_global_scale", None)
        g = 1.0 if glob is None else float(1.0 / glob.float().item())
        fmt = "nvfp4" if glob is not None else "mxfp4"
        getattr(mod, f"fp4_{kind}")(x.data_ptr(), layer.weight_packed.data_ptr(), _scales(layer).data_ptr(),
                                    out.data_ptr(), m, k, n, g, x.stride(0), n, fmt, "bfloat16", threads)
    else:
        bk = min(float_layouts.block_of(s)[1], k)
        getattr(mod, f"fp8_{kind}")(x.data_ptr(), layer.weight.data_ptr(), _scales(layer).data_ptr(),
                                    out.data_ptr(), m, k, n, bk, x.stride(0), n, _FMT[s.element], "bfloat16",
                                    threads)
    return out


def describe(problem: Problem, target: Target) -> str:
    """How the torch float kernels run ``problem`` on ``target``, for ``explain()``."""
    s = problem.scheme
    if not any(d.kind is DEVICE.CPU for d in target.devices):
        return ""
    if problem.dtype != torch.bfloat16:
        return "exact tiles decoded per forward (the native extra takes bfloat16 activations only)"
    why = unsupported(s.in_features, s.scale_block or (1, s.group_size), s.element or Element.E4M3)
    if why:
        return f"exact tiles decoded per forward (native extra: {why})"
    mod = module()
    if mod is None or not mod.available():
        return (f"exact tiles decoded per forward; {INSTALL} runs the stored codes directly (2.7x-3.3x dense "
                "bf16 at M=1)")
    amx = "AMX tiles above M=2" if native_int4.amx_available(mod) else "AVX-512 at every M (no AMX here)"
    return f"native extra: AVX-512 FMAs on the stored codes up to M={MV_MAX_M}, {amx}"
