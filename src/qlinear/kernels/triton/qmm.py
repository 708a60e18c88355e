"""The quantized matmul body (``y = x @ W^T``) and its launcher: one kernel, two inner products.

Grid ``(M tiles, N tiles, SPLIT_K)``; M tiles vary fastest so CTAs sharing a weight tile run together
and the tile is read from HBM once. Each CTA walks its share of K in steps of ``BLOCK_K`` codes
(``BKW = BLOCK_K / PF`` word rows):

* ``USE_DOT=False`` (variant ``gemv``, one row per program): per code field, ``(q - z) * x`` on CUDA
  cores (3 instructions per weight: LOP3, FFMA, FFMA), scaled once per word row per step. With
  ``BLOCK_N`` a multiple of ``128 * num_warps`` the words, scales and zeros all load in one layout
  (4-column vectors, every row of the step in each thread: in-thread reduction, no layout conversion),
  and a field's activations for the step's rows are one contiguous vector (field-blocked words).
* ``USE_DOT=True`` (``skinny``, ``gemm``): each field of the words becomes a dequantized ``[BKW, BN]``
  tile in the words' layout; stacked along K in registers they make ``[BLOCK_K, BN]``, which feeds
  ``tl.dot`` (wgmma on Hopper for 64/128-row tiles), fp32 accumulators; A is gathered at the tile's
  sorted positions (runs of R contiguous channels).

Split-K partials go to a float32 scratch ``[SPLIT_K, M, N]``; the last CTA of a tile (an acq_rel
counter per tile, reset to 0 by that CTA) sums them in a fixed order (deterministic) and writes y.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    dequant_tile,
    gemv_step,
    gemv_term,
    group_params,
    halves,
    kpos,
    load_group,
    load_words,
    load_x,
    load_x1,
    stack2,
    store_split,
    tile_kpos,
)
from .configs import Config
from .gather import gather_cols, sorted_input
from .layout import Packed, one_group
from .runtime import LAST, interpreting


@triton.jit
def row_dot(d, X, m, kk, K, KP, stride_xm, PERM, HAS_PERM: tl.constexpr, EVEN_K: tl.constexpr):
    """One row's share of a field in the multi-row GEMV: ``sum_k (q - z) x`` as ``[1, BN]``, and x itself."""
    x = load_x1(X, m, kk, K, KP, stride_xm, PERM, HAS_PERM, EVEN_K)
    return tl.sum(d * x[:, None], axis=0, keep_dims=True), x


@triton.jit
def rows_term(p, xs, s, o, HAS_OFF: tl.constexpr):
    """One row's step of the multi-row GEMV: ``s * sum(q x) (+ o * sum(x))``, ``[1, BN]``."""
    if HAS_OFF:
        return p * s + tl.sum(xs, axis=0) * o
    return p * s


