"""The reference's packing API: pack quantizer outputs into a layer, repack a layer for another backend.

Codes are recomputed from the fake-quantized weight exactly as GPTQModel's packers do, so the
buffers are bit-identical to theirs: ``q = clamp(round((W + z*s) / s), 0, maxq)``, evaluated in
that order (``z*s`` first) in the promoted dtype of the weight and the scales, rounding half to
even. Every ``pack_impl`` gives the same bits; they differ only in where and in what pieces the
arithmetic runs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from .affine import AffineWeight
from .caps import Problem
from .enums import BACKEND, FORMAT, METHOD
from .kernels.base import QuantLinear
from .select import select
from .spec import ConfigError, Scheme, default_pack_dtype, method_of
from .target import Target

#: pack_impl spellings the reference accepts, and what each means here.
PACK_IMPLS = {None: "original", "original": "original", "pack_original": "original", "block": "block",
              "cpu": "block", "gpu": "gpu", "auto": "auto", "default": "auto"}


def _resolve_impl(pack_impl: str | None) -> str:
    if pack_impl not in PACK_IMPLS:
        raise ValueError(f"pack_impl must be one of {', '.join(map(repr, PACK_IMPLS))}; got {pack_impl!r}")
    pack_impl = PACK_IMPLS[pack_impl]
    if pack_impl == "gpu" and not torch.cuda.is_available():
        raise ValueError("pack_impl='gpu' needs a CUDA device and this torch sees none; use 'block' or 'auto'")
    if pack_impl == "auto":
        return "gpu" if torch.cuda.is_available() else "block"
    return pack_impl


def quantized_codes(weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
                    bits: int) -> torch.Tensor:
    """Codes ``[N, K]`` uint8 from the fake-quantized weight, in the reference packers' operation order."""
    dt = torch.promote_types(weight.dtype, scales.dtype)
    g = g_idx.long()
    s = scales.to(dt)[:, g]
    zs = (zeros.to(dt) * scales.to(dt))[:, g]
    q = torch.round((weight.to(dt) + zs) / s)
    return q.clamp_(0, (1 << bits) - 1).to(torch.uint8)


def _codes(weight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, bits: int,
           impl: str, device: torch.device | None, block_in: int, workers: int) -> torch.Tensor:
    if impl == "gpu":
        device = device if device is not None and torch.device(device).type == "cuda" else torch.device("cuda")
    dev = torch.device(device) if device is not None else weight.device
    w, s, z, g = (t.to(dev) for t in (weight, scales, zeros, g_idx))
    if impl in ("original", "gpu"):
        return quantized_codes(w, s, z, g, bits).cpu()
    if block_in <= 0:
        raise ValueError(f"block_in must be a positive number of input channels; got {block_in}")
    starts = range(0, w.shape[1], block_in)

    def one(k0: int) -> torch.Tensor:
        sl = slice(k0, k0 + block_in)
        return quantized_codes(w[:, sl], s, z, g[sl], bits)

    if workers > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parts = list(pool.map(one, starts))
    else:
        parts = [one(k0) for k0 in starts]
    return torch.cat(parts, dim=1).cpu()


