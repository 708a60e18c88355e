"""Float-quantized checkpoint layouts (FP8, NVFP4, MXFP4) <-> ``FloatWeight``, bit-exactly both ways.

* ``fp8`` (GPTQModel): ``weight`` fp8 ``[N, K]``; ``weight_scale_inv`` float32, ``[]`` (tensor), ``[N]`` (row)
  or ``[N/br, K/bc]`` (block); ``w = value / scale_inv`` ("inverse" semantics).
* ``hf_fp8`` (transformers, DeepSeek-V3): ``weight`` fp8; ``weight_scale_inv`` float32 ``[ceil(N/bn),
  ceil(K/bk)]``; ``w = value * scale_inv``.
* ``float-quantized``, ``naive-quantized`` with fp8 codes (compressed-tensors): ``weight`` fp8; ``weight_scale``
  ``[1]`` (tensor), ``[N, 1]`` (channel), ``[N, K/g]`` (group) or the block grid; multiply.
* ``nvfp4-pack-quantized``: ``weight_packed`` uint8 ``[N, K/2]``; ``weight_scale`` E4M3 ``[N, K/16]``;
  ``weight_global_scale`` float32 ``[1]``; ``w = value * (scale / global)``.
* ``mxfp4-pack-quantized``: ``weight_packed``; ``weight_scale`` uint8 E8M0 ``[N, K/32]``; ``value * 2**(e-127)``.

FP4 bytes hold column ``2j`` in the low nibble. Asymmetric float weights (a ``weight_zero_point``) exist in
no producer's output and are refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..blockfloat import FloatWeight, ScaleRule, scale_grid
from ..enums import FORMAT
from ..floats import pack_nibbles, unpack_nibbles
from ..spec import Scheme
from .tensors import check_against

FP8_FORMATS = (FORMAT.FP8, FORMAT.HF_FP8, FORMAT.FLOAT_QUANTIZED, FORMAT.NAIVE_QUANTIZED)
FP4_FORMATS = (FORMAT.NVFP4_PACK_QUANTIZED, FORMAT.MXFP4_PACK_QUANTIZED)
FLOAT_LAYOUT_FORMATS = (*FP8_FORMATS, *FP4_FORMATS)
#: The block-scale dtypes each format may store (the first is what qlinear writes by default).
FLOAT_SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def block_of(scheme: Scheme) -> tuple[int, int]:
    """Rows x cols one scale covers (NVFP4 16 and MXFP4 32 columns of one row unless the scheme says more)."""
    if scheme.scale_block is not None:
        return scheme.scale_block
    return 1, scheme.group_size


def _is_tensor(scheme: Scheme) -> bool:
    return scheme.per_tensor_scale


def scale_name(scheme: Scheme) -> str:
    return "weight_scale_inv" if scheme.format in (FORMAT.FP8, FORMAT.HF_FP8) else "weight_scale"


def rule_of(scheme: Scheme) -> ScaleRule:
    return ScaleRule.DIVIDE if scheme.format is FORMAT.FP8 else ScaleRule.MULTIPLY


def scale_shape(scheme: Scheme) -> tuple[int, ...]:
    """The stored scale tensor's shape (see the table in the module docstring)."""
    n, k = scheme.out_features, scheme.in_features
    grid = scale_grid(n, k, block_of(scheme))
    if scheme.format is FORMAT.FP8:
        if _is_tensor(scheme):
            return ()
        if block_of(scheme) == (1, k):
            return (n,)
        return grid
    if scheme.format in (FORMAT.FLOAT_QUANTIZED, FORMAT.NAIVE_QUANTIZED) and _is_tensor(scheme):
        return (1,)
    return grid


