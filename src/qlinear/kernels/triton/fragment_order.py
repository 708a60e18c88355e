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


def fragment_input(x2: torch.Tensor, p: Packed) -> tuple[torch.Tensor, int]:
    """``(x [M, KF] in fragment order, KF)`` through the layout's ``xorder``: one ``index_select``; padding rows
    inside KP (irregular groups, K not a multiple of 32) are zeroed after it."""
    if p.xorder is None:
        raise ValueError("fragment_input: expected a layout of 4-bit words in groups of 32 (with an xorder)")
    if p.kp == p.k:
        return x2.index_select(1, p.xorder), p.xorder.numel()
    xf = x2.index_select(1, p.xorder.clamp(min=0))
    xf.masked_fill_((p.xorder < 0)[None, :], 0)
    return xf, p.xorder.numel()


def block_k_groups(p: Packed, block_k: int) -> int:
    """The K step over groups of 32: whole fragment blocks, inside one K-quant super-block."""
    bk = max(FRAGMENT_ROWS, block_k // FRAGMENT_ROWS * FRAGMENT_ROWS)
    return min(bk, SUPER_ROWS) if p.supers is not None else bk


def groups_reasons(p: Packed) -> list[str]:
    """Why gemm5 cannot take these field blocks ([] when it can: 8 word rows, or 4 in groups of exactly 32)."""
    if p.rows_per_block == 8 or (p.rows_per_block == 4 and p.group == GROUP):
        return []
    return [f"field blocks of {p.rows_per_block} word rows in groups of {p.group} (the A-fragment layout takes "
            f"8, or 4 in groups of exactly {GROUP} through x in fragment order)"]