@triton.jit
def qmm_kernel(X, W, S, Z, OFF, SUP, PERM, BIAS, Y, PART, LOCK,
               M, N, K, KW, G, KP, NP, GS, SPLIT_K, stride_xm, stride_ym,
               BITS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr, ONE_GROUP: tl.constexpr,
               HAS_Z: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               SPLIT: tl.constexpr, USE_DOT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
               PREFETCH: tl.constexpr, HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr):
    PF: tl.constexpr = 32 // BITS
    BKW: tl.constexpr = BLOCK_K // PF
    HALF: tl.constexpr = PF // 2
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nkb = tl.cdiv(KW, BKW)
    per = tl.cdiv(nkb, SPLIT_K)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:  # one row per program (acc), or 2 / 4 (macc); rows past M re-read row M - 1, never stored
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        macc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        m_0 = tl.minimum(pid_m * BLOCK_M, M - 1)
        m_1 = tl.minimum(pid_m * BLOCK_M + 1, M - 1)
        m_2 = tl.minimum(pid_m * BLOCK_M + 2, M - 1)
        m_3 = tl.minimum(pid_m * BLOCK_M + 3, M - 1)
    if PREFETCH:  # words of the next step load while this one computes (a clamped row: always in range)
        w_next = load_words(W, tl.maximum(tl.minimum(kb0, nkb - 1), 0) * BKW + tl.arange(0, BKW), offs_n, KW, NP,
                            EVEN_K, EVEN_N)
    for kb in range(kb0, kb1):
        row0 = kb * BKW
        rows = row0 + tl.arange(0, BKW)
        if PREFETCH:
            w = w_next
            w_next = load_words(W, tl.minimum(kb + 1, nkb - 1) * BKW + tl.arange(0, BKW), offs_n, KW, NP,
                                EVEN_K, EVEN_N)
        else:
            w = load_words(W, rows, offs_n, KW, NP, EVEN_K, EVEN_N)
        s, z, o = group_params(S, Z, OFF, SUP, rows, row0, offs_n, G, NP, GS, PF, R, BLOCK_N, ZC, HAS_Z, ONE_GROUP,
                               EVEN_N, HAS_OFF, HAS_SUP)
        if USE_DOT:
            a = load_x(X, offs_m, tile_kpos(row0, BLOCK_K, BKW, R, PF), M, K, KP, stride_xm, PERM, HAS_PERM,
                       EVEN_K)
            b = dequant_tile(w, s, z, BITS, PF, X.dtype.element_ty)
            acc = tl.dot(a, b, acc)
        elif BLOCK_M == 1:
            acc += gemv_step(X, PERM, w, s, z, o, pid_m, rows, K, KP, stride_xm, BITS, R, HAS_PERM, EVEN_K, HAS_OFF)
        else:  # 2 or 4 rows share each dequantized term (q - z): LOP3 + FFMA once, then one FFMA per row
            lo, hi = halves(w)
            p0 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
            p1 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
            p2 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
            p3 = tl.zeros((1, BLOCK_N), dtype=tl.float32)
            xs0 = tl.zeros((BKW,), dtype=tl.float32)
            xs1 = tl.zeros((BKW,), dtype=tl.float32)
            xs2 = tl.zeros((BKW,), dtype=tl.float32)
            xs3 = tl.zeros((BKW,), dtype=tl.float32)
            for j in tl.static_range(PF):
                d = gemv_term(lo, hi, z, j, BITS, HALF)
                kk = kpos(j, rows, R, PF)
                t0, x0 = row_dot(d, X, m_0, kk, K, KP, stride_xm, PERM, HAS_PERM, EVEN_K)
                t1, x1 = row_dot(d, X, m_1, kk, K, KP, stride_xm, PERM, HAS_PERM, EVEN_K)
                p0, xs0, p1, xs1 = p0 + t0, xs0 + x0, p1 + t1, xs1 + x1
                if BLOCK_M == 4:
                    t2, x2 = row_dot(d, X, m_2, kk, K, KP, stride_xm, PERM, HAS_PERM, EVEN_K)
                    t3, x3 = row_dot(d, X, m_3, kk, K, KP, stride_xm, PERM, HAS_PERM, EVEN_K)
                    p2, xs2, p3, xs3 = p2 + t2, xs2 + x2, p3 + t3, xs3 + x3
            # the step lies in one group (the launcher's condition for BLOCK_M > 1): s, o are [1, BN]
            step = stack2(rows_term(p0, xs0, s, o, HAS_OFF), rows_term(p1, xs1, s, o, HAS_OFF))
            if BLOCK_M == 4:
                step = stack2(step, stack2(rows_term(p2, xs2, s, o, HAS_OFF), rows_term(p3, xs3, s, o, HAS_OFF)))
            macc += step
    if USE_DOT:
        out = acc
    elif BLOCK_M == 1:
        out = acc[None, :]
    else:
        out = macc
    store_split(Y, BIAS, PART, LOCK, out, offs_m, offs_n, M, N, stride_ym, pid_m * tl.num_programs(1) + pid_n,
                pid_k, SPLIT_K, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N, BLOCK_M)