def _scale_dtypes(scheme: Scheme) -> tuple[torch.dtype, ...]:
    if scheme.format is FORMAT.NVFP4_PACK_QUANTIZED:
        return (torch.float8_e4m3fn,)
    if scheme.format is FORMAT.MXFP4_PACK_QUANTIZED:
        return (torch.uint8,)
    if scheme.format in (FORMAT.FP8, FORMAT.HF_FP8):
        return (torch.float32,)
    return FLOAT_SCALE_DTYPES


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]]:
    """Expected shape and allowed dtypes of every weight tensor of a float-quantized module."""
    n, k = scheme.out_features, scheme.in_features
    if scheme.format not in FLOAT_LAYOUT_FORMATS or scheme.element is None:
        raise ValueError(f"scheme: {scheme.format.value} with element {scheme.element} is no float layout here")
    out: dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]] = {}
    if scheme.format in FP4_FORMATS:
        if k % 2:
            raise ValueError(f"in_features: FP4 packs two columns a byte; {k} is odd")
        out["weight_packed"] = ((n, k // 2), (torch.uint8,))
    else:
        out["weight"] = ((n, k), (scheme.element.torch_dtype,))
    out[scale_name(scheme)] = (scale_shape(scheme), _scale_dtypes(scheme))
    if scheme.format is FORMAT.NVFP4_PACK_QUANTIZED:
        out["weight_global_scale"] = ((1,), (torch.float32,))
    return out


def check_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> None:
    """Raise ``ValueError`` naming the tensor, the expected and the found shape/dtype."""
    if "weight_zero_point" in tensors:
        raise ValueError("weight_zero_point: asymmetric float weights are not a format any producer writes; refused")
    check_against(tensors, checkpoint_shapes(scheme), f"{scheme.format.value} {scheme.element.value} "
                  f"K={scheme.in_features} N={scheme.out_features} block {block_of(scheme)}")


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> FloatWeight:
    """Decode a float-quantized module's tensors (exactly as stored) into a ``FloatWeight``."""
    check_tensors(tensors, scheme)
    n, k = scheme.out_features, scheme.in_features
    if scheme.format in FP4_FORMATS:
        codes = unpack_nibbles(tensors["weight_packed"])
    else:
        codes = tensors["weight"].view(torch.uint8).clone()
    grid = scale_grid(n, k, block_of(scheme))
    scales = tensors[scale_name(scheme)].reshape(grid).clone()
    glob = tensors.get("weight_global_scale") if scheme.format is FORMAT.NVFP4_PACK_QUANTIZED else None
    return FloatWeight(codes=codes, element=scheme.element, scales=scales, block=block_of(scheme),
                       global_scale=None if glob is None else glob.clone(), rule=rule_of(scheme))


def to_checkpoint(w: FloatWeight, scheme: Scheme) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of ``w`` in ``scheme``'s format; raises where the format cannot hold it."""
    n, k = scheme.out_features, scheme.in_features
    what = f"{scheme.format.value} ({scheme.element.value if scheme.element else 'no element'})"
    if (w.out_features, w.in_features) != (n, k):
        raise ValueError(f"weight: expected [{n}, {k}], got [{w.out_features}, {w.in_features}]")
    if w.element is not scheme.element:
        raise ValueError(f"element: {what} holds {scheme.element}, the weight is {w.element.value}")
    if w.block != block_of(scheme):
        raise ValueError(f"block: {what} here has scale blocks {block_of(scheme)}, the weight {w.block}")
    if w.rule is not rule_of(scheme):
        raise ValueError(f"scale rule: {what} stores scales that {rule_of(scheme).value}; the weight's "
                         f"{w.rule.value} (the reciprocal is not exact in general)")
    if (w.global_scale is not None) != (scheme.format is FORMAT.NVFP4_PACK_QUANTIZED):
        raise ValueError(f"global_scale: {what} {'needs' if w.global_scale is None else 'has no place for'} one")
    dtypes = _scale_dtypes(scheme)
    if w.scales.dtype not in dtypes:
        raise ValueError(f"scales: {what} stores them as {' or '.join(map(str, dtypes))}, the weight's are "
                         f"{w.scales.dtype}")
    out: dict[str, torch.Tensor] = {}
    if scheme.format in FP4_FORMATS:
        out["weight_packed"] = pack_nibbles(w.codes)
    else:
        out["weight"] = w.codes.contiguous().view(scheme.element.torch_dtype).clone()
    out[scale_name(scheme)] = w.scales.reshape(scale_shape(scheme)).clone()
    if w.global_scale is not None:
        out["weight_global_scale"] = w.global_scale.to(torch.float32).reshape(1).clone()
    return out
