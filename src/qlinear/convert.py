"""Convert one layer's checkpoint tensors between GPTQ and AWQ layouts, through the canonical form.

A conversion is lossless or it does not happen: the result is decoded again and compared with the
source's canonical form (codes, true zeros, scales as values, g_idx), and any difference raises
``ConversionError`` saying what would be lost. Refused on purpose:

* an act-order (desc_act) GPTQ weight to any AWQ format: AWQ has no g_idx, and permuting the input
  channels to make the groups contiguous would change the order in which the layer reads its inputs;
* bit widths the target cannot hold (GPTQ 3-bit or planar 5/6/7-bit to AWQ; AWQ GEMV layouts are 4-bit);
* scales the target dtype cannot hold exactly (AWQ GEMM bfloat16 scales into float16 GPTQ/GEMV scales);
* gemv_fast / llm-awq targets where the float16 scaled zero ``-s*z`` overflows, or a zero scale would
  drop its zero point (``-0*z`` keeps no ``z``). Elsewhere ``z`` is recovered exactly (layouts/awq).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .affine import AffineWeight
from .enums import FORMAT, METHOD
from .layouts import awq, gptq
from .spec import ConfigError, Scheme, method_of


class ConversionError(ValueError):
    """A conversion that would lose information or has no target encoding (the message says which)."""


def decode(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> AffineWeight:
    """The canonical form of a GPTQ (gptq, gptq_v2, gptq_p) or AWQ (gemm, gemv, gemv_fast, llm-awq) layer."""
    if scheme.method is METHOD.GPTQ and scheme.format in gptq.GPTQ_LAYOUT_FORMATS:
        return gptq.from_checkpoint(tensors, scheme)
    if scheme.method is METHOD.AWQ and scheme.format in awq.AWQ_LAYOUT_FORMATS:
        return awq.from_checkpoint(tensors, scheme)
    raise ConversionError(f"{scheme.method.value} {scheme.format.value}: no converter for this layout yet")


def encode(q: AffineWeight, scheme: Scheme, scale_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of ``q`` in ``scheme``'s layout (``scale_dtype`` applies to AWQ gemm only)."""
    if scheme.method is METHOD.GPTQ and scheme.format in gptq.GPTQ_LAYOUT_FORMATS:
        return gptq.to_checkpoint(q, scheme.format, scheme.pack_dtype)
    if scheme.method is METHOD.AWQ and scheme.format in awq.AWQ_LAYOUT_FORMATS:
        return awq.to_checkpoint(q, scheme.format, scale_dtype=scale_dtype)
    raise ConversionError(f"{scheme.method.value} {scheme.format.value}: no converter for this layout yet")


def _first_difference(a: AffineWeight, b: AffineWeight) -> str | None:
    """Where ``b`` differs from ``a`` (codes, zeros, scales as values, g_idx), or None."""
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


def convert_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme, to_format: FORMAT | str,
                    pack_dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], Scheme]:
    """Re-encode a layer's checkpoint tensors in ``to_format``; returns the tensors and the target scheme.

    ``pack_dtype`` defaults to the target format's word (int16 for gemv_fast and llm-awq, else int32).
    A ``bias`` entry is carried over (float16, or the scales' dtype for AWQ gemm) when that is exact.
    """
    to = FORMAT(to_format)
    what = f"cannot convert {scheme.format.value} to {to.value}"
    method = method_of(to)
    q = decode(tensors, scheme)
    if method is METHOD.AWQ and q.desc_act:
        raise ConversionError(f"{what}: the weight is act-order (desc_act): AWQ layouts have no g_idx and group input "
                              "channel k as k // group_size, and permuting the inputs would change the order in "
                              "which the layer reads them; keep it in a GPTQ format")
    try:
        target = Scheme(bits=scheme.bits, group_size=scheme.group_size, in_features=scheme.in_features,
                        out_features=scheme.out_features, sym=scheme.sym,
                        desc_act=scheme.desc_act and method is METHOD.GPTQ, method=method, format=to,
                        pack_dtype=pack_dtype)
        scale_dtype = q.scales.dtype if to is FORMAT.GEMM and q.scales.dtype in awq.SCALE_DTYPES else torch.float16
        out = encode(q, target, scale_dtype)
        back = decode(out, target)
    except ConversionError:
        raise
    except (ConfigError, ValueError) as err:
        raise ConversionError(f"{what}: {err}") from None
    lost = _first_difference(q, back)
    if lost is not None:
        raise ConversionError(f"{what} without loss: {lost}")
    bias = tensors.get("bias")
    if bias is not None:
        dtype = out["scales"].dtype if to is FORMAT.GEMM else torch.float16
        cast = bias.detach().to(dtype)
        if not torch.equal(cast.double(), bias.detach().double()):
            raise ConversionError(f"{what} without loss: bias is not exactly representable in {dtype}")
        out["bias"] = cast
    return out, target