def hf_pack_layer(module: QuantLinear, linear: nn.Module, scales: torch.Tensor, zeros: torch.Tensor | None = None,
                  g_idx: torch.Tensor | None = None, *, pack_impl: str | None = None,
                  device: torch.device | str | None = None, block_in: int = 8192, workers: int = 1,
                  scales_extra: torch.Tensor | None = None, post_init: bool = False,
                  post_init_kwargs: dict[str, Any] | None = None,
                  checkpoint_format: str | FORMAT | None = None) -> QuantLinear:
    """Pack a quantized layer's outputs into ``module``'s checkpoint buffers (bit-exact with GPTQModel).

    ``linear.weight`` is the fake-quantized weight ``[N, K]``; ``scales``/``zeros`` are
    ``[N, G]`` (quantizer orientation); ``zeros`` may be omitted for symmetric modules (they are
    ``2**(bits-1)``); ``g_idx`` defaults to ``k // group_size``. Returns ``module``.
    """
    if not isinstance(module, QuantLinear):
        raise TypeError(f"hf_pack_layer: expected a qlinear QuantLinear module, got {type(module).__name__}")
    if not module.raw_packing:
        raise ValueError(f"{type(module).__name__} cannot pack raw quantizer outputs; pack into a checkpoint "
                         "format first (e.g. TorchLinear) and load or repack that")
    impl = _resolve_impl(pack_impl)
    if scales_extra is not None:
        raise ValueError("scales_extra is for QQQ layers; this layer's format has no extra scales")
    s = module.scheme
    if checkpoint_format is not None:
        fmt = FORMAT(checkpoint_format)
        if module.caps.priority(fmt) is None:
            raise ValueError(f"{type(module).__name__} does not hold format {fmt.value}")
        module.scheme = s = replace(s, format=fmt)
    weight = getattr(linear, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"linear: expected a module with a .weight tensor, got {type(linear).__name__}")
    weight = weight.detach()
    if tuple(weight.shape) != (s.out_features, s.in_features):
        raise ValueError(f"linear.weight: expected shape [{s.out_features}, {s.in_features}], got "
                         f"{tuple(weight.shape)}")
    scales = scales.detach()
    if tuple(scales.shape) != (s.out_features, s.num_groups):
        hint = " (scales are [out_features, num_groups]; transpose a [groups, out] tensor)" \
            if tuple(scales.shape) == (s.num_groups, s.out_features) else ""
        raise ValueError(f"scales: expected shape [{s.out_features}, {s.num_groups}], got "
                         f"{tuple(scales.shape)}{hint}")
    if zeros is None:
        if not s.sym:
            raise ValueError("zeros: an asymmetric layer needs its zero points; got None")
        zeros = torch.full_like(scales, float(1 << (s.bits - 1)), dtype=torch.int32)
    zeros = zeros.detach()
    if tuple(zeros.shape) != tuple(scales.shape):
        raise ValueError(f"zeros: expected shape {tuple(scales.shape)} like scales, got {tuple(zeros.shape)}")
    if g_idx is None:
        g_idx = torch.arange(s.in_features, dtype=torch.int32) // s.group_size
    codes = _codes(weight, scales, zeros, g_idx, s.bits, impl, device, block_in, workers)
    q = AffineWeight(codes=codes, scales=scales.float().cpu(), zeros=torch.round(zeros.float()).to(torch.int32).cpu(),
                     g_idx=g_idx.to(torch.int32).cpu(), bits=s.bits, group_size=s.group_size, sym=s.sym)
    bias = getattr(linear, "bias", None)
    module.load_affine(q, bias.detach() if isinstance(bias, torch.Tensor) else None)
    if post_init:
        hf_post_init(module, **(post_init_kwargs or {}))
    return module


