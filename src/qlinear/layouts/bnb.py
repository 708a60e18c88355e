"""bitsandbytes checkpoint tensors (as transformers saves them) <-> ``BnbWeight`` / ``BnbInt8Weight``, both ways.

4-bit module ``m`` (``Linear4bit``; leaf names relative to ``m``):

* ``weight`` uint8 ``[(N*K + 1) // 2, 1]``: the codes of the flattened row-major ``[N, K]`` weight, two per byte,
  the FIRST in the HIGH nibble (an odd count pads the last low nibble with the code of 0.0: 7 for NF4, 0 for FP4);
* ``weight.absmax``: float32 ``[ceil(N*K / blocksize)]``, or uint8 codes of the same length with double
  quantization, then also ``weight.nested_absmax`` float32 ``[ceil(blocks / nested_blocksize)]`` and
  ``weight.nested_quant_map`` float32 ``[256]``;
* ``weight.quant_map`` float32 ``[16]`` (the code table) and ``weight.quant_state.bitsandbytes__<nf4|fp4>``,
  the JSON blob of ``bnb_state``.

8-bit module (``Linear8bitLt``): ``weight`` int8 ``[N, K]``, ``SCB`` float32 ``[N]`` and ``weight_format`` uint8
``[]`` (0: row-major, the only layout bitsandbytes still writes; written always, optional on read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from ..bnb_weight import BnbInt8Weight, BnbWeight, NestedAbsmax
from ..enums import FORMAT, METHOD
from ..spec import Scheme
from . import bnb_state
from .bnb_state import StateInfo, blob_name
from .tensors import check_against

NESTED_MAP_LEN = 256
#: The code of 0.0 in each table: what pads the last byte of an odd number of codes.
ZERO_CODE = {"nf4": 7, "fp4": 0}


def bnb_scheme(out_features: int, in_features: int, bnb_type: str, blocksize: int | None = None,
               double_quant: bool = False) -> Scheme:
    """A bitsandbytes layer's scheme. ``group_size`` is the blocksize where blocks are row groups (it divides K),
    else one group per row: the blocks are defined on the flattened weight and ``blocksize`` says how."""
    bits = 8 if bnb_type == "int8" else 4
    group = blocksize if blocksize is not None and in_features % blocksize == 0 else -1
    return Scheme(bits=bits, group_size=group, in_features=in_features, out_features=out_features,
                  method=METHOD.BITSANDBYTES, format=FORMAT.BITSANDBYTES, pack_dtype=torch.int8, bnb_type=bnb_type,
                  blocksize=blocksize, double_quant=double_quant)


def scheme_of(w: BnbWeight | BnbInt8Weight) -> Scheme:
    """The scheme a canonical weight implies."""
    if isinstance(w, BnbInt8Weight):
        return bnb_scheme(w.out_features, w.in_features, "int8")
    return bnb_scheme(w.out_features, w.in_features, w.quant_type, w.blocksize, w.nested is not None)


def describe(scheme: Scheme) -> str:
    """``nf4 blocksize 64, double-quantized absmax`` / ``int8 rows (LLM.int8)``, for messages and explain()."""
    if scheme.bits == 8:
        return "int8 rows (LLM.int8: int8 weight, float32 SCB per row)"
    dq = ", double-quantized absmax" if scheme.double_quant else ""
    return f"{scheme.bnb_type} blocksize {scheme.blocksize}{dq}"


def _check_scheme(scheme: Scheme) -> None:
    if scheme.format is not FORMAT.BITSANDBYTES or scheme.bnb_type is None:
        raise ValueError(f"scheme: {scheme.format.value} (bnb_type {scheme.bnb_type}) is not a bitsandbytes layout")


def tensor_names(scheme: Scheme) -> tuple[str, ...]:
    """The checkpoint leaves of one module, in the order bitsandbytes writes them (bias not included)."""
    _check_scheme(scheme)
    if scheme.bits == 8:
        return ("weight", "SCB", "weight_format")
    nested = ("weight.nested_absmax", "weight.nested_quant_map") if scheme.double_quant else ()
    return ("weight", "weight.absmax", "weight.quant_map", *nested, blob_name(scheme.bnb_type))


def num_blocks(scheme: Scheme) -> int:
    return -(-scheme.out_features * scheme.in_features // scheme.blocksize)


def checkpoint_shapes(scheme: Scheme, info: StateInfo | None = None,
                      blob_len: int = 0) -> dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]]:
    """Expected shape and dtype of every tensor of a module. ``info``: its parsed JSON (gives the nested block
    count; bitsandbytes' 256 without it); ``blob_len``: the blob's byte count (0 when not known yet)."""
    _check_scheme(scheme)
    n, k = scheme.out_features, scheme.in_features
    if scheme.bits == 8:
        return {"weight": ((n, k), (torch.int8,)), "SCB": ((n,), (torch.float32,)),
                "weight_format": ((), (torch.uint8,))}
    nb = num_blocks(scheme)
    out: dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]] = {
        "weight": (((n * k + 1) // 2, 1), (torch.uint8,)),
        "weight.absmax": ((nb,), (torch.uint8 if scheme.double_quant else torch.float32,)),
        "weight.quant_map": ((16,), (torch.float32,)),
    }
    if scheme.double_quant:
        nbs = info.nested_blocksize if info is not None and info.nested_blocksize else NESTED_MAP_LEN
        out["weight.nested_absmax"] = ((-(-nb // nbs),), (torch.float32,))
        out["weight.nested_quant_map"] = ((NESTED_MAP_LEN,), (torch.float32,))
    out[blob_name(scheme.bnb_type)] = ((blob_len,), (torch.uint8,))
    return out


def state_info(tensors: Mapping[str, torch.Tensor], scheme: Scheme, prefix: str = "") -> StateInfo:
    """Parse a 4-bit module's JSON blob and check it agrees with ``scheme`` (``prefix``: the module, for messages)."""
    name = blob_name(scheme.bnb_type)
    if name not in tensors:
        raise ValueError(f"{prefix}{name}: missing (a 4-bit {scheme.bnb_type} module keeps its quant_state there)")
    info = bnb_state.parse(tensors[name], prefix + name, scheme.bnb_type)
    want = (scheme.blocksize, (scheme.out_features, scheme.in_features), scheme.double_quant)
    got = (info.blocksize, info.shape, info.nested)
    if got != want:
        raise ValueError(f"{prefix}{name}: says blocksize {got[0]}, shape {list(got[1])}, double quant {got[2]}; "
                         f"the layer is blocksize {want[0]}, shape {list(want[1])}, double quant {want[2]}")
    return info


def pack_codes(codes: torch.Tensor, quant_type: str) -> torch.Tensor:
    """uint8 codes ``[N, K]`` -> bitsandbytes' ``[(N*K + 1) // 2, 1]`` bytes (first code in the high nibble; an odd
    count is padded with the code of 0.0, as bitsandbytes' quantizer pads)."""
    flat = codes.reshape(-1).to(torch.uint8)
    if flat.numel() % 2:
        flat = torch.cat((flat, flat.new_full((1,), ZERO_CODE[quant_type])))
    pairs = flat.view(-1, 2)
    return ((pairs[:, 0] << 4) | pairs[:, 1]).reshape(-1, 1)


def unpack_flat(packed: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Codes at flat positions ``start:stop`` of a packed weight (any shape; its bytes in order), uint8."""
    b = packed.reshape(-1)[start // 2:(stop + 1) // 2]
    both = torch.stack((b >> 4, b & 0xF), dim=-1).reshape(-1)
    lead = start % 2
    return both[lead:lead + stop - start]


def unpack_codes(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """bitsandbytes' packed bytes -> uint8 codes ``[N, K]``."""
    return unpack_flat(packed, 0, out_features * in_features).reshape(out_features, in_features).contiguous()


def check_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme, prefix: str = "") -> StateInfo | None:
    """Raise ``ValueError`` naming the tensor, the expected and the found shape/dtype; returns the parsed JSON."""
    what = f"bitsandbytes {describe(scheme)} N={scheme.out_features} K={scheme.in_features}"
    if scheme.bits == 8:
        expected = checkpoint_shapes(scheme)
        if "weight_format" not in tensors:
            expected.pop("weight_format")
        check_against(tensors, expected, what)
        fmt = tensors.get("weight_format")
        if fmt is not None and int(fmt) != 0:
            raise ValueError(f"{prefix}weight_format: {int(fmt)} (a tiled col32/turing/ampere layout of old "
                             "bitsandbytes); only 0, row-major, is read")
        return None
    info = state_info(tensors, scheme, prefix)
    blob = tensors[blob_name(scheme.bnb_type)]
    check_against(tensors, checkpoint_shapes(scheme, info, blob.numel()), what)
    return info


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> BnbWeight | BnbInt8Weight:
    """Decode one module's checkpoint tensors (leaf names, exactly as stored) into the canonical form."""
    info = check_tensors(tensors, scheme)
    if info is None:
        return BnbInt8Weight(codes=tensors["weight"].clone(), scb=tensors["SCB"].clone())
    nested = None
    if info.nested:
        nested = NestedAbsmax(quant_map=tensors["weight.nested_quant_map"].clone(),
                              absmax=tensors["weight.nested_absmax"].clone(), blocksize=info.nested_blocksize,
                              offset=info.nested_offset)
    return BnbWeight(codes=unpack_codes(tensors["weight"], *info.shape), quant_type=info.quant_type,
                     blocksize=info.blocksize, absmax=tensors["weight.absmax"].clone(),
                     quant_map=tensors["weight.quant_map"].clone(), dtype=info.dtype, nested=nested)


def to_checkpoint(w: BnbWeight | BnbInt8Weight, scheme: Scheme) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of ``w`` in ``scheme``'s layout (raises where they disagree)."""
    _check_scheme(scheme)
    # the stored codes are bytes whatever word the scheme names (the reference declares int8..int64 for these layers)
    if replace(scheme_of(w), pack_dtype=scheme.pack_dtype) != scheme:
        raise ValueError(f"weight: it is bitsandbytes {describe(scheme_of(w))} [{w.out_features}, {w.in_features}]; "
                         f"the layer is {describe(scheme)} [{scheme.out_features}, {scheme.in_features}]")
    if isinstance(w, BnbInt8Weight):
        return {"weight": w.codes.contiguous().clone(), "SCB": w.scb.contiguous().clone(),
                "weight_format": torch.tensor(0, dtype=torch.uint8)}
    info = StateInfo(w.quant_type, w.blocksize, w.dtype, (w.out_features, w.in_features),
                     None if w.nested is None else w.nested.blocksize, None if w.nested is None else w.nested.offset)
    out = {"weight": pack_codes(w.codes, w.quant_type), "weight.absmax": w.absmax.contiguous().clone(),
           "weight.quant_map": w.quant_map.contiguous().clone()}
    if w.nested is not None:
        out["weight.nested_absmax"] = w.nested.absmax.contiguous().clone()
        out["weight.nested_quant_map"] = w.nested.quant_map.contiguous().clone()
    out[blob_name(w.quant_type)] = bnb_state.serialize(info)
    return out
