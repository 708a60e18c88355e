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

The per-layout codecs live one floor down in ``canonical.py``; bitsandbytes, MLX and ParoQuant have converters of
their own (``bnb_convert``, ``mlx_convert``, ``paro_convert``) that this module hands those formats to.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from . import bnb_convert, mlx_convert, paro_convert
from .affine import AffineWeight
from .blockfloat import FloatWeight
from .canonical import ConversionError, decode, difference, encode, target_scheme
from .enums import FORMAT, METHOD
from .layouts import float_layouts
from .spec import FLOAT_FORMATS, ConfigError, Scheme, method_of

__all__ = ["ConversionError", "convert_tensors", "decode", "encode", "target_scheme"]


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
    if FORMAT.BITSANDBYTES in (scheme.format, to):  # look-up-table codes: same-format copies only
        return bnb_convert.convert_tensors(tensors, scheme, to, pack_dtype)
    if FORMAT.MLX in (scheme.format, to):  # scale * q + bias: integer zero points both ways or refused
        return mlx_convert.convert_tensors(tensors, scheme, to, pack_dtype)
    if FORMAT.PAROQUANT in (scheme.format, to):  # rotated inputs: same-format copies only
        return paro_convert.convert_tensors(tensors, scheme, to, pack_dtype)
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
    lost = difference(q, back)
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
