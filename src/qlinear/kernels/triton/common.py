"""Triton helpers shared by the matmul and dequant bodies: positions, group parameters, fields, activations.

Codes become floats without an int-to-float conversion (slow on NVIDIA GPUs): OR-ing a code ``q < 2^23``
into the mantissa of ``2^23`` gives the float ``2^23 + q``; subtracting ``2^23 + z`` then yields ``q - z``
exactly, and one multiply by the scale rounds once, as a dense weight would. See ``layout.py`` for the
field-blocked word order (``kpos``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .layout import SUPER_GROUPS as _SUPER_GROUPS


@triton.jit
def kpos(j, rows, R: tl.constexpr, PF: tl.constexpr):
    """Sorted input position of field ``j`` of word rows ``rows`` (field-blocked words, R rows a block)."""
    return (rows // R) * (R * PF) + j * R + rows % R


#: groups per super-scale pair (``layout.SUPER_GROUPS``), as a compile-time value for the kernels
SUPER_GROUPS = tl.constexpr(_SUPER_GROUPS)


@triton.jit
def load_group(S, Z, OFF, SUP, g, cols, NP, ok, BLOCK_N: tl.constexpr, ZC: tl.constexpr, HAS_Z: tl.constexpr,
               HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr):
    """Scale, zero point and offset (float32) of groups ``g`` at columns ``cols`` of the ``[G, NP]`` tensors; the
    zero is the constant ``ZC`` without a zeros tensor, the offset 0 without ``HAS_OFF``. ``HAS_SUP``: the
    scales and offsets are small integers (uint8) times their super-group's float32 pair in ``SUP``
    (``[2 ceil(G / 8), NP]``: rows ``d``, ``-dmin`` per super-group), products exact in float32."""
    off = g * NP + cols
    s = tl.load(S + off, mask=ok, other=0.0).to(tl.float32)
    if HAS_Z:  # noqa: SIM108 (constexpr branch)
        z = tl.load(Z + off, mask=ok, other=0).to(tl.float32)
    else:
        z = tl.full([1, BLOCK_N], ZC, tl.float32)
    if HAS_OFF:  # noqa: SIM108 (constexpr branch)
        o = tl.load(OFF + off, mask=ok, other=0.0).to(tl.float32)
    else:
        o = tl.zeros([1, BLOCK_N], tl.float32)
    if HAS_SUP:
        sup = (g // SUPER_GROUPS) * (2 * NP) + cols
        s = s * tl.load(SUP + sup, mask=ok, other=0.0)
        o = o * tl.load(SUP + sup + NP, mask=ok, other=0.0)
    return s, z, o


@triton.jit
def group_params(S, Z, OFF, SUP, rows, row0, offs_n, G, NP, GS, PF: tl.constexpr, R: tl.constexpr,
                 BLOCK_N: tl.constexpr, ZC: tl.constexpr, HAS_Z: tl.constexpr, ONE_GROUP: tl.constexpr,
                 EVEN_N: tl.constexpr, HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr):
    """Scale, zero point and additive offset (float32) of word rows ``rows`` (first one ``row0``).

    ``[1, BN]`` when the step lies in one group, else ``[BKW, BN]`` gathered per word row (a word's
    fields always share a group). Columns are loaded at most 4 contiguous per vector: scales and zeros
    then come in the words' own layout (4 columns per 16-byte word vector) and never move between threads.
    The offset ``o`` (weights ``s * q + o``, GGUF's float minimums) is 0 unless ``HAS_OFF``.
    """
    nmask = (offs_n < NP) | EVEN_N
    cols = tl.max_contiguous(offs_n, 4)
    if ONE_GROUP:
        g = kpos(0, row0, R, PF) // GS
        ok = nmask[None, :]
    else:
        g = kpos(0, rows, R, PF) // GS
        ok = (g < G)[:, None] & nmask[None, :]
        g = g[:, None]
    return load_group(S, Z, OFF, SUP, g, cols[None, :], NP, ok, BLOCK_N, ZC, HAS_Z, HAS_OFF, HAS_SUP)


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
def gemv_step(X, PERM, w, s, z, o, m, rows, K, KP, stride_xm, BITS: tl.constexpr, R: tl.constexpr,
              HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr, HAS_OFF: tl.constexpr):
    """One GEMV step of row ``m``: ``sum_k x[k] w[k, n]`` over the words ``w [BKW, BN]`` of ``rows``, ``[BN]``.

    Fields 0..PF/2-1 sit in the low half-word, the rest in the high one (see ``gemv_term``). Per weight:
    LOP3, FFMA (q - z), FFMA (* x); per word: the two halves; rows live in one thread (register adds only).
    """
    PF: tl.constexpr = 32 // BITS
    lo, hi = halves(w)
    blk = tl.zeros(w.shape, dtype=tl.float32)
    xs = tl.zeros((w.shape[0],), dtype=tl.float32)
    for j in tl.static_range(PF):
        xv = load_x1(X, m, kpos(j, rows, R, PF), K, KP, stride_xm, PERM, HAS_PERM, EVEN_K)
        blk += gemv_term(lo, hi, z, j, BITS, PF // 2) * xv[:, None]
        if HAS_OFF:
            xs += xv
    if HAS_OFF:  # s * sum(q x) + o * sum(x), per word row (its fields share a group)
        return tl.sum(blk * s + o * xs[:, None], axis=0)
    return tl.sum(blk * s, axis=0)


@triton.jit
def halves(w):
    """The low and high 16 bits of every word, each OR-ed into the float 2^23 (see ``gemv_term``)."""
    lo = (w & 0xFFFF) | 0x4B000000
    hi = (w.to(tl.uint32, bitcast=True) >> 16).to(tl.int32, bitcast=True) | 0x4B000000
    return lo, hi


@triton.jit
def stack2(a, b):
    """``[a; b]`` along dim 0, in registers (join makes an in-thread minor dim; permute and reshape
    only rename it), so tiles keep the words' layout and no data moves between threads."""
    return tl.reshape(tl.permute(tl.join(a, b), (2, 0, 1)), (2 * a.shape[0], a.shape[1]))


@triton.jit
def stack4(lo, hi, s, z, j0: tl.constexpr, BITS: tl.constexpr, HALF: tl.constexpr, dtype: tl.constexpr):
    """Dequantized fields ``j0 .. j0+3`` stacked along K: ``[4 * BKW, BN]`` in ``dtype``."""
    f0 = (gemv_term(lo, hi, z, j0, BITS, HALF) * s).to(dtype)
    f1 = (gemv_term(lo, hi, z, j0 + 1, BITS, HALF) * s).to(dtype)
    f2 = (gemv_term(lo, hi, z, j0 + 2, BITS, HALF) * s).to(dtype)
    f3 = (gemv_term(lo, hi, z, j0 + 3, BITS, HALF) * s).to(dtype)
    return stack2(stack2(f0, f1), stack2(f2, f3))


@triton.jit
def dequant_tile(w, s, z, BITS: tl.constexpr, PF: tl.constexpr, dtype: tl.constexpr):
    """Words ``[BKW, BN]`` -> weights ``[PF * BKW, BN]`` in ``dtype``; row ``i`` is field ``i // BKW`` of
    word row ``i % BKW`` (the field-blocked order, see ``kpos``). Per weight: LOP3, FFMA, FMUL, cvt."""
    HALF: tl.constexpr = PF // 2
    lo, hi = halves(w)
    t = stack4(lo, hi, s, z, 0, BITS, HALF, dtype)
    if PF >= 8:
        t = stack2(t, stack4(lo, hi, s, z, 4, BITS, HALF, dtype))
    if PF >= 16:
        t = stack2(t, stack2(stack4(lo, hi, s, z, 8, BITS, HALF, dtype), stack4(lo, hi, s, z, 12, BITS, HALF, dtype)))
    return t


@triton.jit
def tile_kpos(row0, BLOCK_K: tl.constexpr, BKW: tl.constexpr, R: tl.constexpr, PF: tl.constexpr):
    """Sorted positions of the ``BLOCK_K`` rows of a dequantized tile starting at word row ``row0``."""
    i = tl.arange(0, BLOCK_K)
    run: tl.constexpr = R if R < BKW else BKW  # contiguous channels per run, each run starts aligned
    return tl.max_contiguous(tl.multiple_of(kpos(i // BKW, row0 + i % BKW, R, PF), run), run)


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


@triton.jit
def store_split(Y, BIAS, PART, LOCK, out, offs_m, offs_n, M, N, stride_ym, tile, pid_k, SPLIT_K,
                HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SUM_ROWS: tl.constexpr):
    """Write a ``[BM, BN]`` float32 result: directly, or as split ``pid_k``'s partial; the last split of a
    tile (an acq_rel counter ``LOCK[tile]``, reset to 0 by it) sums the partials in a fixed order
    (deterministic) and writes y, ``SUM_ROWS`` rows at a time. It loads up to 8 partials at once: one after
    another, the dependent L2 round trips of 16 splits cost the last CTA ~2 us, about a sixth of an M=1 GEMV
    on the H200 (``benchmarks/gemv_profile.py``). The loads in flight set the kernel's register count, so a
    kernel whose main loop needs few registers sums fewer rows per pass (``gemv_tc``: 216 -> 70-132 registers
    with 16 rows)."""
    UNROLL: tl.constexpr = 8 if SUM_ROWS * BLOCK_N <= 2048 else (4 if SUM_ROWS * BLOCK_N <= 4096 else 1)
    if not SPLIT:
        store_out(Y, BIAS, out, offs_m, offs_n, M, N, stride_ym, HAS_BIAS)
    else:
        mn = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        part = PART + offs_m[:, None] * N + offs_n[None, :]
        tl.store(part + pid_k * M * N, out, mask=mn)
        tl.debug_barrier()  # every thread's partial is written before the counter is released
        seen = tl.atomic_add(LOCK + tile, 1, sem="acq_rel", scope="gpu")
        if seen == SPLIT_K - 1:
            first = tl.min(offs_m, axis=0)
            for r0 in range(0, tl.minimum(BLOCK_M, M - first), SUM_ROWS):  # one pass's loads live at a time
                rows = first + r0 + tl.arange(0, SUM_ROWS)
                live = (rows < M)[:, None] & (offs_n < N)[None, :]
                src = PART + rows[:, None] * N + offs_n[None, :]
                total = tl.zeros((SUM_ROWS, BLOCK_N), dtype=tl.float32)
                for sk in range(0, SPLIT_K, UNROLL):
                    chunk = tl.zeros((SUM_ROWS, BLOCK_N), dtype=tl.float32)
                    for u in tl.static_range(UNROLL):  # the split bound as a tensor (the interpreter's masks)
                        ok = live & (offs_n[None, :] * 0 + sk + u < SPLIT_K)
                        chunk += tl.load(src + (sk + u) * M * N, mask=ok, other=0.0, cache_modifier=".cg")
                    total += chunk
                store_out(Y, BIAS, total, rows, offs_n, M, N, stride_ym, HAS_BIAS)
            tl.atomic_xchg(LOCK + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def rne_bf16(v):
    """float32 -> the nearest-even bfloat16 value, as float32 bits (finite inputs). Triton's interpreter casts
    float32 to bfloat16 by truncation; compiled casts round to nearest even, as this does."""
    b = v.to(tl.int32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536
    return b.to(tl.float32, bitcast=True)


@triton.jit
def to_dtype(v, DT: tl.constexpr, BF16_BITS: tl.constexpr):
    """float32 ``v`` rounded to nearest even in ``DT`` (``BF16_BITS``: by integer arithmetic, for the interpreter)."""
    if BF16_BITS:
        return rne_bf16(v).to(DT)
    return v.to(DT)
