"""ExLlamaV2's runtime layout for 4-bit GPTQ / AWQ weights (what ``make_q_matrix`` prepares on load).

Facts from exllamav2 0.3.2 ``exllamav2_ext/cuda/q_matrix.cu`` and GPTQModel 7.7.0's vendored copy
(``gptqmodel_ext/exllamav2``):

* act-order (``g_idx`` not all zero): ``make_sequential`` sorts the input rows by group, stably (a group
  histogram, prefix offsets, rows placed in input order). ``q_perm[i]`` is the input row stored at
  sorted row ``i``; ``q_invperm`` its inverse; both uint16 (int16 here). The codes are moved row by row.
* the kernel then reads group ``k // gs`` for sorted row ``k``, ``gs`` the smallest power of two with
  ``gs * groups >= K``; a ``g_idx`` whose sorted groups do not fall in such runs is refused here (the
  extension would silently mis-scale it).
* each int32 word of 8 codes is shuffled from nibbles ``0..7`` to ``0 2 4 6 1 3 5 7`` (``shuffle_4bit_8``).
* a weight is ``half(scale) * half(q - z)`` rounded to float16 (``dequant_4bit_8_gptq`` then ``__hmul2``),
  with ``z`` the true zero point read from ``qzeros`` words (GPTQModel's copy masks ``z & 0xf``; upstream
  exllamav2 reads GPTQ v1 words and adds 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..affine import AffineWeight
from .bitpack import pack_bits, unpack_bits

#: Word nibble order after ``shuffle_4bit_8``: slot ``j`` of a shuffled word holds code ``SHUFFLE[j]``.
SHUFFLE = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class ExV2Runtime:
    """The tensors ExLlamaV2's GPTQ path keeps per layer, on the layer's device.

    ``qweight [K/8, N]`` int32 (rows sorted by group, words shuffled), ``q_perm``/``q_invperm [K]`` int16 or
    None (no act-order), ``qzeros [G, N/8]`` int32 (true 4-bit zero points), ``scales [G, N]`` float16.
    """

    qweight: torch.Tensor
    q_perm: torch.Tensor | None
    q_invperm: torch.Tensor | None
    qzeros: torch.Tensor
    scales: torch.Tensor
    group_size: int


def sequential_perm(g_idx: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_perm, q_invperm)`` as int64, the order ``make_sequential`` gives: rows sorted by group, stable."""
    g = g_idx.to(torch.int64).cpu()
    if g.numel() and (int(g.min()) < 0 or int(g.max()) >= groups):
        raise ValueError(f"g_idx: expected groups in 0..{groups - 1}, found {int(g.min())}..{int(g.max())}")
    if g.numel() > 65536:
        raise ValueError(f"g_idx: {g.numel()} input rows do not fit exllamav2's uint16 q_perm (at most 65536)")
    q_perm = torch.sort(g, stable=True).indices
    return q_perm, torch.argsort(q_perm)


def kernel_group_size(in_features: int, groups: int) -> int:
    """The group length the extension derives: the smallest power of two ``gs`` with ``gs * groups >= K``."""
    gs = 1
    while gs * groups < in_features:
        gs *= 2
    return gs


def shuffle(words: torch.Tensor) -> torch.Tensor:
    """``shuffle_4bit_8`` on every int32 word: nibble slot ``j`` takes code ``SHUFFLE[j]``."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(w)
    for slot, code in enumerate(SHUFFLE):
        out |= ((w >> (4 * code)) & 0xF) << (4 * slot)
    return _int32(out)


def unshuffle(words: torch.Tensor) -> torch.Tensor:
    """The inverse of ``shuffle``."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(w)
    for slot, code in enumerate(SHUFFLE):
        out |= ((w >> (4 * slot)) & 0xF) << (4 * code)
    return _int32(out)


def _int32(w: torch.Tensor) -> torch.Tensor:
    return torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32)


def build(q: AffineWeight, reorder: bool = True) -> ExV2Runtime:
    """The runtime layout of a 4-bit affine weight, as ``make_q_matrix`` leaves it (on CPU).

    ``reorder=False``: GPTQModel's AWQ path, which hands the extension no ``g_idx`` (so no ``q_perm``); its groups
    must then already be the contiguous runs the kernel reads."""
    if q.bits != 4:
        raise ValueError(f"weight: exllamav2's GPTQ path is 4-bit only, got {q.bits}-bit codes")
    n, k = q.codes.shape
    for name, v in (("in_features", k), ("out_features", n)):
        if v % 32:
            raise ValueError(f"{name}: {v} is not a multiple of 32 (exllamav2 reads whole 32-row blocks)")
    groups = q.num_groups
    gs = kernel_group_size(k, groups)
    codes = q.codes.t()  # [K, N]
    act_order = bool((q.g_idx != 0).any())
    q_perm = q_invperm = None
    if not reorder:
        expected = torch.arange(k) // gs
        if not torch.equal(q.g_idx.to(torch.int64), expected):
            raise ValueError(f"g_idx: this path keeps input order and reads group k // {gs} at row k; the weight's "
                             "groups differ (act-order or uneven groups)")
    elif act_order:
        perm, inv = sequential_perm(q.g_idx, groups)
        sorted_groups = q.g_idx.to(torch.int64)[perm]
        expected = torch.arange(k) // gs
        if not torch.equal(sorted_groups, expected):
            bad = int((sorted_groups != expected).nonzero()[0, 0])
            raise ValueError(f"g_idx: exllamav2 reads group k // {gs} at sorted row k; sorted row {bad} is in group "
                             f"{int(sorted_groups[bad])}, not {int(expected[bad])} (groups of unequal size)")
        codes = codes[perm]
        q_perm, q_invperm = perm.to(torch.int16), inv.to(torch.int16)
    elif groups != 1:  # ext.py: an all-zero g_idx is not handed over, so every row reads group 0
        raise ValueError(f"g_idx: all zero but the weight has {groups} groups")
    qweight = shuffle(pack_bits(codes.contiguous(), 4, torch.int32, dim=0))
    zeros = pack_bits(q.zeros.t().to(torch.uint8).contiguous(), 4, torch.int32, dim=1)
    scales = q.scales.t().to(torch.float16).contiguous()
    return ExV2Runtime(qweight, q_perm, q_invperm, zeros, scales, gs)


def decode_cols(rt: ExV2Runtime, n0: int, n1: int) -> torch.Tensor:
    """Weights ``[K, n1 - n0]`` float16 of output columns ``n0:n1`` in SORTED row order, exactly as
    ``reconstruct_gptq_kernel`` writes them: ``half(scale * half(q - z))``."""
    k = rt.qweight.shape[0] * 8
    codes = unpack_bits(unshuffle(rt.qweight[:, n0:n1]), 4, k, dim=0).to(torch.float32)
    zeros = unpack_bits(rt.qzeros, 4, rt.qzeros.shape[1] * 8, dim=1)[:, n0:n1].to(torch.float32)
    scales = rt.scales[:, n0:n1].to(torch.float32)
    g = torch.arange(k, device=codes.device) // rt.group_size
    return ((codes - zeros[g]) * scales[g]).to(torch.float16)  # exact product in float32, one rounding


def dequantize(rt: ExV2Runtime) -> torch.Tensor:
    """The float16 weight ``[N, K]`` in input order (row ``q_perm[i]`` of the input is sorted row ``i``)."""
    w = decode_cols(rt, 0, rt.qweight.shape[1])
    if rt.q_invperm is not None:
        w = w[rt.q_invperm.to(torch.int64) & 0xFFFF]
    return w.t().contiguous()
