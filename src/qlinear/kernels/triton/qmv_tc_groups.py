"""gemv_tc's group terms: per group, ``s (C - (m + z) Cx) (+ o Cx)`` added to the accumulators of both C tiles
(and both row sets), with the group's scale, zero, offset and K-quant super-scales loaded either at each C
fragment's columns or once per lane as a 4-column vector moved to both tiles' fragments in registers
(``vector_params``). The C fragment layout is described in ``qmv_tc.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import SUPER_GROUPS


@triton.jit
def _term(s, zm, o, c, cx, SUBZ: tl.constexpr, HAS_OFF: tl.constexpr):
    """``s (C - (m + z) Cx) (+ o Cx)``, or ``s C (+ o Cx)`` when the MMA already took ``q - z``."""
    out = s * c if SUBZ else s * (c - zm * cx)
    if HAS_OFF:
        out += o * cx
    return out


@triton.jit
def _group_term(S, Z, OFF, SUP, grp, NP, ccol, nmask, c, cx, ZC: tl.constexpr, MAGIC: tl.constexpr,
                HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr, SUBZ: tl.constexpr):
    """A tile's contribution of one step: ``s (C - (m + z) Cx) (+ o Cx)`` with the group's parameters
    (``s C (+ o Cx)`` when the MMA already took ``q - z``; ``HAS_SUP``: ``s``, ``o`` times the super-group's
    pair, as ``common.load_group``)."""
    s = tl.load(S + grp * NP + ccol, mask=nmask, other=0.0).to(tl.float32)
    sup = (grp // SUPER_GROUPS) * (2 * NP) + ccol
    if HAS_SUP:
        s = s * tl.load(SUP + sup, mask=nmask, other=0.0)
    zm = ZC + MAGIC
    if HAS_Z and not SUBZ:
        zm = tl.load(Z + grp * NP + ccol, mask=nmask, other=0).to(tl.float32) + MAGIC
    o = 0.0
    if HAS_OFF:
        o = tl.load(OFF + grp * NP + ccol, mask=nmask, other=0.0).to(tl.float32)
        if HAS_SUP:
            o = o * tl.load(SUP + sup + NP, mask=nmask, other=0.0)
    return _term(s, zm, o, c, cx, SUBZ, HAS_OFF)


@triton.jit
def _tile_pairs(v, L: tl.constexpr):
    """``[L, 4]`` values of the lane's 4 word columns -> tile 0's ``(v0, v0, v1, v1)`` and tile 1's
    ``(v2, v2, v3, v3)`` (the C fragments' columns), moved within the thread."""
    w = tl.permute(tl.reshape(v, (L, 2, 2)), (0, 2, 1))  # [l, h, i] = v[l, 2 i + h]
    a, b = tl.split(w)
    return tl.reshape(tl.join(a, a), (L, 4)), tl.reshape(tl.join(b, b), (L, 4))


@triton.jit
def _lane_params(P, off, nmask, L: tl.constexpr):
    """One vector load of the group's parameter at the lane's 4 columns, as both tiles' fragments (float32)."""
    return _tile_pairs(tl.load(P + off, mask=nmask, other=0).to(tl.float32), L)


@triton.jit
def _add_terms_vec(acc0, acc1, acc2, acc3, c0, c1, cx, e0, e1, ex, S, Z, OFF, SUP, grp, NP, cols, nmask,
                   ZC: tl.constexpr, MAGIC: tl.constexpr, HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr,
                   HAS_SUP: tl.constexpr, SUBZ: tl.constexpr, NB: tl.constexpr, L: tl.constexpr):
    """As ``_add_terms``, each parameter loaded once per lane (4 columns, one vector) for both tiles and row
    sets."""
    off = grp * NP + cols
    s0, s1 = _lane_params(S, off, nmask, L)
    sup = (grp // SUPER_GROUPS) * (2 * NP) + cols
    if HAS_SUP:
        d0, d1 = _lane_params(SUP, sup, nmask, L)
        s0, s1 = s0 * d0, s1 * d1
    zm0 = ZC + MAGIC
    zm1 = ZC + MAGIC
    if HAS_Z and not SUBZ:
        zm0, zm1 = _lane_params(Z, off, nmask, L)
        zm0, zm1 = zm0 + MAGIC, zm1 + MAGIC
    o0 = 0.0
    o1 = 0.0
    if HAS_OFF:
        o0, o1 = _lane_params(OFF, off, nmask, L)
        if HAS_SUP:
            m0, m1 = _lane_params(SUP, sup + NP, nmask, L)
            o0, o1 = o0 * m0, o1 * m1
    acc0 += _term(s0, zm0, o0, c0, cx, SUBZ, HAS_OFF)
    acc1 += _term(s1, zm1, o1, c1, cx, SUBZ, HAS_OFF)
    if NB == 2:
        acc2 += _term(s0, zm0, o0, e0, ex, SUBZ, HAS_OFF)
        acc3 += _term(s1, zm1, o1, e1, ex, SUBZ, HAS_OFF)
    return acc0, acc1, acc2, acc3


@triton.jit
def _add_terms(acc0, acc1, acc2, acc3, c0, c1, cx, e0, e1, ex, S, Z, OFF, SUP, grp, NP, ccol, nmask0, nmask1,
               ZC: tl.constexpr, MAGIC: tl.constexpr, HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr,
               HAS_SUP: tl.constexpr, SUBZ: tl.constexpr, NB: tl.constexpr):
    """The accumulators plus group ``grp``'s terms of both tiles (and of the second row set)."""
    acc0 += _group_term(S, Z, OFF, SUP, grp, NP, ccol, nmask0, c0, cx, ZC, MAGIC, HAS_Z, HAS_OFF, HAS_SUP, SUBZ)
    acc1 += _group_term(S, Z, OFF, SUP, grp, NP, ccol + 2, nmask1, c1, cx, ZC, MAGIC, HAS_Z, HAS_OFF, HAS_SUP, SUBZ)
    if NB == 2:
        acc2 += _group_term(S, Z, OFF, SUP, grp, NP, ccol, nmask0, e0, ex, ZC, MAGIC, HAS_Z, HAS_OFF, HAS_SUP, SUBZ)
        acc3 += _group_term(S, Z, OFF, SUP, grp, NP, ccol + 2, nmask1, e1, ex, ZC, MAGIC, HAS_Z, HAS_OFF, HAS_SUP,
                            SUBZ)
    return acc0, acc1, acc2, acc3


@triton.jit
def group_terms(acc0, acc1, acc2, acc3, c0, c1, cx, e0, e1, ex, S, Z, OFF, SUP, grp, NP, cols, ccol, nmask,
                 nmask0, nmask1, ZC: tl.constexpr, MAGIC: tl.constexpr, HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr,
                 HAS_SUP: tl.constexpr, SUBZ: tl.constexpr, NB: tl.constexpr, L: tl.constexpr,
                 VEC_PARAMS: tl.constexpr):
    """Group ``grp``'s terms added, its parameters loaded per lane (``VEC_PARAMS``) or per fragment."""
    if VEC_PARAMS:
        return _add_terms_vec(acc0, acc1, acc2, acc3, c0, c1, cx, e0, e1, ex, S, Z, OFF, SUP, grp, NP, cols, nmask,
                              ZC, MAGIC, HAS_Z, HAS_OFF, HAS_SUP, SUBZ, NB, L)
    return _add_terms(acc0, acc1, acc2, acc3, c0, c1, cx, e0, e1, ex, S, Z, OFF, SUP, grp, NP, ccol, nmask0, nmask1,
                      ZC, MAGIC, HAS_Z, HAS_OFF, HAS_SUP, SUBZ, NB)