def hf_post_init(module: nn.Module, **post_init_kwargs: Any) -> nn.Module:
    """Derive runtime state from checkpoint buffers: for a qlinear layer, or every one inside a container."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"hf_post_init: expected a torch.nn.Module, got {type(module).__name__}")
    if post_init_kwargs:
        raise TypeError(f"hf_post_init: unexpected options {sorted(post_init_kwargs)} (prepare() takes none)")
    layers = [m for m in module.modules() if isinstance(m, QuantLinear)]
    for layer in layers:
        layer.prepare()
    return module


def hf_repack_layer(module: QuantLinear, backend: str | BACKEND | None = None, *,
                    device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                    post_init: bool = True, post_init_kwargs: dict[str, Any] | None = None) -> QuantLinear:
    """A new layer of another backend holding the same weight, converted through the canonical form.

    Refuses a source whose checkpoint tensors were released in favour of a private runtime layout.
    """
    if not isinstance(module, QuantLinear):
        raise TypeError(f"hf_repack_layer: expected a qlinear QuantLinear module, got {type(module).__name__}")
    if getattr(module, "checkpoint_released", False):
        raise ValueError(f"{type(module).__name__} holds only its private runtime layout (checkpoint tensors "
                         "were released after prepare); reload the layer from its checkpoint to repack it")
    dev = device if device is not None else module.checkpoint_tensors()[0].device
    dtype = dtype or module.dtype
    choice = select(Problem(module.scheme, dtype), Target.here(dev), backend or BACKEND.AUTO)
    same_place = torch.device(Target.here(dev).devices[0].torch_device) == module.checkpoint_tensors()[0].device
    if choice.kernel is type(module) and dtype == module.dtype and same_place:
        return module
    bias = getattr(module, "bias", None)
    dest = choice.kernel(module.scheme, bias=bias is not None, dtype=dtype)
    dest.load_affine(module.affine(), bias.detach().cpu() if bias is not None else None)
    dest = dest.to(Target.here(dev).devices[0].torch_device)
    dest.choice = choice
    if post_init:
        hf_post_init(dest, **(post_init_kwargs or {}))
    return dest


def _packing_choice(bits: int, group_size: int, desc_act: bool, sym: bool, fmt: FORMAT, backend: BACKEND | str,
                    device: torch.device | str | None, dtype: torch.dtype | None, pack_dtype: torch.dtype | None,
                    in_features: int | None, out_features: int | None, repack: bool) -> list[type[QuantLinear]]:
    """Kernels that could pack (or, with ``repack``, load) such a layer on ``device``, best first."""
    from .select import explain

    k, n = in_features or 4096, out_features or 4096
    scheme = Scheme(bits=bits, group_size=group_size, in_features=k, out_features=n, sym=sym, desc_act=desc_act,
                    method=method_of(fmt), format=fmt, pack_dtype=pack_dtype or default_pack_dtype(fmt))
    dev = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    choice = explain(Problem(scheme, dtype or torch.float16), Target.here(dev), backend)
    return [v.kernel for v in choice.verdicts if v.ok and (repack or v.kernel.raw_packing)]


def hf_check_packing_feasibility(bits: int, group_size: int = -1, desc_act: bool = False, sym: bool = True, *,
                                 format: FORMAT | str = FORMAT.GPTQ, backend: BACKEND | str = BACKEND.AUTO,
                                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                                 pack_dtype: torch.dtype | None = None, in_features: int | None = None,
                                 out_features: int | None = None, repack: bool = False) -> bool:
    """Can some kernel (or ``backend``) pack a layer with these settings here? Never raises for an
    infeasible combination (False); a malformed one (unknown format, bits 9) raises ``ValueError``.
    Without a shape, 4096 x 4096 stands in (it meets every declared divisibility)."""
    fmt = FORMAT(format)
    try:
        return bool(_packing_choice(bits, group_size, desc_act, sym, fmt, backend, device, dtype, pack_dtype,
                                    in_features, out_features, repack))
    except ConfigError:
        return False


#: Tie-break between formats whose best kernels have the same priority: true zeros first (v1 cannot
#: hold a zero point of 0), then v1, then planar.
FORMAT_PREFERENCE = (FORMAT.GPTQ_V2, FORMAT.GPTQ, FORMAT.GPTQ_P, FORMAT.GEMM, FORMAT.GEMV, FORMAT.GEMV_FAST,
                     FORMAT.LLM_AWQ)


def hf_check_best_packing_format(bits: int, group_size: int = -1, desc_act: bool = False, sym: bool = True, *,
                                 quant_method: METHOD | str = METHOD.GPTQ, device: torch.device | str | None = None,
                                 dtype: torch.dtype | None = None, pack_dtype: torch.dtype | None = None,
                                 in_features: int | None = None, out_features: int | None = None,
                                 formats: list[FORMAT | str] | None = None) -> FORMAT:
    """The checkpoint format whose best packing kernel here has the highest AUTO priority.

    Unlike the reference (ties broken by name, so 5-bit got ``gptq``, which cannot hold it), only
    formats that can express the weight are ranked, and ties prefer ``FORMAT_PREFERENCE``.
    """
    method = METHOD(quant_method)
    pool = [FORMAT(f) for f in formats] if formats else [f for f in FORMAT_PREFERENCE if method_of(f) is method]
    ranked = []
    for fmt in pool:
        try:
            kernels = _packing_choice(bits, group_size, desc_act, sym, fmt, BACKEND.AUTO, device, dtype,
                                      pack_dtype, in_features, out_features, repack=False)
        except ConfigError:
            continue
        if kernels:
            rank = FORMAT_PREFERENCE.index(fmt) if fmt in FORMAT_PREFERENCE else len(FORMAT_PREFERENCE)
            ranked.append((-(kernels[0].caps.priority(fmt) or 0), rank, fmt))
    if not ranked:
        raise ValueError(f"no feasible packing format for {bits}-bit group {group_size} "
                         f"{'sym' if sym else 'asym'}{' desc_act' if desc_act else ''} among "
                         f"{', '.join(f.value for f in pool)}")
    return min(ranked)[2]
