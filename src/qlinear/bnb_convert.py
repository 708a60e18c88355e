"""Conversions of bitsandbytes layers: a same-format copy through the canonical form, byte for byte; anything else is
refused with the reason (``convert.convert_tensors`` hands bitsandbytes modules here).

* NF4 / FP4 codes index a 16-value look-up table and are scaled by a float32 absmax per block of the
  flattened weight: no integer-affine grid (GPTQ, AWQ, compressed-tensors int) or float element format
  (FP8, NVFP4, MXFP4) holds those values.
* LLM.int8 values are ``(q * SCB) * float32(1/127)``, two float32 roundings, which no single stored per-row
  scale reproduces for every code.
* Into bitsandbytes from another format would mean quantizing again, which changes the weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .bnb_weight import BnbInt8Weight, BnbWeight
from .canonical import ConversionError
from .enums import FORMAT
from .layouts import bnb
from .spec import Scheme


def refusal(scheme: Scheme, to: FORMAT) -> str:
    """Why ``scheme``'s weights cannot be written as ``to`` (a bitsandbytes layer to anything else, or the reverse)."""
    what = f"cannot convert {scheme.format.value} to {to.value}"
    if scheme.format is not FORMAT.BITSANDBYTES:
        return (f"{what}: bitsandbytes holds NF4/FP4 look-up-table codes or LLM.int8 rows, not {scheme.format.value}'s "
                "numbers; writing them there would mean quantizing again, which changes the weights")
    if scheme.bits == 8:
        return (f"{what} without loss: LLM.int8 values are (q * SCB) * float32(1/127), two float32 roundings, which "
                "no single per-row scale reproduces for every code")
    return (f"{what} without loss: {bnb.describe(scheme)} codes index a 16-value look-up table scaled by a float32 "
            "absmax per block of the flattened weight (non-affine), which no integer-affine grid or float element "
            f"format of {to.value} holds")


def difference(a: BnbWeight | BnbInt8Weight, b: BnbWeight | BnbInt8Weight) -> str | None:
    """The first field in which ``b`` differs from ``a`` (tensors bit for bit, other fields by value), or None."""
    if type(a) is not type(b):
        return f"{type(a).__name__} reads back as {type(b).__name__}"
    fields = {"codes": (a.codes, b.codes)}
    if isinstance(a, BnbInt8Weight):
        fields["SCB"] = (a.scb, b.scb)
    else:
        fields.update(absmax=(a.absmax, b.absmax), quant_map=(a.quant_map, b.quant_map))
        if (a.quant_type, a.blocksize, a.dtype, a.nested is None) != (b.quant_type, b.blocksize, b.dtype,
                                                                       b.nested is None):
            return "quant_type / blocksize / dtype / double quantization differ"
        if a.nested is not None:
            if (a.nested.blocksize, a.nested.offset) != (b.nested.blocksize, b.nested.offset):
                return "nested blocksize or offset differs"
            fields.update(nested_absmax=(a.nested.absmax, b.nested.absmax),
                          nested_quant_map=(a.nested.quant_map, b.nested.quant_map))
    for name, (x, y) in fields.items():
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            return f"{name} differs"
    return None


def convert_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme, to: FORMAT | str,
                    pack_dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], Scheme]:
    """A bitsandbytes module's tensors written again as bitsandbytes (decoded, re-encoded, decoded again and compared
    bit for bit; the weight bytes then match too, but for the pad nibble of an odd code count, which is written as
    bitsandbytes pads); raises ``ConversionError`` for every other pair of formats."""
    to = FORMAT(to)
    if scheme.format is not FORMAT.BITSANDBYTES or to is not FORMAT.BITSANDBYTES:
        raise ConversionError(refusal(scheme, to))
    if pack_dtype not in (None, torch.int8, torch.uint8):
        raise ConversionError(f"bitsandbytes stores its codes as bytes; pack_dtype {pack_dtype} does not apply")
    try:
        w = bnb.from_checkpoint(tensors, scheme)
        out = bnb.to_checkpoint(w, scheme)
    except ValueError as err:
        raise ConversionError(f"cannot write bitsandbytes: {err}") from None
    lost = difference(w, bnb.from_checkpoint(out, scheme))
    if lost is not None:
        raise ConversionError(f"cannot write bitsandbytes without loss: {lost}")
    if "bias" in tensors:
        out["bias"] = tensors["bias"]
    return out, scheme
