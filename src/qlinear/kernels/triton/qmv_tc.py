"""``gemv_tc``: the decode GEMV (M <= 8 per program) on tensor cores, reading the field-blocked words as they are.

Why: the CUDA-core GEMV spends ~4 instructions per weight (LOP3, FFMA (q - z), FFMA (x), addresses), as much
issue time as its bytes take to stream (``benchmarks/triton_notes.md``). Here each warp runs
``mma.sync.m16n8k16`` with the weights as A (16 output channels x 16 K slots) and the activations as B
(16 K slots x 8 rows): the dequantization is one PRMT and two LOP3 per four codes, and the multiply-add is
one tensor-core instruction per 256 weights, so M = 1..8 costs the same.

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

import torch
import triton
import triton.language as tl

from .common import store_split
from .layout import Packed

#: activation rows per program (B's 8 columns)
ROWS = tl.constexpr(8)



def mma_asm(bits: int, nf: int, bf16: bool) -> str:
    """PTX of one chunk for one lane: words ``$12..$19`` (4 columns x 2 rows), x pairs ``$20..``, C in after.

    Outputs ``$0..$3`` C of tile 0, ``$4..$7`` tile 1, ``$8..$11`` Cx; ``nf`` fields per word are used
    (two per K16 step), so ``nf / 2`` steps, three MMAs each.
    """
    magic = "0x43004300" if bf16 else "0x64006400"
    one = "0x3F803F80" if bf16 else "0x3C003C00"
    ty = "bf16" if bf16 else "f16"
    mask = "0x000F000F" if bits == 4 else "0x00030003"
    per_byte = 8 // bits
    xin = 20
    cin = xin + nf
    lines = ["{", ".reg .b32 t, u, one;", f".reg .b32 p<{4 * nf}>;", f"mov.b32 one, {one};"]
    for c in range(4):
        for x in range(nf // per_byte):
            sel = x | x << 4 | (4 + x) << 8 | (4 + x) << 12
            lines.append(f"prmt.b32 t, ${12 + c}, ${16 + c}, {sel:#06x};")
            for i in range(per_byte):
                src = "t"
                if i:
                    lines.append(f"shr.u32 u, t, {bits * i};")
                    src = "u"
                lines.append(f"lop3.b32 p{c * nf + per_byte * x + i}, {src}, {mask}, {magic}, 0xEA;")
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32"
    for s in range(nf // 2):
        fa, fb = 2 * s, 2 * s + 1
        b = f"{{${xin + fa}, ${xin + fb}}}"
        for tile, (c0, c1) in enumerate(((0, 1), (2, 3))):
            d = ", ".join(f"${4 * tile + i}" for i in range(4))
            src = ", ".join(f"${(cin + 4 * tile if s == 0 else 4 * tile) + i}" for i in range(4))
            a = f"p{c0 * nf + fa}, p{c1 * nf + fa}, p{c0 * nf + fb}, p{c1 * nf + fb}"
            lines.append(f"{mma} {{{d}}}, {{{a}}}, {b}, {{{src}}};")
        d = ", ".join(f"${8 + i}" for i in range(4))
        src = ", ".join(f"${(cin + 8 if s == 0 else 8) + i}" for i in range(4))
        lines.append(f"{mma} {{{d}}}, {{one, one, one, one}}, {b}, {{{src}}};")
    return "\n".join([*lines, "}"])


def mma_constraints(nf: int) -> str:
    return ",".join(["=f"] * 12 + ["r"] * (8 + nf) + ["f"] * 12)


@triton.jit
def _x_pairs(X32, xbase, koff, xmask, kbase, i: tl.constexpr, R: tl.constexpr, KX, EVEN_K: tl.constexpr):
    """x pairs (int32: two activations) of the lane's local fields ``4i .. 4i+3``: sorted rows
    ``kbase + koff + f R (+1)``, ``koff = (t // HR) NF R + rp`` the lane's offset; ``xbase`` is its row plus
    ``koff / 2`` in int32 units, so field ``f`` adds the constant ``f R / 2``."""
    f = 4 * i + tl.arange(0, 4)[None, :]
    ptr = X32 + xbase + (kbase // 2 + f * (R // 2))
    if EVEN_K:
        return tl.load(ptr, mask=xmask, other=0)
    return tl.load(ptr, mask=xmask & (kbase + koff + f * R < KX), other=0)


@triton.jit
def _chunk_twin(W, X, NP, row0, ccol, kbase, mrow, KX, stride_xm, nmask0, nmask1,
                BITS: tl.constexpr, R: tl.constexpr, MAGIC: tl.constexpr):
    """Plain-Triton C0, C1, Cx increments of one chunk (the interpreter's stand-in for the MMAs): for C
    element ``(lane, c)`` of tile 0 (column ``ccol``, x row ``mrow``), ``sum_k (m + q) x`` over the chunk."""
    PF: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    rr = tl.arange(0, R)
    jj = tl.arange(0, PF)
    kk = kbase + jj[None, :] * R + rr[:, None]  # [R, PF]: field j of word row r is sorted row kbase + j R + r
    ok = (mrow >= 0)[:, :, None, None] & (kk < KX)[None, None, :, :]
    xv = tl.load(X + mrow[:, :, None, None] * stride_xm + kk[None, None, :, :], mask=ok, other=0.0).to(tl.float32)
    cx = tl.sum(tl.sum(xv, axis=3), axis=2)
    w0 = tl.load(W + (row0 + rr)[None, None, :] * NP + ccol[:, :, None], mask=nmask0[:, :, None], other=0)
    w1 = tl.load(W + (row0 + rr)[None, None, :] * NP + ccol[:, :, None] + 2, mask=nmask1[:, :, None], other=0)
    q0 = ((w0[:, :, :, None] >> (BITS * jj)[None, None, None, :]) & MASK).to(tl.float32)
    q1 = ((w1[:, :, :, None] >> (BITS * jj)[None, None, None, :]) & MASK).to(tl.float32)
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
def _frag_to_tile(a0, a1, WARPS: tl.constexpr):
    """The two C tiles' ``[L, 4]`` fragments as ``[8, 32 * WARPS]`` (x row, column) for ``store_split``:
    element ``(w, g, t, c)`` of tile ``i`` is row ``2t + c % 2``, column ``32 w + 4 g + 2 i + c // 2``."""
    both = tl.join(a0, a1)  # [L, 4, 2]: (w g t, ch cl, tile)
    six = tl.reshape(both, (WARPS, 8, 4, 2, 2, 2))  # (w, g, t, ch, cl, tile)
    return tl.reshape(tl.permute(six, (2, 4, 0, 1, 5, 3)), (8, 32 * WARPS))


@triton.jit
def qmv_tc_kernel(X, W, S, Z, OFF, BIAS, Y, PART, LOCK,
                  M, N, KX, NP, NCH, SPLIT_K, stride_xm, stride_ym,
                  GS: tl.constexpr, BITS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr,
                  HAS_Z: tl.constexpr, HAS_OFF: tl.constexpr, HAS_BIAS: tl.constexpr,
                  WARPS: tl.constexpr, UNIT: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                  EVEN_N: tl.constexpr,
                  USE_ASM: tl.constexpr, ASM: tl.constexpr, CONSTRAINTS: tl.constexpr):
    """Grid ``(N / (32 WARPS), SPLIT_K, M / 8)``; x in sorted order with ``KX`` (even) columns; ``NCH`` field
    blocks (chunks) of ``R`` word rows; ``UNIT`` chunks per step, all inside one group."""
    PF: tl.constexpr = 32 // BITS
    NF: tl.constexpr = PF * R // 8  # fields of a word one lane uses per chunk
    HR: tl.constexpr = R // 2  # lanes sharing the chunk's rows: t % HR picks the rows, t // HR the fields
    CK: tl.constexpr = R * PF
    BLOCK_N: tl.constexpr = 32 * WARPS
    IS_BF16: tl.constexpr = X.dtype.element_ty == tl.bfloat16
    MAGIC: tl.constexpr = 128.0 if IS_BF16 else 1024.0
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    lane = tl.arange(0, BLOCK_N)[:, None]
    c4 = tl.arange(0, 4)[None, :]
    g = (lane % 32) // 4
    t = lane % 4
    wcol = pid_n * BLOCK_N + (lane // 32) * 32 + 4 * g
    cols = wcol + c4  # the lane's 4 word columns (one 16-byte load per word row)
    ccol = wcol + c4 // 2  # column of tile 0's C element c (tile 1: + 2)
    mrow = pid_m * ROWS + 2 * t + c4 % 2  # x row of C element c
    mrow = tl.where(mrow < M, mrow, -1)
    nmask = (cols < NP) | EVEN_N
    nmask0 = (ccol < NP) | EVEN_N
    nmask1 = (ccol + 2 < NP) | EVEN_N
    rp = 2 * (t % HR)
    shift = (t // HR) * (NF * BITS)
    xm = pid_m * ROWS + g  # the lane's B column: x row
    koff = (t // HR) * (NF * R) + rp
    xbase = xm * (stride_xm // 2) + koff // 2
    xmask = xm < M
    X32 = X.to(tl.pointer_type(tl.int32), bitcast=True)
    nunits = NCH // UNIT
    per = tl.cdiv(nunits, SPLIT_K)
    u0 = pid_k * per
    u1 = tl.minimum(u0 + per, nunits)
    acc0 = tl.zeros((BLOCK_N, 4), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, 4), dtype=tl.float32)
    for u in range(u0, u1):
        c0 = tl.zeros((BLOCK_N, 4), dtype=tl.float32)
        c1 = tl.zeros((BLOCK_N, 4), dtype=tl.float32)
        cx = tl.zeros((BLOCK_N, 4), dtype=tl.float32)
        for ci in tl.static_range(UNIT):
            ch = u * UNIT + ci
            kbase = ch * CK
            if USE_ASM:
                wa, wb = _word_pair(W, ch * R + rp, NP, cols, nmask, shift)
                x0 = _x_pairs(X32, xbase, koff, xmask, kbase, 0, R, KX, EVEN_K)
                if NF == 4:
                    c0, c1, cx = tl.inline_asm_elementwise(ASM, CONSTRAINTS, [wa, wb, x0, c0, c1, cx],
                                                           dtype=(tl.float32,) * 3, is_pure=True, pack=4)
                elif NF == 8:
                    x1 = _x_pairs(X32, xbase, koff, xmask, kbase, 1, R, KX, EVEN_K)
                    c0, c1, cx = tl.inline_asm_elementwise(ASM, CONSTRAINTS, [wa, wb, x0, x1, c0, c1, cx],
                                                           dtype=(tl.float32,) * 3, is_pure=True, pack=4)
                else:
                    x1 = _x_pairs(X32, xbase, koff, xmask, kbase, 1, R, KX, EVEN_K)
                    x2 = _x_pairs(X32, xbase, koff, xmask, kbase, 2, R, KX, EVEN_K)
                    x3 = _x_pairs(X32, xbase, koff, xmask, kbase, 3, R, KX, EVEN_K)
                    c0, c1, cx = tl.inline_asm_elementwise(ASM, CONSTRAINTS, [wa, wb, x0, x1, x2, x3, c0, c1, cx],
                                                           dtype=(tl.float32,) * 3, is_pure=True, pack=4)
            else:
                d0, d1, dx = _chunk_twin(W, X, NP, ch * R, ccol, kbase, mrow, KX, stride_xm, nmask0, nmask1,
                                         BITS, R, MAGIC)
                c0 += d0
                c1 += d1
                cx += dx
        grp = (u * UNIT * CK) // GS
        s0 = tl.load(S + grp * NP + ccol, mask=nmask0, other=0.0).to(tl.float32)
        s1 = tl.load(S + grp * NP + ccol + 2, mask=nmask1, other=0.0).to(tl.float32)
        if HAS_Z:
            z0 = tl.load(Z + grp * NP + ccol, mask=nmask0, other=0).to(tl.float32) + MAGIC
            z1 = tl.load(Z + grp * NP + ccol + 2, mask=nmask1, other=0).to(tl.float32) + MAGIC
        else:
            z0 = tl.full((BLOCK_N, 4), ZC + MAGIC, tl.float32)
            z1 = z0
        acc0 += s0 * (c0 - z0 * cx)
        acc1 += s1 * (c1 - z1 * cx)
        if HAS_OFF:
            acc0 += tl.load(OFF + grp * NP + ccol, mask=nmask0, other=0.0) * cx
            acc1 += tl.load(OFF + grp * NP + ccol + 2, mask=nmask1, other=0.0) * cx
    out = _frag_to_tile(acc0, acc1, WARPS)
    offs_m = pid_m * ROWS + tl.arange(0, ROWS)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    store_split(Y, BIAS, PART, LOCK, out, offs_m, offs_n, M, N, stride_ym, pid_m * tl.num_programs(0) + pid_n,
                pid_k, SPLIT_K, HAS_BIAS, SPLIT, ROWS, BLOCK_N)


def tc_reasons(p: Packed, m: int, dtype: torch.dtype) -> list[str]:
    """Why ``gemv_tc`` cannot run this call ([] when it can)."""
    out = []
    if p.bits not in (2, 4):
        out.append(f"{p.bits}-bit words (gemv_tc takes 2 and 4-bit codes: one magic-number LOP3 per code pair)")
    elif (32 // p.bits) * p.rows_per_block // 8 < 4:
        out.append(f"field blocks of {p.rows_per_block} word rows (gemv_tc needs groups of 32+ codes)")
    if dtype not in (torch.float16, torch.bfloat16):
        out.append(f"activation dtype {dtype} (float16 / bfloat16 only)")
    return out


def units(p: Packed, block_k: int) -> int:
    """Chunks (field blocks) per loop step: what ``block_k`` asks, at most 4, dividing the group and K."""
    ck = p.rows_per_block * (32 // p.bits)
    nch = p.kp // ck
    per_group = nch if p.group >= nch * ck else p.group // ck
    u = max(1, min(4, block_k // ck))
    while u > 1 and (nch % u or per_group % u):
        u //= 2
    return u


def qmv_tc(x2: torch.Tensor, p: Packed, cfg: object, bias: torch.Tensor | None, lock: torch.Tensor | None,
           y: torch.Tensor, use_asm: bool) -> torch.Tensor:
    """Launch ``qmv_tc_kernel``: x in sorted order with an even row length (one gather or pad when not)."""
    from .qmm import gather_cols

    m = x2.shape[0]
    why = tc_reasons(p, m, x2.dtype)
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
    tiles_n = triton.cdiv(p.n, 32 * warps)
    tiles_m = triton.cdiv(m, ROWS)
    split = max(1, min(cfg.split_k, nch // unit)) if lock is not None and tiles_n * tiles_m <= lock.numel() else 1
    part = torch.empty((split, m, p.n), dtype=torch.float32, device=x2.device) if split > 1 else y
    nf = (32 // p.bits) * p.rows_per_block // 8
    qmv_tc_kernel[(tiles_n, split, tiles_m)](
        x2, p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales, p.offset_arg(),
        bias if bias is not None else y, y, part, lock if lock is not None else p.qweight,
        m, p.n, kx, p.np, nch, split, x2.stride(0), y.stride(0),
        GS=p.group, BITS=p.bits, R=p.rows_per_block, ZC=p.zero_const, HAS_Z=p.zeros is not None,
        HAS_OFF=p.offsets is not None, HAS_BIAS=bias is not None, WARPS=warps, UNIT=unit, SPLIT=split > 1,
        EVEN_K=kx == p.kp, EVEN_N=p.np % (32 * warps) == 0, USE_ASM=use_asm,
        ASM=mma_asm(p.bits, nf, x2.dtype == torch.bfloat16),
        CONSTRAINTS=mma_constraints(nf), num_warps=warps, num_stages=1)
    return y