@triton.jit
def qmm2_kernel(X, W, S, Z, OFF, SUP, BIAS, Y, PART, LOCK,
                M, N, K, KW, G, NP, SPLIT_K, stride_xm, stride_ym, GS: tl.constexpr,
                BITS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr, ONE_GROUP: tl.constexpr,
                HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr):
    """``gemm2`` / ``skinny2``: A is x in sorted order (contiguous 2-D tiles, no gather), B is built the
    classic GPTQ way: the step's ``BKW`` word rows broadcast to every field and shifted by a constant
    pattern per K row. ``BLOCK_K`` is a multiple of a field block (``R * PF`` codes), so the tile's K
    rows are the sorted rows ``k0 .. k0 + BLOCK_K`` in order: tile row ``i = a*R*PF + j*R + r`` is
    field ``j`` of word row ``a*R + r``. One word load per weight word (no replicated loads), no
    stack/join; the tile goes to shared memory once for the dot (wgmma B operand). The group length
    ``GS`` is a compile-time value (a shift or a multiply, not a 20-instruction division per step).

    Grid ``(M tiles * N tiles, SPLIT_K)``, M tiles fastest: CTAs that share a weight tile are adjacent
    in launch order, so the tile comes from HBM once and from L2 for the other M tiles.
    """
    PF: tl.constexpr = 32 // BITS
    BKW: tl.constexpr = BLOCK_K // PF
    NB: tl.constexpr = BKW // R  # field blocks per step
    MASK: tl.constexpr = (1 << BITS) - 1
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    grid_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % grid_m
    pid_n = pid // grid_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    nmask = (offs_n < NP) | EVEN_N
    # tile row i is field j = (i // R) % PF, in half-word j // HALF at bit BITS * (j % HALF); every row
    # of a thread's registers has a compile-time field, so these fold into immediates per register
    HALF: tl.constexpr = PF // 2
    fj = (offs_k // R) % PF
    low = (fj < HALF)[:, None]
    fmask = ((MASK << (BITS * (fj % HALF))) | 0x4B000000)[:, None]
    fc = (1.0 / (1 << (BITS * (fj % HALF))).to(tl.float32))[:, None]  # 2^-(BITS * i)
    nkb = tl.cdiv(KW, BKW)
    per = tl.cdiv(nkb, SPLIT_K)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    a_ptr = X + offs_m[:, None] * stride_xm + offs_k[None, :]
    mrow = (offs_m < M)[:, None]
    cols = tl.max_contiguous(offs_n, 4)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK_K
        row0 = kb * BKW
        rows = row0 + tl.arange(0, BKW)
        w = load_words(W, rows, offs_n, KW, NP, EVEN_K, EVEN_N)  # [BKW, BN], one load per word
        lo, hi = halves(w)  # per word: low / high 16 bits OR-ed into float 2^23 (see gemv_term)
        # [NB, R, BN] -> [NB, PF, R, BN] -> [BLOCK_K, BN]: row a*PF*R + j*R + r is word row a*R + r
        lo = tl.reshape(tl.broadcast_to(tl.reshape(lo, (NB, 1, R, BLOCK_N)), (NB, PF, R, BLOCK_N)),
                        (BLOCK_K, BLOCK_N))
        hi = tl.reshape(tl.broadcast_to(tl.reshape(hi, (NB, 1, R, BLOCK_N)), (NB, PF, R, BLOCK_N)),
                        (BLOCK_K, BLOCK_N))
        # field masked in place (one LOP3): 2^23 + q * 2^(BITS*i); FMA by 2^-(BITS*i) leaves q - z
        f = (tl.where(low, lo, hi) & fmask).to(tl.float32, bitcast=True)
        if ONE_GROUP:
            g = k0 // GS
            ok = nmask[None, :]
        else:
            g = (k0 + offs_k) // GS
            ok = (g < G)[:, None] & nmask[None, :]
            g = g[:, None]
        s, z, o = load_group(S, Z, OFF, SUP, g, cols[None, :], NP, ok, BLOCK_N, ZC, HAS_Z, HAS_OFF, HAS_SUP)
        if HAS_OFF:  # weights s * q + o (GGUF's float minimums; z is 0 there)
            b = tl.fma(tl.fma(f, fc, -(z + 8388608.0 * fc)), s, o).to(X.dtype.element_ty)
        else:
            b = (tl.fma(f, fc, -(z + 8388608.0 * fc)) * s).to(X.dtype.element_ty)
        if EVEN_K:
            a = tl.load(a_ptr + k0, mask=mrow, other=0.0)
        else:
            a = tl.load(a_ptr + k0, mask=mrow & ((k0 + offs_k) < K)[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
    store_split(Y, BIAS, PART, LOCK, acc, offs_m, offs_n, M, N, stride_ym, pid, pid_k, SPLIT_K, HAS_BIAS, SPLIT,
                BLOCK_M, BLOCK_N, BLOCK_M)


def gemv_rows(m: int, cfg: Config, p: Packed) -> int:
    """Rows per GEMV program: 1, or 2 / 4 sharing each dequantized weight, which needs every K step inside
    one group (so one scale row per step)."""
    rows = min(4, max(1, cfg.block_m), 1 << (max(1, m) - 1).bit_length())
    return rows if rows > 1 and one_group(p, cfg.block_k) else 1


def lock_slots(n: int) -> int:
    """Split-K counters a layer keeps: enough for 32 M tiles of 16-column N tiles."""
    return 32 * -(-n // 16)


def qmm(x2: torch.Tensor, p: Packed, cfg: Config, bias: torch.Tensor | None = None,
        lock: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 [M, K] @ W^T (+ bias)`` -> ``[M, N]`` in x2's dtype, with the tiles and split of ``cfg``.

    ``lock`` (int32 zeros, ``lock_slots(N)``) enables split-K; ``out`` a contiguous ``[M, N]`` to write into.
    """
    m = x2.shape[0]
    y = torch.empty((m, p.n), dtype=x2.dtype, device=x2.device) if out is None else out
    if m == 0:
        return y
    if cfg.variant in V2:
        return qmm2(x2, p, cfg, bias, lock, y)
    if cfg.variant in ("skinny3", "gemm3"):
        from .qmm3 import qmm3

        return qmm3(x2, p, cfg, bias, lock, y, use_asm=not interpreting())
    if cfg.variant == "gemm4":
        from .qmm4 import qmm4

        return qmm4(x2, p, cfg, bias, lock, y)
    if cfg.variant == "gemm5":
        from .qmm5 import qmm5

        return qmm5(x2, p, cfg, bias, lock, y)
    if cfg.variant == "gemv_tc":
        from .qmv_tc import qmv_tc

        return qmv_tc(x2, p, cfg, bias, lock, y, use_asm=not interpreting())
    use_dot = cfg.variant != "gemv"
    if use_dot and p.offsets is not None:
        raise ValueError(f"variant {cfg.variant} does not take additive offsets (GGUF minimums, MLX biases); use "
                         "gemv, skinny2, gemm2 or dense")
    bm = cfg.block_m if use_dot else gemv_rows(m, cfg, p)
    perm, kx = p.perm, p.k
    if use_dot and cfg.variant == "gemm" and perm is not None:
        x2, perm, kx = gather_cols(x2, p), None, p.kp
    grid_m, grid_n = triton.cdiv(m, bm), triton.cdiv(p.n, cfg.block_n)
    split = cfg.split_k if lock is not None and grid_m * grid_n <= lock.numel() else 1
    part = torch.empty((split, m, p.n), dtype=torch.float32, device=x2.device) if split > 1 else y
    LAST["qmm"] = qmm_kernel[(grid_m, grid_n, split)](
        x2, p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales, p.offset_arg(), p.super_arg(),
        perm if perm is not None else p.qweight, bias if bias is not None else y, y, part,
        lock if lock is not None else p.qweight,
        m, p.n, kx, p.kw, p.scales.shape[0], p.kp, p.np, p.group, split, x2.stride(0), y.stride(0),
        BITS=p.bits, R=p.rows_per_block, ZC=p.zero_const, ONE_GROUP=one_group(p, cfg.block_k),
        HAS_Z=p.zeros is not None,
        HAS_PERM=perm is not None, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT=split > 1, USE_DOT=use_dot, EVEN_K=kx == p.kp and p.kp % cfg.block_k == 0,
        EVEN_N=p.np % cfg.block_n == 0, PREFETCH=cfg.prefetch and not use_dot,
        HAS_OFF=p.offsets is not None, HAS_SUP=p.supers is not None,
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return y


#: variants run by ``qmm2_kernel`` (contiguous A, classic broadcast-shift B)
V2 = ("skinny2", "gemm2")


def block_k2(p: Packed, block_k: int) -> int:
    """``qmm2_kernel``'s K step: a multiple of a field block (``R * PF`` codes)."""
    fb = p.rows_per_block * (32 // p.bits)
    return max(block_k, fb) // fb * fb


def qmm2(x2: torch.Tensor, p: Packed, cfg: Config, bias: torch.Tensor | None, lock: torch.Tensor | None,
         y: torch.Tensor) -> torch.Tensor:
    """Launch ``qmm2_kernel``: x in sorted order (one gather when act-order, else x itself)."""
    m = x2.shape[0]
    x2, kx = sorted_input(x2, p)
    bk = block_k2(p, cfg.block_k)
    bm = cfg.block_m
    tiles = triton.cdiv(m, bm) * triton.cdiv(p.n, cfg.block_n)
    split = cfg.split_k if lock is not None and tiles <= lock.numel() else 1
    part = torch.empty((split, m, p.n), dtype=torch.float32, device=x2.device) if split > 1 else y
    LAST["qmm"] = qmm2_kernel[(tiles, split)](
        x2, p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales, p.offset_arg(), p.super_arg(),
        bias if bias is not None else y, y, part, lock if lock is not None else p.qweight,
        m, p.n, kx, p.kw, p.scales.shape[0], p.np, split, x2.stride(0), y.stride(0),
        GS=p.group, BITS=p.bits, R=p.rows_per_block, ZC=p.zero_const, ONE_GROUP=one_group(p, bk),
        HAS_Z=p.zeros is not None, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=bk, SPLIT=split > 1,
        EVEN_K=kx == p.kp and p.kp % bk == 0, EVEN_N=p.np % cfg.block_n == 0,
        HAS_OFF=p.offsets is not None, HAS_SUP=p.supers is not None, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return y
