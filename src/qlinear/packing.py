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
from .enums import BACKEND, FORMAT
from .kernels.base import QuantLinear
from .select import select
from .target import Target

PACK_IMPLS = (None, "original", "block", "gpu", "auto")


def _resolve_impl(pack_impl: str | None) -> str:
    if pack_impl not in PACK_IMPLS:
        raise ValueError(f"pack_impl must be one of None, 'original', 'block', 'gpu', 'auto'; got {pack_impl!r}")
    if pack_impl == "gpu" and not torch.cuda.is_available():
        raise ValueError("pack_impl='gpu' needs a CUDA device and this torch sees none; use 'block' or 'auto'")
    if pack_impl == "auto":
        return "gpu" if torch.cuda.is_available() else "block"
    return pack_impl or "original"


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


def hf_post_init(module: QuantLinear, **kwargs: Any) -> QuantLinear:
    """Derive the module's runtime state from its checkpoint buffers (the reference's post_init)."""
    if kwargs:
        raise TypeError(f"hf_post_init: unexpected options {sorted(kwargs)}")
    module.prepare()
    return module


def hf_repack_layer(module: QuantLinear, backend: str | BACKEND | None = None, *,
                    device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                    post_init: bool = True, post_init_kwargs: dict[str, Any] | None = None) -> QuantLinear:
    """A new layer of another backend holding the same weight, converted through the canonical form.

    Refuses a source whose checkpoint tensors were released in favour of a private runtime layout.
    """
    if getattr(module, "checkpoint_released", False):
        raise ValueError(f"{type(module).__name__} holds only its private runtime layout (checkpoint tensors "
                         "were released after prepare); reload the layer from its checkpoint to repack it")
    dev = device if device is not None else module.checkpoint_tensors()[0].device
    dtype = dtype or module.dtype
    choice = select(Problem(module.scheme, dtype), Target.here(dev), backend or BACKEND.AUTO)
    bias = getattr(module, "bias", None)
    dest = choice.kernel(module.scheme, bias=bias is not None, dtype=dtype)
    dest.load_affine(module.affine(), bias.detach().cpu() if bias is not None else None)
    dest = dest.to(Target.here(dev).devices[0].torch_device)
    dest.choice = choice
    if post_init:
        hf_post_init(dest, **(post_init_kwargs or {}))
    return dest


def hf_check_packing_feasibility(module: QuantLinear | type[QuantLinear], *, bits: int | None = None,
                                 group_size: int | None = None, sym: bool | None = None,
                                 desc_act: bool | None = None) -> tuple[bool, str]:
    """Can this kernel class pack raw quantizer outputs with these settings? ``(ok, reason)``."""
    cls = module if isinstance(module, type) else type(module)
    caps = cls.caps
    problems = []
    if not cls.implemented or cls.retired:
        problems.append(cls.retired or "not implemented yet")
    if bits is not None and bits not in caps.bits:
        problems.append(f"{bits}-bit not supported (declares {sorted(caps.bits)})")
    if group_size is not None and caps.group_sizes is not None and group_size not in caps.group_sizes:
        problems.append(f"group size {group_size} not supported (declares {sorted(caps.group_sizes)})")
    if sym is not None and caps.sym is not None and sym not in caps.sym:
        problems.append("symmetric only" if not sym else "asymmetric only")
    if desc_act is not None and caps.desc_act is not None and desc_act not in caps.desc_act:
        problems.append("desc_act not supported")
    return (not problems, "; ".join(problems) or "ok")


def hf_check_best_packing_format(module: QuantLinear | type[QuantLinear]) -> FORMAT:
    """The checkpoint format this kernel class packs natively: its highest-priority declared format."""
    cls = module if isinstance(module, type) else type(module)
    return max(cls.caps.formats.items(), key=lambda kv: kv[1])[0]
