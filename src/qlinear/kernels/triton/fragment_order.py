"""x in the wgmma A fragment's order for gemm5 over groups of 32, and what that path takes (no Gluon imports).

``fragment.py`` says why: field ``j`` of word row ``r`` of a 64-row fragment block is read as input position
``8 j + r``, while groups of 32 store it at sorted row ``32 (r // 4) + 4 j + r % 4``; gathering x once into
the first order lets the kernel run on the words as they are. ``gemm4_limits`` asks ``groups_reasons`` on
machines without Gluon, so nothing here imports it.
"""

from __future__ import annotations

import torch

from .layout import Packed

#: sorted rows a fragment block spans (8 word rows of 8 fields) and a group-32 field block (4 word rows)
FRAGMENT_ROWS = 64
GROUP = 32
#: K-quant super-block: every K step must lie inside one (``layout.SUPER_GROUPS`` groups of 32)
SUPER_ROWS = 256
#: the largest K step over groups of 32 (``block_k_groups``)
MAX_BLOCK_K = 128
#: the largest M gemm5 serves over groups of 32: on an H100 (results/h100-gemm5_g32-2026-12-06.md) it beat dense
#: at M=1024 on 4096x14336 and 14336x4096 (188 / 196 us against 223 / 201) and lost at 4096 by 9-18 %
MAX_M = 1024


def fragment_input(x2: torch.Tensor, p: Packed) -> tuple[torch.Tensor, int]:
    """``(x [M, KF] in fragment order, KF)`` through the layout's ``xorder``: one gather launch (padding rows inside
    KP, from irregular groups or K not a multiple of 32, read 0)."""
    if p.xorder is None:
        raise ValueError("fragment_input: expected a layout of 4-bit words in groups of 32 (with an xorder)")
    m, k = x2.shape
    if p.perm is None and k == p.kp and k % FRAGMENT_ROWS == 0:
        # plain order: position 64 c + 8 j + 4 b + w reads row 64 c + 32 b + 4 j + w, a transpose of two axes;
        # one strided copy (index_select along dim 1 took 9.9 us at M=16 on an H100, results/h100-gemm5-*)
        return x2.reshape(m, k // FRAGMENT_ROWS, 2, 8, 4).transpose(2, 3).reshape(m, k), k
    from .gather import gather  # triton: this module answers groups_reasons where triton is absent

    return gather(x2 if x2.stride(1) == 1 else x2.contiguous(), p.xorder), p.xorder.numel()


def block_k_groups(p: Packed, block_k: int) -> int:
    """The K step over groups of 32: one or two fragment blocks. Four groups a step at most: the group rows
    arrive as one ``[NG, BN]`` TMA box in the 128-byte swizzle, and Gluon cannot slice a row out of an 8-row
    swizzle pattern (bk = 256 failed to compile on the H100, 2026-12-06); a K-quant super-block (256) then
    always holds a step."""
    return max(FRAGMENT_ROWS, min(MAX_BLOCK_K, block_k) // FRAGMENT_ROWS * FRAGMENT_ROWS)


def block_k_bytes(p: Packed, block_k: int) -> int:
    """gemm5's K step over 8-bit words: whole 64-code steps (two 32-code field blocks), four groups of 32 at most
    (as ``block_k_groups``), else dividing the group so each step reads one scale row."""
    bk = max(FRAGMENT_ROWS, block_k // FRAGMENT_ROWS * FRAGMENT_ROWS)
    if p.group == GROUP:
        return min(bk, MAX_BLOCK_K)
    while bk > FRAGMENT_ROWS and p.group % bk:
        bk -= FRAGMENT_ROWS
    return bk


def groups_reasons(p: Packed, m: int) -> list[str]:
    """Why gemm5 cannot take these words for M rows ([] when it can: 4-bit in 8-row field blocks, or in 4-row ones
    over groups of exactly 32 up to ``MAX_M``; 8-bit in 8-row field blocks over groups of 32 or of a multiple of 64;
    additive offsets on either)."""
    if p.bits == 8:
        if p.rows_per_block != 8 or (p.group != GROUP and p.group % FRAGMENT_ROWS):
            return [f"8-bit field blocks of {p.rows_per_block} word rows in groups of {p.group} (gemm5 takes 8 "
                    f"word rows in groups of {GROUP} or of a multiple of {FRAGMENT_ROWS})"]
        return []
    if p.rows_per_block == 8:
        return []
    if p.rows_per_block != 4 or p.group != GROUP:
        return [f"field blocks of {p.rows_per_block} word rows in groups of {p.group} (the A-fragment layout "
                f"takes 8, or 4 in groups of exactly {GROUP} through x in fragment order)"]
    if m > MAX_M:
        return [f"M={m} > {MAX_M} over groups of {GROUP} (dense measured faster at M=4096 on GPTQ g32, "
                "results/h100-gemm5_g32-2026-12-06.md)"]
    return []
