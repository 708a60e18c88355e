"""Inputs of torch's CPU int4pack kernels (formats.md 2.11), from the canonical form. Pure functions.

``_weight_int4pack_mm_for_cpu(x, packed, group_size, scales_and_zeros)`` computes
``scale * (code - 8) + zero_offset`` per weight, with ``packed = _convert_weight_to_int4pack_for_cpu(w, 1)``
for ``w [N, K]`` int32 codes. To reproduce ``s * (code - z)`` the offset is ``(2**(b-1) - z) * s``.
The op groups input rows as ``k // group_size``, so an act-order (desc_act) weight is first reordered
along K so that every group's rows are contiguous; the activations are gathered with the same index.
Calling the ops (and padding shapes the ops refuse) is the kernel's business, not this module's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..affine import AffineWeight

#: Group sizes ``_weight_int4pack_mm_for_cpu`` accepts (torch 2.13).
OP_GROUP_SIZES = (32, 64, 128, 256)


@dataclass(frozen=True, eq=False)
class Int4PackInputs:
    """``weight [N, K]`` int32 codes (K in ``ret_idx`` order), ``scales_and_zeros [G, N, 2]``, and ``ret_idx [K]``
    (int64: position ``p`` reads input channel ``ret_idx[p]``), or None when the order is already plain."""

    weight: torch.Tensor
    scales_and_zeros: torch.Tensor
    ret_idx: torch.Tensor | None


def reorder_index(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """``ret_idx``: position ``g*gs + r`` takes the input channel of rank ``r`` (ascending k) in group ``g``.

    None when ``g_idx`` is plain ``k // gs``. Raises unless every group but the last holds exactly ``gs``
    channels (what GPTQ's act-order produces): otherwise no contiguous grouping can exist.
    """
    g_idx = g_idx.detach().cpu().long()
    k = g_idx.numel()
    plain = torch.arange(k) // group_size
    if torch.equal(g_idx, plain):
        return None
    n_groups = max(int(g_idx.max()) + 1, -(-k // group_size))
    counts = torch.bincount(g_idx, minlength=n_groups)
    expected = torch.bincount(plain, minlength=n_groups)
    diff = (counts != expected).nonzero()
    if diff.numel():
        g = int(diff[0])
        raise ValueError(f"g_idx: group {g} holds {int(counts[g])} input channels, expected {int(expected[g])}: "
                         f"int4pack groups contiguous runs of {group_size} rows, so every group but the last "
                         f"must hold exactly {group_size}")
    return torch.argsort(g_idx, stable=True)


def zero_offsets(zeros_gn: torch.Tensor, scales_gn: torch.Tensor, bits: int,
                 dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(2**(b-1) - z) * s`` in ``dtype``, with ``s`` first rounded to ``dtype`` (as the reference does)."""
    s = scales_gn.to(dtype).float()
    return ((1 << (bits - 1)) - zeros_gn.float()).mul_(s).to(dtype)


def to_int4pack_inputs(q: AffineWeight, dtype: torch.dtype = torch.bfloat16) -> Int4PackInputs:
    """Codes, ``scales_and_zeros`` (``dtype``) and the K reorder for the CPU int4pack ops. 4-bit only."""
    if q.bits != 4:
        raise ValueError(f"bits: the int4pack ops hold 4-bit codes only, got {q.bits}-bit")
    ret_idx = reorder_index(q.g_idx, q.group_size)
    codes = q.codes.detach().cpu()
    if ret_idx is not None:
        codes = codes[:, ret_idx]
    scales_gn = q.scales.detach().cpu().t()
    szs = torch.stack([scales_gn.to(dtype), zero_offsets(q.zeros.detach().cpu().t(), scales_gn, q.bits, dtype)], 2)
    return Int4PackInputs(weight=codes.to(torch.int32).contiguous(), scales_and_zeros=szs.contiguous(),
                          ret_idx=ret_idx)


def int4pack_reasons(in_features: int, out_features: int, group_size: int) -> list[str]:
    """Why the CPU int4pack ops refuse this shape as it is (measured on torch 2.13); ``[]`` when they accept it."""
    out = []
    if group_size not in OP_GROUP_SIZES:
        out.append(f"group size {group_size} not accepted by _weight_int4pack_mm_for_cpu (takes 32, 64, 128, 256)")
    elif in_features % group_size:
        out.append(f"in_features {in_features} not a multiple of the group size {group_size}")
    if out_features % 16:
        out.append(f"out_features {out_features} not a multiple of 16 (_convert_weight_to_int4pack_for_cpu)")
    return out
