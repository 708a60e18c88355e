"""Convert one layer's checkpoint tensors between formats, through the canonical forms.

Integer layouts (GPTQ, AWQ, compressed-tensors pack/naive/int-quantized) meet in ``AffineWeight``; float
layouts (GPTQModel FP8, transformers' FP8, compressed-tensors float/naive FP8, NVFP4, MXFP4) in
``FloatWeight``. A conversion is lossless or it does not happen: the result is decoded again and
compared with the source's canonical form, and any difference raises ``ConversionError`` saying what
would be lost. Refused on purpose:

* integer codes to float codes and back (different numbers), FP8 scales that divide (GPTQModel) to ones
  that multiply (the reciprocal is not exact), FP8 to NVFP4/MXFP4;
* an act-order (desc_act) weight to AWQ: AWQ has no g_idx, and permuting the input channels to make the
  groups contiguous would change the order in which the layer reads its inputs;
* bit widths the target cannot hold (GPTQ 3-bit or planar 5/6/7-bit to AWQ; AWQ GEMV layouts are 4-bit);
* scales the target dtype cannot hold exactly (bfloat16 scales into float16 GPTQ/GEMV scales);
* gemv_fast / llm-awq targets where the float16 scaled zero ``-s*z`` overflows, or a zero scale would
  drop its zero point (``-0*z`` keeps no ``z``). Elsewhere ``z`` is recovered exactly (layouts/awq);
* a checkpoint that quantizes activations (W8A8, W4A4) written to a format whose config cannot say so
  (GPTQ, AWQ) — except in memory, where the layer keeps its scheme (``in_memory``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from .affine import AffineWeight
from .blockfloat import FloatWeight
from .enums import FORMAT, METHOD
from .layouts import awq, bitblas, ct_int, float_layouts, gptq, marlin_weight
from .spec import FLOAT_FORMATS, ConfigError, Scheme, method_of


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


def _affine_difference(a: AffineWeight, b: AffineWeight) -> str | None:
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


def _float_difference(a: FloatWeight, b: FloatWeight) -> str | None:
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


def _difference(a: AffineWeight | FloatWeight, b: AffineWeight | FloatWeight) -> str | None:
    """Where ``b`` differs from ``a`` (codes, zeros, scales as values, g_idx), or None."""
    if isinstance(a, FloatWeight) and isinstance(b, FloatWeight):
        return _float_difference(a, b)
    if isinstance(a, AffineWeight) and isinstance(b, AffineWeight):
        return _affine_difference(a, b)
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


def convert_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme, to_format: FORMAT | str,
                    pack_dtype: torch.dtype | None = None, *, in_memory: bool = False
                    ) -> tuple[dict[str, torch.Tensor], Scheme]:
    """Re-encode a layer's checkpoint tensors in ``to_format``; returns the tensors and the target scheme.

    ``pack_dtype`` defaults to the target format's word (int16 for gemv_fast and llm-awq, else int32).
    ``in_memory``: for a layer re-encoded at load rather than written: scales keep their dtype (GPTQ
    layouts hold bfloat16 ones then) and a scheme's activation quantization stays with the layer.
    A ``bias`` entry is carried over (float16, or the scales' dtype for AWQ gemm and float formats) when
    that is exact; activation-scale tensors (``input_scale``, ``input_global_scale``) as they are.
    """
    to = FORMAT(to_format)
    if FORMAT.BITSANDBYTES in (scheme.format, to):  # look-up-table codes: same-format copies only (bnb_convert)
        from .bnb_convert import convert_tensors as convert_bnb

        return convert_bnb(tensors, scheme, to, pack_dtype)
    if FORMAT.MLX in (scheme.format, to):  # scale * q + bias: integer zero points both ways or refused (mlx_convert)
        from .mlx_convert import convert_tensors as convert_mlx

        return convert_mlx(tensors, scheme, to, pack_dtype)
    if FORMAT.PAROQUANT in (scheme.format, to):  # rotated inputs: same-format copies only (paro_convert)
        from .paro_convert import convert_tensors as convert_paro

        return convert_paro(tensors, scheme, to, pack_dtype)
    what = f"cannot convert {scheme.format.value} to {to.value}"
    method = method_of(to)
    if scheme.activations is not None and method in (METHOD.GPTQ, METHOD.AWQ) and not in_memory:
        raise ConversionError(f"{what}: the checkpoint quantizes activations ({scheme.activations.describe()}) and "
                              f"{to.value} configs cannot say so; keep it in a compressed-tensors format")
    q = decode(tensors, scheme)
    if method is METHOD.AWQ and isinstance(q, AffineWeight) and q.desc_act:
        raise ConversionError(f"{what}: the weight is act-order (desc_act): AWQ layouts have no g_idx and group input "
                              "channel k as k // group_size, and permuting the inputs would change the order in "
                              "which the layer reads them; keep it in a GPTQ format")
    holds_float = to in float_layouts.FLOAT_LAYOUT_FORMATS
    holds_int = to not in FLOAT_FORMATS
    if not (holds_float if isinstance(q, FloatWeight) else holds_int):
        kind = "float" if isinstance(q, FloatWeight) else "integer"
        raise ConversionError(f"{what}: the weight has {kind} codes, which {to.value} does not hold")
    try:
        target = target_scheme(scheme, to, pack_dtype)
        keep = q.scales.dtype if in_memory and isinstance(q, AffineWeight) else None
        out = encode(q, target, keep)
        back = decode(out, target)
    except ConversionError:
        raise
    except (ConfigError, ValueError) as err:
        raise ConversionError(f"{what}: {err}") from None
    lost = _difference(q, back)
    if lost is not None:
        raise ConversionError(f"{what} without loss: {lost}")
    for name in () if scheme.activations is None else scheme.activations.tensor_names:
        if name in tensors:
            out[name] = tensors[name]
    bias = tensors.get("bias")
    if bias is not None:
        dtype = _bias_dtype(out, to, bias)
        cast = bias.detach().to(dtype)
        if not torch.equal(cast.double(), bias.detach().double()):
            raise ConversionError(f"{what} without loss: bias is not exactly representable in {dtype}")
        out["bias"] = cast
    return out, target


def _bias_dtype(out: Mapping[str, torch.Tensor], to: FORMAT, bias: torch.Tensor) -> torch.dtype:
    if to is FORMAT.GEMM:
        return out["scales"].dtype
    if method_of(to) in (METHOD.GPTQ, METHOD.AWQ):
        return torch.float16
    return bias.dtype  # compressed-tensors and FP8 checkpoints keep the model's own bias dtype
