"""Triton helpers shared by the matmul and dequant bodies: positions, group parameters, fields, activations.

Codes become floats without an int-to-float conversion (slow on NVIDIA GPUs): OR-ing a code ``q < 2^23``
into the mantissa of ``2^23`` gives the float ``2^23 + q``; subtracting ``2^23 + z`` then yields ``q - z``
exactly, and one multiply by the scale rounds once, as a dense weight would. See ``layout.py`` for the
field-blocked word order (``kpos``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def kpos(j, rows, R: tl.constexpr, PF: tl.constexpr):
    """Sorted input position of field ``j`` of word rows ``rows`` (field-blocked words, R rows a block)."""
    return (rows // R) * (R * PF) + j * R + rows % R


@triton.jit
def group_params(S, Z, rows, row0, offs_n, G, NP, GS, PF: tl.constexpr, R: tl.constexpr,
                 BLOCK_N: tl.constexpr, ZC: tl.constexpr, HAS_Z: tl.constexpr, ONE_GROUP: tl.constexpr,
                 EVEN_N: tl.constexpr):
    """Scale and zero point (float32) of word rows ``rows`` (first one ``row0``); ``GS`` the group length.

    ``[1, BN]`` when the step lies in one group, else ``[BKW, BN]`` gathered per word row (a word's
    fields always share a group). Columns are loaded at most 4 contiguous per vector: scales and zeros
    then come in the words' own layout (4 columns per 16-byte word vector) and never move between threads.
    """
    nmask = (offs_n < NP) | EVEN_N
    cols = tl.max_contiguous(offs_n, 4)
    if ONE_GROUP:
        g = kpos(0, row0, R, PF) // GS
        ok = nmask[None, :]
        s = tl.load(S + g * NP + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(Z + g * NP + cols[None, :], mask=ok, other=0).to(tl.float32)
        else:
            z = tl.full([1, BLOCK_N], ZC, tl.float32)
    else:
        g = kpos(0, rows, R, PF) // GS
        ok = (g < G)[:, None] & nmask[None, :]
        off = g[:, None] * NP + cols[None, :]
        s = tl.load(S + off, mask=ok, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(Z + off, mask=ok, other=0).to(tl.float32)
        else:
            z = tl.full([1, BLOCK_N], ZC, tl.float32)
    return s, z


@triton.jit
def load_words(W, rows, offs_n, KW, NP, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Packed words ``[BKW, BN]`` (rows along K, contiguous along N); out-of-range rows read 0."""
    ptr = W + rows[:, None] * NP + offs_n[None, :]
    if EVEN_K and EVEN_N:
        return tl.load(ptr)
    mask = ((rows < KW) | EVEN_K)[:, None] & ((offs_n < NP) | EVEN_N)[None, :]
    return tl.load(ptr, mask=mask, other=0)


@triton.jit
def gemv_term(lo, hi, z, j: tl.constexpr, BITS: tl.constexpr, HALF: tl.constexpr):
    """``q - z`` (float32, exact) of field ``j`` of every word.

    ``lo``/``hi`` are the word's low/high 16 bits OR-ed into the float 2^23 (once per word). Field
    ``i`` of a half, masked in place (one LOP3), reads ``2^23 + q * 2^(BITS*i)``; one FMA by
    ``2^-(BITS*i)`` minus ``2^(23-BITS*i) + z`` leaves ``q - z`` exactly.
    """
    i: tl.constexpr = j % HALF
    half = lo if j < HALF else hi
    f = (half & ((((1 << BITS) - 1) << (BITS * i)) | 0x4B000000)).to(tl.float32, bitcast=True)
    c: tl.constexpr = 1.0 / (1 << (BITS * i))
    return tl.fma(f, c, -(z + 8388608.0 * c))


@triton.jit
def dequant3(w, s, z, BITS: tl.constexpr, PF: tl.constexpr):
    """Words ``[BKW, BN]`` -> float32 weights ``[PF, BKW, BN]``; flattened, row ``i`` is field
    ``i // BKW`` of word row ``i % BKW`` (the field-blocked order, see ``kpos``)."""
    shifts = tl.arange(0, PF) * BITS
    q = ((w[None, :, :] >> shifts[:, None, None]) & ((1 << BITS) - 1)) | 0x4B000000
    f = q.to(tl.float32, bitcast=True)
    return (f - (z + 8388608.0)[None, :, :]) * s[None, :, :]


@triton.jit
def tile_kpos(row0, BLOCK_K: tl.constexpr, BKW: tl.constexpr, R: tl.constexpr, PF: tl.constexpr):
    """Sorted positions of the ``BLOCK_K`` rows of a dequantized tile starting at word row ``row0``."""
    i = tl.arange(0, BLOCK_K)
    return kpos(i // BKW, row0 + i % BKW, R, PF)


@triton.jit
def load_x(X, offs_m, kk, M, K, KP, stride_xm, PERM, HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """Activations ``[BM, len(kk)]`` at sorted positions ``kk`` (gathered through PERM when act-order)."""
    if HAS_PERM:
        col = tl.load(PERM + kk, mask=kk < KP, other=-1)
        ok = col >= 0
    else:
        col = kk
        ok = (kk < K) | EVEN_K
    ptr = X + offs_m[:, None] * stride_xm + col[None, :]
    return tl.load(ptr, mask=(offs_m < M)[:, None] & ok[None, :], other=0.0)


@triton.jit
def load_x1(X, m, kk, K, KP, stride_xm, PERM, HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """Activations of row ``m < M`` at sorted positions ``kk``, as float32 (1-D: no 3-D layouts)."""
    if HAS_PERM:
        col = tl.load(PERM + kk, mask=kk < KP, other=-1)
        x = tl.load(X + m * stride_xm + col, mask=col >= 0, other=0.0)
    elif EVEN_K:
        x = tl.load(X + m * stride_xm + kk)
    else:
        x = tl.load(X + m * stride_xm + kk, mask=kk < K, other=0.0)
    return x.to(tl.float32)


@triton.jit
def store_out(Y, BIAS, out, offs_m, offs_n, M, N, stride_ym, HAS_BIAS: tl.constexpr):
    """Add the bias in float32, cast to the output dtype and write the in-range elements."""
    if HAS_BIAS:
        out += tl.load(BIAS + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], out.to(Y.dtype.element_ty), mask=mask)
