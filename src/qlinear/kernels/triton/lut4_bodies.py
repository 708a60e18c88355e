"""Triton bodies of the 4-bit look-up-table kernels (``lut4.py`` holds the runtime layout and the launchers; its
docstring describes the layout, the two decodes and the variants)."""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from .common import store_split
from .fp4mm import load_words
from .fp8mv import rows_out
from .fp_common import k_range, repeat_cols, tile_of

#: selectors of ``prmt`` in sign-replicate mode: byte p of the mask = bit 3 of nibble p (group 0: nibbles 0-3,
#: group 1: 4-7) read from the word ``u`` (bytes 0-3: msb = nibbles 1, 3, 5, 7) and ``u << 4`` (bytes 4-7)
MASK_SEL = (0x9D8C, 0xBFAE)
#: ``prmt`` selectors pairing looked-up low (bytes 0-3) and high (4-7) bytes of nibbles (1, 0) and (3, 2) into
#: float16x2 of columns (2i, 2i + 1): bnb puts the even column in the high nibble
PAIR_SEL = (0x4051, 0x6273)


@functools.cache
def prmt_asm() -> str:
    """PTX: ``$8`` a word, ``$9..$12`` the low bytes of entries 0-15 (4 a register), ``$13..$16`` the high bytes
    -> ``$0..$7`` the float32 of columns ``8w .. 8w + 7`` (float16 table values, exact)."""
    lines = ["{", ".reg .b32 s, v, m, al, bl, ah, bh, l, h, p;", ".reg .b16 e0, e1;",
             "and.b32 s, $8, 0x77777777;", "shl.b32 v, $8, 4;"]
    for g in range(2):
        if g:
            lines.append("shr.u32 s, s, 16;")
        lines += [f"prmt.b32 m, $8, v, {MASK_SEL[g]:#06x};",
                  "prmt.b32 al, $9, $10, s;", "prmt.b32 bl, $11, $12, s;",
                  "prmt.b32 ah, $13, $14, s;", "prmt.b32 bh, $15, $16, s;",
                  "lop3.b32 l, al, bl, m, 0xD8;", "lop3.b32 h, ah, bh, m, 0xD8;"]  # (a & ~m) | (b & m)
        for pi, sel in enumerate(PAIR_SEL):
            o = 4 * g + 2 * pi
            lines += [f"prmt.b32 p, l, h, {sel:#06x};", "mov.b32 {e0, e1}, p;",
                      f"cvt.f32.f16 ${o}, e0;", f"cvt.f32.f16 ${o + 1}, e1;"]
    return "\n".join([*lines, "}"])


@triton.jit
def _code(u, j: tl.constexpr):
    """Code of column ``8w + j`` of words ``u``: nibble ``j ^ 1`` (bnb's high-nibble-first bytes)."""
    return (u >> (4 * (j ^ 1))) & 15


@triton.jit
def _look(T16, u, j: tl.constexpr):
    """``float16(table)[code]`` of column ``8w + j``, as float32 (the gather decode)."""
    return tl.load(T16 + _code(u, j)).to(tl.float32)


@triton.jit
def table_regs(TB):
    """The table's byte planes (8 int32: low bytes of entries 0-15, then high bytes), loaded once a program."""
    return (tl.load(TB), tl.load(TB + 1), tl.load(TB + 2), tl.load(TB + 3), tl.load(TB + 4), tl.load(TB + 5),
            tl.load(TB + 6), tl.load(TB + 7))


@triton.jit
def decode8(u, T16, tr, PRMT: tl.constexpr, ASM: tl.constexpr):
    """Words ``u`` -> the float32 table values of their 8 columns, in K order (module docstring); ``tr`` is
    ``table_regs``."""
    if PRMT:
        return tl.inline_asm_elementwise(ASM, "=f,=f,=f,=f,=f,=f,=f,=f,r,r,r,r,r,r,r,r,r",
                                         [u, tr[0], tr[1], tr[2], tr[3], tr[4], tr[5], tr[6], tr[7]],
                                         dtype=(tl.float32,) * 8, is_pure=True, pack=1)
    return (_look(T16, u, 0), _look(T16, u, 1), _look(T16, u, 2), _look(T16, u, 3), _look(T16, u, 4),
            _look(T16, u, 5), _look(T16, u, 6), _look(T16, u, 7))


