"""Triton helpers shared by the matmul and dequant bodies: group parameters, code fields, activations.

Codes become floats without an int-to-float conversion (slow on NVIDIA GPUs): OR-ing a code ``q < 2^23``
into the mantissa of ``2^23`` gives the float ``2^23 + q``; subtracting ``zm = 2^23 + z`` then yields
``q - z`` exactly, and one multiply by the scale rounds once, as a dense weight would.
"""

from __future__ import annotations

import triton
import triton.language as tl

MAGIC_BITS = 0x4B000000  # float32 2^23
MAGIC = 8388608.0


@triton.jit
def group_params(S, Z, rows, kb, offs_n, KW, G, NP, GS, PF: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, ZC: tl.constexpr, HAS_Z: tl.constexpr, ONE_GROUP: tl.constexpr):
    """Scale and ``2^23 + zero`` (float32) for the word rows ``rows`` of K step ``kb``; ``GS`` the group length.

    ``[1, BN]`` when the whole step lies in one group, else ``[BKW, BN]`` gathered per word row
    (a word's PF codes always share a group: group lengths are multiples of PF).
    """
    nmask = offs_n < NP
    if ONE_GROUP:
        g = (kb * BLOCK_K) // GS  # < G for every step that starts inside KP (KP <= G * GS)
        ok = nmask
        s = tl.load(S + g * NP + offs_n, mask=ok, other=0.0).to(tl.float32)[None, :]
        if HAS_Z:
            z = tl.load(Z + g * NP + offs_n, mask=ok, other=0).to(tl.float32)[None, :]
            zm = z + 8388608.0
        else:
            zm = tl.full([1, BLOCK_N], 8388608.0 + ZC, tl.float32)
    else:
        g = (rows * PF) // GS
        ok = ((rows < KW) & (g < G))[:, None] & nmask[None, :]
        off = g[:, None] * NP + offs_n[None, :]
        s = tl.load(S + off, mask=ok, other=0.0).to(tl.float32)
        if HAS_Z:
            zm = tl.load(Z + off, mask=ok, other=0).to(tl.float32) + 8388608.0
        else:
            zm = tl.full([1, BLOCK_N], 8388608.0 + ZC, tl.float32)
    return s, zm


@triton.jit
def load_words(W, rows, offs_n, KW, NP):
    """Packed words ``[BKW, BN]`` (rows along K, contiguous along N); out-of-range rows read 0."""
    mask = (rows < KW)[:, None] & (offs_n < NP)[None, :]
    return tl.load(W + rows[:, None] * NP + offs_n[None, :], mask=mask, other=0)


@triton.jit
def field(w, j: tl.constexpr, BITS: tl.constexpr):
    """Field ``j`` of every word as the float ``2^23 + code``."""
    q = ((w >> (j * BITS)) & ((1 << BITS) - 1)) | 0x4B000000
    return q.to(tl.float32, bitcast=True)


@triton.jit
def dequant3(w, s, zm, BITS: tl.constexpr, PF: tl.constexpr):
    """Words ``[BKW, BN]`` -> float32 weights ``[BKW, PF, BN]`` (row-major flatten = sorted K order)."""
    shifts = tl.arange(0, PF) * BITS
    q = ((w[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)) | 0x4B000000
    f = q.to(tl.float32, bitcast=True)
    return (f - zm[:, None, :]) * s[:, None, :]


@triton.jit
def load_x(X, offs_m, kk, M, K, KP, stride_xm, PERM, HAS_PERM: tl.constexpr):
    """Activations ``[BM, len(kk)]`` at sorted positions ``kk`` (gathered through PERM when act-order)."""
    if HAS_PERM:
        col = tl.load(PERM + kk, mask=kk < KP, other=-1)
        ok = col >= 0
    else:
        col = kk
        ok = kk < K
    ptr = X + offs_m[:, None] * stride_xm + col[None, :]
    return tl.load(ptr, mask=(offs_m < M)[:, None] & ok[None, :], other=0.0)


@triton.jit
def store_out(Y, BIAS, out, offs_m, offs_n, M, N, stride_ym, HAS_BIAS: tl.constexpr):
    """Add the bias in float32, cast to the output dtype and write the in-range elements."""
    if HAS_BIAS:
        out += tl.load(BIAS + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], out.to(Y.dtype.element_ty), mask=mask)
