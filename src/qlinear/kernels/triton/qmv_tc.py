"""``gemv_tc``: the decode GEMV (M <= 8 per program) on tensor cores, reading the field-blocked words as they are.

Why: the CUDA-core GEMV spends ~4 instructions per weight (LOP3, FFMA (q - z), FFMA (x), addresses), as much
issue time as its bytes take to stream (``benchmarks/triton_notes.md``). Here each warp runs
``mma.sync.m16n8k16`` with the weights as A (16 output channels x 16 K slots) and the activations as B
(16 K slots x 8 rows): the dequantization is one PRMT and two LOP3 per four codes, and the multiply-add is
one tensor-core instruction per 256 weights, so M = 1..8 costs the same. 8-bit codes: one PRMT and LOP3 per
code pair on float16; on bfloat16, where ``m + q`` is not exact, each byte is split into nibbles
(``qmv_tc_asm._byte_split_asm``).

Which registers a lane holds is the whole trick. The PTX fragment of lane ``(g, t) = (lane // 4, lane % 4)``
is: A rows ``g`` and ``g + 8``, K slots ``2t, 2t+1, 2t+8, 2t+9``; B column ``g``, the same K slots; C rows
``g, g+8``, columns ``2t, 2t+1``. Every tensor here is ``[32 * warps, 4]`` with one row per lane (Triton's
layout for a 16-byte load along the last dim: the kernel checks it offline, ``benchmarks/sass_offline.py``):

* words: lane ``(w, g, t)`` loads the 4 columns ``32 w + 4 g + c`` (one 16-byte vector) of two word rows
  ``2 t', 2 t' + 1`` of a field block (``t' = t % (R / 2)``). Tile 0's rows ``g, g + 8`` are columns
  ``4g, 4g + 1``; tile 1's are ``4g + 2, 4g + 3``. K slots are any K positions, as long as A and B agree:
  slot pair ``(2t, 2t+1)`` of a step is field ``f`` of the lane's two word rows, which are the adjacent
  sorted rows ``k, k + 1`` (``layout.py``), so B is one 4-byte load of x per field.
* a PRMT puts byte X of both words side by side; ``LOP3 (t >> 4i) & 0x000F000F | magic`` makes the bf16x2
  (f16x2) pair ``(m + q_k, m + q_k+1)``, ``m = 128`` (1024), exact. The MMA sums ``(m + q) x`` in float32;
  a third MMA with A = 1 sums x itself, so per group ``y += s (C - (m + z) Cx) (+ o Cx)`` (float32).
* C of tile 0 element ``c`` is output column ``4g + c // 2``, row ``2t + c % 2``.

Under ``TRITON_INTERPRET`` (CI) the MMA cannot run: ``_chunk_twin`` computes the same C and Cx with plain
Triton (gathers of the chunk's codes and activations per C element), so the tiling, addressing, groups,
epilogue and split-K are checked there; the fragment order itself is checked on a GPU (gpu_check.py).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .common import stack2, store_split
from .gather import gather_cols
from .layout import Packed
from .qmv_tc_asm import MMA_CONSTRAINTS, mma_asm
from .qmv_tc_groups import group_terms
from .qmv_tc_x import chunk_x, unit_x

#: activation rows per B operand (the MMA's 8 columns); a program takes one or two such sets
SET_ROWS = 8


@triton.jit
def _chunk_twin(W, X, NP, row0, ccol, kbase, mrow, live, KX, stride_xm, nmask0, nmask1,
                BITS: tl.constexpr, R: tl.constexpr, MAGIC: tl.constexpr):
    """Plain-Triton C0, C1, Cx increments of one chunk (the interpreter's stand-in for the MMAs): for C
    element ``(lane, c)`` of tile 0 (column ``ccol``, x row ``mrow``), ``sum_k (m + q) x`` over the chunk of
    the lane's warp (first word row ``row0``, first sorted row ``kbase``, both ``[L, 1]``)."""
    PF: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    rr = tl.arange(0, R)[None, None, :, None]
    jj = tl.arange(0, PF)[None, None, None, :]
    kk = kbase[:, :, None, None] + jj * R + rr  # [L, 1, R, PF]: field j of word row r is kbase + j R + r
    ok = (mrow >= 0)[:, :, None, None] & (kk < KX) & live[:, :, None, None]
    xv = tl.load(X + mrow[:, :, None, None] * stride_xm + kk, mask=ok, other=0.0).to(tl.float32)
    cx = tl.sum(tl.sum(xv, axis=3), axis=2)
    wrow = (row0[:, :, None] + tl.arange(0, R)[None, None, :]) * NP  # [L, 1, R]
    w0 = tl.load(W + wrow + ccol[:, :, None], mask=nmask0[:, :, None], other=0)
    w1 = tl.load(W + wrow + ccol[:, :, None] + 2, mask=nmask1[:, :, None], other=0)
    q0 = ((w0[:, :, :, None] >> (BITS * jj)) & MASK).to(tl.float32)
    q1 = ((w1[:, :, :, None] >> (BITS * jj)) & MASK).to(tl.float32)
    return tl.sum(tl.sum((q0 + MAGIC) * xv, axis=3), axis=2), tl.sum(tl.sum((q1 + MAGIC) * xv, axis=3), axis=2), cx


@triton.jit
def _word_pair(W, row, NP, cols, nmask, shift):
    """Words of word rows ``row, row + 1`` at the lane's 4 columns, shifted so its fields start at bit 0."""
    wa = tl.load(W + row * NP + cols, mask=nmask, other=0)
    wb = tl.load(W + (row + 1) * NP + cols, mask=nmask, other=0)
    wa = (wa.to(tl.uint32, bitcast=True) >> shift).to(tl.int32, bitcast=True)
    wb = (wb.to(tl.uint32, bitcast=True) >> shift).to(tl.int32, bitcast=True)
    return wa, wb


@triton.jit
def _unit_words(W, u, UNIT: tl.constexpr, R: tl.constexpr, rp, NP, cols, nmask, shift):
    """The word pairs of the ``UNIT`` (1, 2 or 4) chunks of step ``u`` (unused slots repeat chunk 0)."""
    a0, b0 = _word_pair(W, u * UNIT * R + rp, NP, cols, nmask, shift)
    a1, b1, a2, b2, a3, b3 = a0, b0, a0, b0, a0, b0
    if UNIT >= 2:
        a1, b1 = _word_pair(W, (u * UNIT + 1) * R + rp, NP, cols, nmask, shift)
    if UNIT >= 4:
        a2, b2 = _word_pair(W, (u * UNIT + 2) * R + rp, NP, cols, nmask, shift)
        a3, b3 = _word_pair(W, (u * UNIT + 3) * R + rp, NP, cols, nmask, shift)
    return a0, b0, a1, b1, a2, b2, a3, b3


@triton.jit
def _warp_sum(acc, WK: tl.constexpr, BLOCK_N: tl.constexpr):
    """The sum of the ``WK`` warps' fragments that walked the same columns (``[BLOCK_N, 4]``)."""
    if WK == 1:
        return acc
    return tl.sum(tl.reshape(acc, (WK, BLOCK_N, 4)), axis=0)


@triton.jit
def _frag_to_tile(a0, a1, WARPS: tl.constexpr):
    """The two C tiles' ``[L, 4]`` fragments as ``[8, 32 * WARPS]`` (x row, column) for ``store_split``:
    element ``(w, g, t, c)`` of tile ``i`` is row ``2t + c % 2``, column ``32 w + 4 g + 2 i + c // 2``."""
    both = tl.join(a0, a1)  # [L, 4, 2]: (w g t, ch cl, tile)
    six = tl.reshape(both, (WARPS, 8, 4, 2, 2, 2))  # (w, g, t, ch, cl, tile)
    return tl.reshape(tl.permute(six, (2, 4, 0, 1, 5, 3)), (8, 32 * WARPS))


@triton.jit
def _neg_zero_pairs(Z, grp, NP, cols, nmask, ZC: tl.constexpr, MAGIC: tl.constexpr, HAS_Z: tl.constexpr,
                    IS_BF16: tl.constexpr, L: tl.constexpr):
    """Per word column of the lane, ``-(m + z)`` twice in one int32 (bf16x2 / f16x2) for the asm's FMA
    (``MAGIC`` 0 for 8-bit codes on bf16, whose asm adds ``-z`` to ``128 + l``: ``m + z`` is not exact there)."""
    if HAS_Z:
        v = -(tl.load(Z + grp * NP + cols, mask=nmask, other=0).to(tl.float32) + MAGIC)
    else:
        v = tl.full((L, 4), -(ZC + MAGIC), tl.float32)
    h = v.to(tl.bfloat16 if IS_BF16 else tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return h | (h << 16)


@triton.jit
def qmv_tc_kernel(X, W, S, Z, OFF, SUP, BIAS, Y, PART, LOCK,
                  M, N, KX, NP, NCH, SPLIT_K, stride_xm, stride_ym,
                  GS: tl.constexpr, BITS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr,
                  HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                  WN: tl.constexpr, WK: tl.constexpr, UNIT: tl.constexpr, NB: tl.constexpr, SPLIT: tl.constexpr,
                  EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PREFETCH: tl.constexpr, SUBZ: tl.constexpr,
                  STAGE_X: tl.constexpr, SUM_ROWS: tl.constexpr, VEC_PARAMS: tl.constexpr, USE_ASM: tl.constexpr,
                  ASM: tl.constexpr, CONSTRAINTS: tl.constexpr):
    """Grid ``(M / (8 NB), N / (32 WN), SPLIT_K)``: ``qmv_tc_body`` on this program's tile and split, then the
    split-K store."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    out = qmv_tc_body(X, W, S, Z, OFF, SUP, M, KX, NP, NCH, pid_m, pid_n, pid_k, SPLIT_K, stride_xm,
                      GS, BITS, R, ZC, HAS_Z, HAS_OFF, HAS_SUP, WN, WK, UNIT, NB, EVEN_K, EVEN_N, PREFETCH, SUBZ,
                      STAGE_X, VEC_PARAMS, USE_ASM, ASM, CONSTRAINTS)
    offs_m = pid_m * (8 * NB) + tl.arange(0, 8 * NB)
    offs_n = pid_n * (32 * WN) + tl.arange(0, 32 * WN)
    store_split(Y, BIAS, PART, LOCK, out, offs_m, offs_n, M, N, stride_ym, pid_m * tl.num_programs(1) + pid_n,
                pid_k, SPLIT_K, HAS_BIAS, SPLIT, 8 * NB, 32 * WN, SUM_ROWS)


@triton.jit
def qmv_tc_body(X, W, S, Z, OFF, SUP, M, KX, NP, NCH, pid_m, pid_n, pid_k, SPLIT_K, stride_xm,
                GS: tl.constexpr, BITS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr,
                HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr,
                WN: tl.constexpr, WK: tl.constexpr, UNIT: tl.constexpr, NB: tl.constexpr,
                EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, PREFETCH: tl.constexpr, SUBZ: tl.constexpr,
                STAGE_X: tl.constexpr, VEC_PARAMS: tl.constexpr, USE_ASM: tl.constexpr,
                ASM: tl.constexpr, CONSTRAINTS: tl.constexpr):
    """The ``[8 NB, 32 WN]`` float32 tile of rows set ``pid_m``, columns ``pid_n`` over split ``pid_k`` of
    ``SPLIT_K`` (a function, so a kernel may run several layouts' splits in one launch: ``exl2_tc.py``).

    The row sets of one weight tile run side by side, so all but the first read its words from L2; ``WN x WK``
    warps: ``WN`` strips of 32 columns, each walked by ``WK`` warps taking turns over the CTA's steps (their sums
    meet in shared memory at the end). x is in sorted order with ``KX`` (even) columns; ``NCH`` field blocks
    (chunks) of ``R`` word rows; ``UNIT`` chunks per step, inside one group or whole groups (small groups: each
    group's terms are added after its chunks, so a step still loads ``UNIT`` chunks at once); ``NB`` sets of 8
    rows share each dequantized chunk;
    ``PREFETCH`` loads the next step's words and x before this step's MMAs."""
    PF: tl.constexpr = 32 // BITS
    NF: tl.constexpr = PF * R // 8  # fields of a word one lane uses per chunk
    HR: tl.constexpr = R // 2  # lanes sharing the chunk's rows: t % HR picks the rows, t // HR the fields
    CK: tl.constexpr = R * PF
    CPG: tl.constexpr = GS // CK  # chunks per group (the layout makes CK divide GS)
    PER_GROUP: tl.constexpr = UNIT > CPG  # a step spans several groups (then CPG divides UNIT)
    BLOCK_N: tl.constexpr = 32 * WN
    L: tl.constexpr = 32 * WN * WK
    ROWS: tl.constexpr = 8 * NB
    IS_BF16: tl.constexpr = X.dtype.element_ty == tl.bfloat16
    MAGIC: tl.constexpr = 128.0 if IS_BF16 else 1024.0
    ZM: tl.constexpr = 0.0 if IS_BF16 and BITS == 8 else MAGIC  # the asm's zero pairs: -(ZM + z)
    SUB_E: tl.constexpr = SUBZ and USE_ASM  # C already holds sum (q - z) x (the twin always sums (m + q) x)
    lane = tl.arange(0, L)[:, None]
    c4 = tl.arange(0, 4)[None, :]
    g = (lane % 32) // 4
    t = lane % 4
    wcol = pid_n * BLOCK_N + ((lane // 32) % WN) * 32 + 4 * g
    cols = wcol + c4  # the lane's 4 word columns (one 16-byte load per word row)
    ccol = wcol + c4 // 2  # column of tile 0's C element c (tile 1: + 2)
    mrow0 = pid_m * ROWS + 2 * t + c4 % 2  # x row of C element c (set 1: + 8)
    mrow1 = tl.where(mrow0 + 8 < M, mrow0 + 8, -1)
    mrow0 = tl.where(mrow0 < M, mrow0, -1)
    nmask = (cols < NP) | EVEN_N
    nmask0 = (ccol < NP) | EVEN_N
    nmask1 = (ccol + 2 < NP) | EVEN_N
    rp = 2 * (t % HR)
    shift = (t // HR) * (NF * BITS)
    xm = pid_m * ROWS + g  # the lane's B column: x row (set 1: + 8)
    koff = (t // HR) * (NF * R) + rp
    xbase0 = xm * (stride_xm // 2) + koff // 2
    xbase1 = xbase0 + 8 * (stride_xm // 2)
    xmask0 = xm < M
    xmask1 = xm + 8 < M
    X32 = X.to(tl.pointer_type(tl.int32), bitcast=True)
    # staged x only for field blocks of 8 rows (groups of 64+ 4-bit / 128+ 2-bit codes): with fewer rows the
    # reshape's layout won Triton's layout choice for the asm and mispacked its operands (offline TTGIR, H200);
    # and only with 8+ fields a lane: 8-bit codes' 4 (one [L, 4] tensor) came out wrong on an H100 (gpu_check)
    STAGE: tl.constexpr = STAGE_X and USE_ASM and WK == 1 and R == 8 and NF >= 8
    srow0 = pid_m * ROWS
    stride32 = stride_xm // 2
    nunits = NCH // UNIT
    per = tl.cdiv(nunits, SPLIT_K)
    u0 = pid_k * per
    u1 = tl.minimum(u0 + per, nunits)
    uw = u0 + lane // (32 * WN)  # this warp's first step; then every WK-th
    acc0 = tl.zeros((L, 4), dtype=tl.float32)
    acc1 = tl.zeros((L, 4), dtype=tl.float32)
    acc2 = tl.zeros((L, 4), dtype=tl.float32)
    acc3 = tl.zeros((L, 4), dtype=tl.float32)
    if USE_ASM and PREFETCH:
        un = tl.minimum(uw, nunits - 1)
        n0, n1, n2, n3, n4, n5, n6, n7 = _unit_words(W, un, UNIT, R, rp, NP, cols, nmask, shift)
        q0, q1, q2, q3, q4, q5, q6, q7 = unit_x(X32, xbase0, koff, xmask0 & (uw < u1), srow0, M, stride32, u0 < u1,
                                                un, tl.minimum(u0, nunits - 1), UNIT, CK, NF, R, WN, KX, EVEN_K,
                                                STAGE)
    for i in range(0, tl.cdiv(u1 - u0, WK)):
        u = uw + i * WK
        live = u < u1
        us = u0 + i * WK  # the step as a scalar (the staged x's: one warp along K)
        ucs = tl.minimum(us, nunits - 1)
        uc = tl.minimum(u, nunits - 1)
        c0 = tl.zeros((L, 4), dtype=tl.float32)
        c1 = tl.zeros((L, 4), dtype=tl.float32)
        cx = tl.zeros((L, 4), dtype=tl.float32)
        e0 = tl.zeros((L, 4), dtype=tl.float32)
        e1 = tl.zeros((L, 4), dtype=tl.float32)
        ex = tl.zeros((L, 4), dtype=tl.float32)
        if USE_ASM:
            zz = _neg_zero_pairs(Z, (uc * UNIT * CK) // GS, NP, cols, nmask, ZC, ZM, HAS_Z, IS_BF16, L)
            if PREFETCH:
                w0, w1, w2, w3, w4, w5, w6, w7 = n0, n1, n2, n3, n4, n5, n6, n7
                p0, p1, p2, p3, p4, p5, p6, p7 = q0, q1, q2, q3, q4, q5, q6, q7
                un = tl.minimum(u + WK, nunits - 1)
                n0, n1, n2, n3, n4, n5, n6, n7 = _unit_words(W, un, UNIT, R, rp, NP, cols, nmask, shift)
                q0, q1, q2, q3, q4, q5, q6, q7 = unit_x(X32, xbase0, koff, xmask0 & (u + WK < u1), srow0, M,
                                                        stride32, us + WK < u1, un, tl.minimum(us + WK, nunits - 1),
                                                        UNIT, CK, NF, R, WN, KX, EVEN_K, STAGE)
            else:
                w0, w1, w2, w3, w4, w5, w6, w7 = _unit_words(W, uc, UNIT, R, rp, NP, cols, nmask, shift)
                p0, p1, p2, p3, p4, p5, p6, p7 = unit_x(X32, xbase0, koff, xmask0 & live, srow0, M, stride32,
                                                        us < u1, uc, ucs, UNIT, CK, NF, R, WN, KX, EVEN_K, STAGE)
        for ci in tl.static_range(UNIT):
            kbase = (uc * UNIT + ci) * CK
            if USE_ASM:
                if PER_GROUP and HAS_Z and ci > 0 and ci % CPG == 0:  # the next group's zeros
                    zz = _neg_zero_pairs(Z, kbase // GS, NP, cols, nmask, ZC, ZM, HAS_Z, IS_BF16, L)
                if ci == 0:
                    wa, wb, x0, x1, x2, x3 = w0, w1, p0, p1, p2, p3
                elif ci == 1:
                    wa, wb, x0, x1, x2, x3 = w2, w3, p4, p5, p6, p7
                else:
                    wa, wb = (w4, w5) if ci == 2 else (w6, w7)
                    x0, x1, x2, x3 = chunk_x(X32, xbase0, koff, xmask0 & live, srow0, M, stride32, us < u1, kbase,
                                             (ucs * UNIT + ci) * CK, NF, R, WN, KX, EVEN_K, STAGE)
                if NB == 2:
                    y0, y1, y2, y3 = chunk_x(X32, xbase1, koff, xmask1 & live, srow0 + 8, M, stride32, us < u1,
                                             kbase, (ucs * UNIT + ci) * CK, NF, R, WN, KX, EVEN_K, STAGE)
                else:
                    y0, y1, y2, y3 = x0, x1, x2, x3
                c0, c1, cx, e0, e1, ex = tl.inline_asm_elementwise(
                    ASM, CONSTRAINTS, [wa, wb, x0, x1, x2, x3, y0, y1, y2, y3, c0, c1, cx, e0, e1, ex, zz],
                    dtype=(tl.float32,) * 6, is_pure=True, pack=4)
            else:
                row0 = (uc * UNIT + ci) * R
                d0, d1, dx = _chunk_twin(W, X, NP, row0, ccol, kbase, mrow0, live, KX, stride_xm, nmask0,
                                         nmask1, BITS, R, MAGIC)
                c0, c1, cx = c0 + d0, c1 + d1, cx + dx
                if NB == 2:
                    d0, d1, dx = _chunk_twin(W, X, NP, row0, ccol, kbase, mrow1, live, KX, stride_xm, nmask0,
                                             nmask1, BITS, R, MAGIC)
                    e0, e1, ex = e0 + d0, e1 + d1, ex + dx
            if PER_GROUP and (ci + 1) % CPG == 0:  # this chunk ends a group
                acc0, acc1, acc2, acc3 = group_terms(acc0, acc1, acc2, acc3, c0, c1, cx, e0, e1, ex, S, Z, OFF, SUP,
                                                     kbase // GS, NP, cols, ccol, nmask, nmask0, nmask1, ZC, MAGIC,
                                                     HAS_Z, HAS_OFF, HAS_SUP, SUB_E, NB, L, VEC_PARAMS)
                c0, c1, cx = tl.zeros((L, 4), tl.float32), tl.zeros((L, 4), tl.float32), tl.zeros((L, 4), tl.float32)
                e0, e1, ex = tl.zeros((L, 4), tl.float32), tl.zeros((L, 4), tl.float32), tl.zeros((L, 4), tl.float32)
        if not PER_GROUP:
            acc0, acc1, acc2, acc3 = group_terms(acc0, acc1, acc2, acc3, c0, c1, cx, e0, e1, ex, S, Z, OFF, SUP,
                                                 (uc * UNIT * CK) // GS, NP, cols, ccol, nmask, nmask0, nmask1, ZC,
                                                 MAGIC, HAS_Z, HAS_OFF, HAS_SUP, SUB_E, NB, L, VEC_PARAMS)
    out = _frag_to_tile(_warp_sum(acc0, WK, BLOCK_N), _warp_sum(acc1, WK, BLOCK_N), WN)
    if NB == 2:
        out = stack2(out, _frag_to_tile(_warp_sum(acc2, WK, BLOCK_N), _warp_sum(acc3, WK, BLOCK_N), WN))
    return out


def capability(device: torch.device) -> tuple[int, int] | None:
    """The CUDA device's compute capability (cached per device), None off CUDA (the interpreter)."""
    return _cuda_capability(device.index or 0) if device.type == "cuda" else None


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def tc_reasons(p: Packed, m: int, dtype: torch.dtype, capability: tuple[int, int] | None = None) -> list[str]:
    """Why ``gemv_tc`` cannot run this call ([] when it can); ``capability`` is the CUDA device's (None: the
    interpreter, which runs the plain-Triton twin)."""
    out = []
    if capability is not None and capability < (8, 0):
        out.append(f"compute capability {capability[0]}.{capability[1]} (mma.sync m16n8k16 needs 8.0+)")
    if p.bits not in (2, 4, 8):
        out.append(f"{p.bits}-bit words (gemv_tc takes 2, 4 and 8-bit codes: magic-number LOP3s per code pair)")
    elif (32 // p.bits) * p.rows_per_block // 8 < 4:
        out.append(f"field blocks of {p.rows_per_block} word rows (gemv_tc needs groups of 32+ codes)")
    if dtype not in (torch.float16, torch.bfloat16):
        out.append(f"activation dtype {dtype} (float16 / bfloat16 only)")
    return out


def _pow2_floor(v: int) -> int:
    """The largest power of two <= v (tile sizes are powers of two)."""
    return 1 << (v.bit_length() - 1)


def units(p: Packed, block_k: int) -> int:
    """Chunks (field blocks) per loop step: what ``block_k`` asks, at most 4, dividing K and either dividing
    the group or a multiple of it (a step of whole groups)."""
    ck = p.rows_per_block * (32 // p.bits)
    nch = p.kp // ck
    per_group = nch if p.group >= nch * ck else p.group // ck
    u = max(1, min(4, block_k // ck))
    while u > 1 and (nch % u or (per_group % u and u % per_group)):  # inside one group, or whole groups
        u //= 2
    return u


def qmv_tc(x2: torch.Tensor, p: Packed, cfg: object, bias: torch.Tensor | None, lock: torch.Tensor | None,
           y: torch.Tensor, use_asm: bool) -> torch.Tensor:
    """Launch ``qmv_tc_kernel``: x in sorted order with an even row length (one gather or pad when not).
    ``cfg.sub_zero``: the asm subtracts ``m + z`` per pair (an FMA per two codes) instead of a third MMA."""

    m = x2.shape[0]
    why = tc_reasons(p, m, x2.dtype, capability(x2.device))
    if why:
        raise ValueError("gemv_tc cannot run this call: " + "; ".join(why))
    if p.perm is not None:
        x2, kx = gather_cols(x2, p), p.kp
    elif p.k % 2 or x2.stride(1) != 1 or x2.stride(0) % 2 or x2.data_ptr() % 4:
        x2, kx = torch.nn.functional.pad(x2, (0, p.kp - p.k)).contiguous(), p.kp
    else:
        kx = p.k
    ck = p.rows_per_block * (32 // p.bits)
    nch = p.kp // ck
    unit = units(p, cfg.block_k)
    warps = cfg.num_warps
    wn = max(1, min(warps, cfg.block_n // 32))
    tiles_n = triton.cdiv(p.n, 32 * wn)
    nb = 2 if m > SET_ROWS and cfg.block_m > SET_ROWS else 1
    # rows the split-K tail sums per pass: sum_values partials a thread, 32 warps threads over 32 wn columns
    sum_rows = min(SET_ROWS * nb, _pow2_floor(max(1, cfg.sum_values * warps // wn)))
    tiles_m = triton.cdiv(m, SET_ROWS * nb)
    split = max(1, min(cfg.split_k, nch // unit)) if lock is not None and tiles_n * tiles_m <= lock.numel() else 1
    part = torch.empty((split, m, p.n), dtype=torch.float32, device=x2.device) if split > 1 else y
    nf = (32 // p.bits) * p.rows_per_block // 8
    subz = cfg.sub_zero or (p.bits == 8 and x2.dtype == torch.bfloat16)  # the only 8-bit bf16 form (qmv_tc_asm)
    asm = mma_asm(p.bits, nf, x2.dtype == torch.bfloat16, nb, subz, not subz or p.offsets is not None)
    qmv_tc_kernel[(tiles_m, tiles_n, split)](
        x2, p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales, p.offset_arg(), p.super_arg(),
        bias if bias is not None else y, y, part, lock if lock is not None else p.qweight,
        m, p.n, kx, p.np, nch, split, x2.stride(0), y.stride(0),
        GS=p.group, BITS=p.bits, R=p.rows_per_block, ZC=p.zero_const, HAS_Z=p.zeros is not None,
        HAS_OFF=p.offsets is not None, HAS_SUP=p.supers is not None, HAS_BIAS=bias is not None, WN=wn,
        WK=warps // wn, UNIT=unit, NB=nb,
        SPLIT=split > 1, EVEN_K=kx == p.kp, EVEN_N=p.np % (32 * wn) == 0, PREFETCH=cfg.prefetch, SUBZ=subz,
        STAGE_X=cfg.stage_x, SUM_ROWS=sum_rows, VEC_PARAMS=cfg.vector_params,
        USE_ASM=use_asm, ASM=asm, CONSTRAINTS=MMA_CONSTRAINTS, num_warps=warps, num_stages=1,
        **({"maxnreg": cfg.max_registers} if cfg.max_registers and use_asm else {}))
    return y
