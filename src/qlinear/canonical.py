"""One layer's checkpoint tensors to and from the canonical forms (``AffineWeight``, ``FloatWeight``), per layout,
and where two canonical weights differ: what every converter builds on (``convert.py`` for the affine and float
layouts, ``bnb_convert``, ``mlx_convert``, ``paro_convert`` for theirs), below all of them so none imports another.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from .affine import AffineWeight
from .blockfloat import FloatWeight
from .enums import FORMAT, METHOD
from .layouts import awq, bitblas, ct_int, float_layouts, gptq, marlin_weight
from .spec import ConfigError, Scheme, method_of

__all__ = ["ConfigError", "ConversionError", "decode", "difference", "encode", "target_scheme"]


class ConversionError(ValueError):
    """A conversion that would lose information or has no target encoding (the message says which)."""


def decode(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> AffineWeight | FloatWeight:
    """The canonical form of one layer's checkpoint tensors."""
    if scheme.element is not None:
        if scheme.format in float_layouts.FLOAT_LAYOUT_FORMATS:
            return float_layouts.from_checkpoint(tensors, scheme)
    elif scheme.method is METHOD.GPTQ and scheme.format in gptq.GPTQ_LAYOUT_FORMATS:
        return gptq.from_checkpoint(tensors, scheme)
    elif scheme.method is METHOD.GPTQ and scheme.format is FORMAT.MARLIN:
        return marlin_weight.from_checkpoint(tensors, scheme)
    elif scheme.format is FORMAT.BITBLAS:
        return bitblas.from_checkpoint(tensors, scheme)
    elif scheme.method is METHOD.AWQ and scheme.format in awq.AWQ_LAYOUT_FORMATS:
        return awq.from_checkpoint(tensors, scheme)
    elif scheme.method is METHOD.COMPRESSED_TENSORS and scheme.format in ct_int.INT_FORMATS:
        return ct_int.from_checkpoint(tensors, scheme)
    raise ConversionError(f"{scheme.method.value} {scheme.format.value}: no converter for this layout yet")


def encode(q: AffineWeight | FloatWeight, scheme: Scheme, scale_dtype: torch.dtype | None = None
           ) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of ``q`` in ``scheme``'s layout. ``scale_dtype``: the format's default when None
    (float16 for GPTQ and the AWQ GEMV layouts, the weight's own for AWQ GEMM and compressed-tensors)."""
    if isinstance(q, FloatWeight):
        if scheme.format in float_layouts.FLOAT_LAYOUT_FORMATS and scheme.element is not None:
            return float_layouts.to_checkpoint(q, scheme)
    elif scheme.method is METHOD.GPTQ and scheme.format in gptq.GPTQ_LAYOUT_FORMATS:
        return gptq.to_checkpoint(q, scheme.format, scheme.pack_dtype, scale_dtype or torch.float16)
    elif scheme.method is METHOD.GPTQ and scheme.format is FORMAT.MARLIN:
        return marlin_weight.to_checkpoint(q, scale_dtype or torch.float16)
    elif scheme.format is FORMAT.BITBLAS:
        return bitblas.to_checkpoint(q, scheme, scale_dtype or torch.float16)
    elif scheme.method is METHOD.AWQ and scheme.format in awq.AWQ_LAYOUT_FORMATS:
        default = q.scales.dtype if scheme.format is FORMAT.GEMM and q.scales.dtype in awq.SCALE_DTYPES \
            else torch.float16
        return awq.to_checkpoint(q, scheme.format, scale_dtype=scale_dtype or default)
    elif scheme.method is METHOD.COMPRESSED_TENSORS and scheme.format in ct_int.INT_FORMATS:
        return ct_int.to_checkpoint(q, scheme, scale_dtype)
    kind = "float" if isinstance(q, FloatWeight) else "integer"
    raise ConversionError(f"{scheme.method.value} {scheme.format.value}: no encoder for {kind} codes in this layout")


def affine_difference(a: AffineWeight, b: AffineWeight) -> str | None:
    if not torch.equal(a.g_idx.long(), b.g_idx.long()):
        return "g_idx differs"
    for name, x, y in (("codes", a.codes, b.codes), ("zeros", a.zeros, b.zeros),
                       ("scales", a.scales.double(), b.scales.double())):
        diff = (x != y).nonzero()
        if diff.numel():
            n, g = diff[0].tolist()
            where = "input channel" if name == "codes" else "group"
            return f"{name} at (out column {n}, {where} {g}): {x[n, g].item()} reads back as {y[n, g].item()}"
    return None


def float_difference(a: FloatWeight, b: FloatWeight) -> str | None:
    if (a.element, a.block, a.rule) != (b.element, b.block, b.rule):
        return f"element/block/rule {a.element.value} {a.block} {a.rule.value} reads back as " \
               f"{b.element.value} {b.block} {b.rule.value}"
    diff = (a.codes != b.codes).nonzero()
    if diff.numel():
        n, k = diff[0].tolist()
        return f"codes at (out {n}, in {k}): 0x{int(a.codes[n, k]):02x} reads back as 0x{int(b.codes[n, k]):02x}"
    if not torch.equal(a.scale_values().double(), b.scale_values().double()):
        return "block scales differ as values"
    return None


def difference(a: AffineWeight | FloatWeight, b: AffineWeight | FloatWeight) -> str | None:
    """Where ``b`` differs from ``a`` (codes, zeros, scales as values, g_idx), or None."""
    if isinstance(a, FloatWeight) and isinstance(b, FloatWeight):
        return float_difference(a, b)
    if isinstance(a, AffineWeight) and isinstance(b, AffineWeight):
        return affine_difference(a, b)
    return "integer and float codes"


def target_scheme(scheme: Scheme, to: FORMAT, pack_dtype: torch.dtype | None = None) -> Scheme:
    """``scheme`` re-expressed in format ``to`` (same numbers; the target's own word type and scale blocks)."""
    method = method_of(to)
    block = scheme.scale_block
    if method is METHOD.COMPRESSED_TENSORS and scheme.element is None:
        block = block or (1, scheme.group_size)
    elif method in (METHOD.GPTQ, METHOD.AWQ):
        block = None
    per_tensor = scheme.per_tensor_scale and block is not None
    return replace(scheme, method=method, format=to, pack_dtype=pack_dtype, scale_block=block,
                   per_tensor_scale=per_tensor, desc_act=scheme.desc_act and method is not METHOD.AWQ,
                   legacy_packing=False,
                   group_size=min((block or (1, scheme.group_size))[1], scheme.in_features))