@triton.jit
def step_scales(A, rn, w0, KB, gmul, BKW: tl.constexpr, BLOCK: tl.constexpr):
    """``absmax * p2`` of words ``w0 .. w0 + BKW`` of rows ``rn``: ``[BN, BKW]``, or ``[BN, 1]`` when the step
    lies in one block (steps and blocks are powers of two, so a step never straddles two)."""
    if 8 * BKW >= BLOCK:
        g = (8 * w0) // BLOCK + tl.arange(0, 8 * BKW // BLOCK)
        s = tl.load(A + rn[:, None].to(tl.int64) * KB + g[None, :], mask=(g < KB)[None, :], other=0.0)
        out = repeat_cols(s * gmul, BLOCK // 8)
    else:
        out = (tl.load(A + rn.to(tl.int64) * KB + (8 * w0) // BLOCK) * gmul)[:, None]
    return out


@triton.jit
def _scaled(f, s, DT: tl.constexpr):
    return (f * s).to(DT)  # one rounding of the float32 weight to x's dtype


@triton.jit
def lut4_tile(u, s, T16, tr, DT: tl.constexpr, PRMT: tl.constexpr, ASM: tl.constexpr):
    """Words ``[BN, BKW]`` -> weights ``[BN, 8 BKW]`` in ``DT``, columns in K order (joins: register renames)."""
    f0, f1, f2, f3, f4, f5, f6, f7 = decode8(u, T16, tr, PRMT, ASM)
    j = tl.join(tl.join(tl.join(_scaled(f0, s, DT), _scaled(f4, s, DT)),
                        tl.join(_scaled(f2, s, DT), _scaled(f6, s, DT))),
                tl.join(tl.join(_scaled(f1, s, DT), _scaled(f5, s, DT)),
                        tl.join(_scaled(f3, s, DT), _scaled(f7, s, DT))))
    return tl.reshape(j, (u.shape[0], 8 * u.shape[1]))


@triton.jit
def gemv_row(acc, f0, f1, f2, f3, f4, f5, f6, f7, s, xrow, kw, KW, EVEN_K: tl.constexpr):
    """``acc += s * sum_j f_j x[8 kw + j]`` for one activation row (exact products, float32)."""
    b = xrow + 8 * kw
    ok = (kw < KW) | EVEN_K
    t = f0 * _xj(b, 0, ok) + f1 * _xj(b, 1, ok) + f2 * _xj(b, 2, ok) + f3 * _xj(b, 3, ok) + f4 * _xj(b, 4, ok)
    t = t + f5 * _xj(b, 5, ok) + f6 * _xj(b, 6, ok) + f7 * _xj(b, 7, ok)  # one FMUL, seven FFMA: a chain
    return acc + t * s


@triton.jit
def _xj(b, j: tl.constexpr, ok):
    """x at columns ``8 kw + j`` (one strided load of the step's words), float32, as a ``[1, BKW]`` row."""
    return tl.load(b + j, mask=ok, other=0.0).to(tl.float32)[None, :]


@triton.jit
def settled(acc):
    """``acc`` through an opaque copy, so that Triton 3.6 waits for all of a step's wgmma before the next step's
    decode overwrites their A registers (triton-lang/triton#9433; ``qmm3._settled`` has the story)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def lut4_gemv_kernel(X, W, A, T16, TB, BIAS, Y, PART, LOCK, M, N, K, KW, KB, stride_xm, stride_ym, SPLIT_K,
                     gmul, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK: tl.constexpr,
                     PRMT: tl.constexpr, ASM: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                     EVEN_K: tl.constexpr):
    """Grid ``(N tiles, SPLIT_K, M / ROWS)``: each word decoded once for up to 4 rows; per row and word the 8
    products are summed in float32, then scaled (one FFMA a word). Rows past M re-read row M - 1, unstored."""
    BKW: tl.constexpr = BLOCK_K // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N
    offs_w = tl.max_contiguous(tl.multiple_of(tl.arange(0, BKW), BKW), BKW)
    kb0, kb1 = k_range(K, BLOCK_K, SPLIT_K, pid_k)
    p_ptr = W + rn[:, None].to(tl.int64) * KW + offs_w[None, :]
    m0 = pid_m * ROWS
    tr = table_regs(TB)
    a0 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    a1 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    a2 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    a3 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    for kb in range(kb0, kb1):
        w0 = kb * BKW
        u = load_words(p_ptr, w0, KW, BKW, EVEN_K)
        kw = w0 + offs_w
        s = step_scales(A, rn, w0, KB, gmul, BKW, BLOCK)
        f0, f1, f2, f3, f4, f5, f6, f7 = decode8(u, T16, tr, PRMT, ASM)
        a0 = gemv_row(a0, f0, f1, f2, f3, f4, f5, f6, f7, s, X + m0 * stride_xm, kw, KW, EVEN_K)
        if ROWS > 1:
            xr = X + tl.minimum(m0 + 1, M - 1) * stride_xm
            a1 = gemv_row(a1, f0, f1, f2, f3, f4, f5, f6, f7, s, xr, kw, KW, EVEN_K)
        if ROWS > 2:
            xr = X + tl.minimum(m0 + 2, M - 1) * stride_xm
            a2 = gemv_row(a2, f0, f1, f2, f3, f4, f5, f6, f7, s, xr, kw, KW, EVEN_K)
            xr = X + tl.minimum(m0 + 3, M - 1) * stride_xm
            a3 = gemv_row(a3, f0, f1, f2, f3, f4, f5, f6, f7, s, xr, kw, KW, EVEN_K)
    acc = rows_out(a0, a1, a2, a3, ROWS)
    store_split(Y, BIAS, PART, LOCK, acc, m0 + tl.arange(0, ROWS), offs_n, M, N, stride_ym,
                pid_m * tl.num_programs(0) + pid_n, pid_k, SPLIT_K, HAS_BIAS, SPLIT, ROWS, BLOCK_N, ROWS)


@triton.jit
def lut4_dot_kernel(X, W, A, T16, TB, BIAS, Y, PART, LOCK, M, N, K, KW, KB, stride_xm, stride_ym, SPLIT_K,
                    gmul, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, BLOCK: tl.constexpr, PRMT: tl.constexpr, ASM: tl.constexpr,
                    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, SETTLE: tl.constexpr):
    """``skinny`` and ``mma``: swap-AB, the weight tile (built in x's dtype by ``lut4_tile``) is the MMA's A from
    registers, x^T its B, ``acc [BN, BM]`` (Triton 3.6 fails to compile the gathered tile as a B operand).
    ``SETTLE`` (CUDA): each step's wgmma finish before the next step's decode (``settled``)."""
    BKW: tl.constexpr = BLOCK_K // 8
    DT: tl.constexpr = X.dtype.element_ty
    pid_m, pid_n, grid_n, offs_m, offs_n, rm, rn = tile_of(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_k = tl.arange(0, BLOCK_K)
    kb0, kb1 = k_range(K, BLOCK_K, SPLIT_K, pid_k)
    x_ptr = X + rm[:, None] * stride_xm + offs_k[None, :]
    p_ptr = W + rn[:, None].to(tl.int64) * KW + tl.arange(0, BKW)[None, :]
    tr = table_regs(TB)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK_K
        if EVEN_K:  # noqa: SIM108 (constexpr branch)
            x = tl.load(x_ptr + k0)
        else:
            x = tl.load(x_ptr + k0, mask=(k0 + offs_k < K)[None, :], other=0.0)
        u = load_words(p_ptr, kb * BKW, KW, BKW, EVEN_K)
        w = lut4_tile(u, step_scales(A, rn, kb * BKW, KB, gmul, BKW, BLOCK), T16, tr, DT, PRMT, ASM)
        acc = tl.dot(w, tl.trans(x), acc)
        if SETTLE:
            acc = settled(acc)
    store_split(Y, BIAS, PART, LOCK, tl.trans(acc), offs_m, offs_n, M, N, stride_ym, pid_m * grid_n + pid_n, pid_k,
                SPLIT_K, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N, BLOCK_M)


@triton.jit
def lut4_dense_kernel(W, A, T16, TB, OUT, N, KW, KB, gmul, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      BLOCK: tl.constexpr, PRMT: tl.constexpr, ASM: tl.constexpr):
    """``OUT [N, K]`` = the decoded weights in OUT's dtype."""
    BKW: tl.constexpr = BLOCK_K // 8
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w0 = tl.program_id(1) * BKW
    rn = offs_n % N
    p_ptr = W + rn[:, None].to(tl.int64) * KW + tl.arange(0, BKW)[None, :]
    u = load_words(p_ptr, w0, KW, BKW, False)
    tr = table_regs(TB)
    w = lut4_tile(u, step_scales(A, rn, w0, KB, gmul, BKW, BLOCK), T16, tr, OUT.dtype.element_ty, PRMT, ASM)
    kk = 8 * w0 + tl.arange(0, BLOCK_K)
    mask = (offs_n < N)[:, None] & (kk < 8 * KW)[None, :]
    tl.store(OUT + rn[:, None].to(tl.int64) * (8 * KW) + kk[None, :], w, mask=mask)
