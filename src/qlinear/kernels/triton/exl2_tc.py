"""EXL2's segments in one ``gemv_tc`` launch: the decode GEMV of a mixed-bit layer without a launch per width.

Why: an EXL2 layer runs as up to three GPTQ layouts (8, 4 and 2-bit words, ``exl2_runtime``). Run one after
another, each segment gathers its activations, launches its own GEMV and adds its product: eight launches, 30.1 us
at M = 1 on an H100 for a 4096x14336 layer at 3.9 bits; this way two launches, 23.4 us
(``results/h100-gpu-exl2-one-launch-2026-12-07.md``). The activations of every segment are gathered by one launch
into one buffer (each segment's sorted rows at an even offset), and one kernel runs ``qmv_tc_body`` for every
segment: its split-K axis is the concatenation of the segments' splits (split ``k`` belongs to the first segment
whose splits reach past it), and the split-K epilogue sums all of them, so the segments' sum is the split-K sum
itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import exl2_runtime
from .common import store_split
from .configs import Config
from .layout import Packed
from .qmv_tc import SET_ROWS, _pow2_floor, capability, qmv_tc_body, tc_reasons, units
from .qmv_tc_asm import MMA_CONSTRAINTS, mma_asm

#: the most segments one launch takes (EXL2's 8, 4 and 2-bit word widths)
MAX_SEGMENTS = 3


@triton.jit
def _seg(X, W, S, M, KX, NP, NCH, pid_m, pid_n, pid_k, SPL, stride_xm, GS: tl.constexpr, BITS: tl.constexpr,
         R: tl.constexpr, ZC: tl.constexpr, UNIT: tl.constexpr, EVEN_K: tl.constexpr, SUBZ: tl.constexpr,
         ASM: tl.constexpr, WN: tl.constexpr, WK: tl.constexpr, NB: tl.constexpr, EVEN_N: tl.constexpr,
         PREFETCH: tl.constexpr, STAGE_X: tl.constexpr, VEC_PARAMS: tl.constexpr, USE_ASM: tl.constexpr,
         CONSTRAINTS: tl.constexpr):
    """One segment's share of the tile: its split ``pid_k`` of ``SPL`` (constant zero point, no offsets)."""
    return qmv_tc_body(X, W, S, S, S, S, M, KX, NP, NCH, pid_m, pid_n, pid_k, SPL, stride_xm,
                       GS, BITS, R, ZC, False, False, False, WN, WK, UNIT, NB, EVEN_K, EVEN_N, PREFETCH, SUBZ,
                       STAGE_X, VEC_PARAMS, USE_ASM, ASM, CONSTRAINTS)


@triton.jit
def exl2_tc_kernel(X, W0, S0, W1, S1, W2, S2, BIAS, Y, PART, LOCK, M, N, NP, stride_xm, stride_ym, SPLIT_K,
                   XO1, XO2, KX0, KX1, KX2, NCH0, NCH1, NCH2, SPL0, SPL1, SPL2,
                   GS0: tl.constexpr, BITS0: tl.constexpr, R0: tl.constexpr, ZC0: tl.constexpr,
                   UNIT0: tl.constexpr, EVEN_K0: tl.constexpr, SUBZ0: tl.constexpr, ASM0: tl.constexpr,
                   GS1: tl.constexpr, BITS1: tl.constexpr, R1: tl.constexpr, ZC1: tl.constexpr,
                   UNIT1: tl.constexpr, EVEN_K1: tl.constexpr, SUBZ1: tl.constexpr, ASM1: tl.constexpr,
                   GS2: tl.constexpr, BITS2: tl.constexpr, R2: tl.constexpr, ZC2: tl.constexpr,
                   UNIT2: tl.constexpr, EVEN_K2: tl.constexpr, SUBZ2: tl.constexpr, ASM2: tl.constexpr,
                   NSEG: tl.constexpr, HAS_BIAS: tl.constexpr, WN: tl.constexpr, WK: tl.constexpr,
                   NB: tl.constexpr, EVEN_N: tl.constexpr, PREFETCH: tl.constexpr, STAGE_X: tl.constexpr,
                   VEC_PARAMS: tl.constexpr, SPLIT: tl.constexpr, SUM_ROWS: tl.constexpr, USE_ASM: tl.constexpr,
                   CONSTRAINTS: tl.constexpr):
    """Grid ``(M / (8 NB), N / (32 WN), SPL0 + SPL1 + SPL2)``: split ``k`` runs segment 0's split ``k`` below
    ``SPL0``, segment 1's ``k - SPL0`` below ``SPL0 + SPL1``, else segment 2's; x is ``[M, XO1 + ...]`` with
    segment ``i``'s sorted rows from column ``XOi`` (``XO0 = 0``)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if NSEG == 1:  # noqa: SIM114 (a constexpr branch: no runtime test for one segment)
        out = _seg(X, W0, S0, M, KX0, NP, NCH0, pid_m, pid_n, pid_k, SPL0, stride_xm, GS0, BITS0, R0, ZC0, UNIT0,
                   EVEN_K0, SUBZ0, ASM0, WN, WK, NB, EVEN_N, PREFETCH, STAGE_X, VEC_PARAMS, USE_ASM, CONSTRAINTS)
    elif pid_k < SPL0:
        out = _seg(X, W0, S0, M, KX0, NP, NCH0, pid_m, pid_n, pid_k, SPL0, stride_xm, GS0, BITS0, R0, ZC0, UNIT0,
                   EVEN_K0, SUBZ0, ASM0, WN, WK, NB, EVEN_N, PREFETCH, STAGE_X, VEC_PARAMS, USE_ASM, CONSTRAINTS)
    elif NSEG == 2:  # noqa: SIM114 (constexpr, as above)
        out = _seg(X + XO1, W1, S1, M, KX1, NP, NCH1, pid_m, pid_n, pid_k - SPL0, SPL1, stride_xm, GS1, BITS1, R1,
                   ZC1, UNIT1, EVEN_K1, SUBZ1, ASM1, WN, WK, NB, EVEN_N, PREFETCH, STAGE_X, VEC_PARAMS, USE_ASM,
                   CONSTRAINTS)
    elif pid_k < SPL0 + SPL1:
        out = _seg(X + XO1, W1, S1, M, KX1, NP, NCH1, pid_m, pid_n, pid_k - SPL0, SPL1, stride_xm, GS1, BITS1, R1,
                   ZC1, UNIT1, EVEN_K1, SUBZ1, ASM1, WN, WK, NB, EVEN_N, PREFETCH, STAGE_X, VEC_PARAMS, USE_ASM,
                   CONSTRAINTS)
    else:
        out = _seg(X + XO2, W2, S2, M, KX2, NP, NCH2, pid_m, pid_n, pid_k - SPL0 - SPL1, SPL2, stride_xm, GS2,
                   BITS2, R2, ZC2, UNIT2, EVEN_K2, SUBZ2, ASM2, WN, WK, NB, EVEN_N, PREFETCH, STAGE_X, VEC_PARAMS,
                   USE_ASM, CONSTRAINTS)
    offs_m = pid_m * (8 * NB) + tl.arange(0, 8 * NB)
    offs_n = pid_n * (32 * WN) + tl.arange(0, 32 * WN)
    store_split(Y, BIAS, PART, LOCK, out, offs_m, offs_n, M, N, stride_ym, pid_m * tl.num_programs(1) + pid_n,
                pid_k, SPLIT_K, HAS_BIAS, SPLIT, 8 * NB, 32 * WN, SUM_ROWS)


def fused_reasons(packs: list[Packed], m: int, dtype: torch.dtype, device: torch.device) -> list[str]:
    """Why the segments cannot run as one ``gemv_tc`` launch ([] when they can)."""
    if not 1 <= len(packs) <= MAX_SEGMENTS:
        return [f"{len(packs)} segments (one launch takes 1 to {MAX_SEGMENTS})"]
    out = [f"segment {i} ({pk.bits}-bit words): {why}" for i, pk in enumerate(packs)
           for why in tc_reasons(pk, m, dtype, capability(device))]
    if any(pk.zeros is not None or pk.offsets is not None for pk in packs):
        out.append("a segment with a zeros or offsets tensor (EXL2 segments have constant zeros)")
    if m > 2 * SET_ROWS:
        out.append(f"M = {m} rows (one launch takes M <= {2 * SET_ROWS}: gemv_tc's two row sets)")
    return out


def segment_splits(packs: list[Packed], units_: list[int], split: int) -> list[int]:
    """Splits per segment: ``split`` shared in proportion to the segments' bytes, at least one each and at most one
    a step."""
    nbytes = [pk.qweight.numel() for pk in packs]
    total = sum(nbytes)
    return [max(1, min(round(split * b / total), (pk.kp // (pk.rows_per_block * (32 // pk.bits))) // u))
            for pk, b, u in zip(packs, nbytes, units_)]


def exl2_tc(xs: torch.Tensor, plan: exl2_runtime.XPlan, packs: list[Packed], cfg: Config, bias: torch.Tensor | None,
            lock: torch.Tensor, use_asm: bool) -> torch.Tensor:
    """``y [M, N]`` from the gathered activations ``xs`` (``plan``'s columns) and the segments, in one launch, for a
    call ``fused_reasons`` accepts (the caller asks it first: ``Exl2TritonLinear.fused_config``). ``cfg`` sets the
    shared tiling (``block_n``, warps, prefetch, staged x, parameter loads) and the total split, shared among the
    segments by bytes."""
    m, n, np_ = xs.shape[0], packs[0].n, packs[0].np
    y = torch.empty((m, n), dtype=xs.dtype, device=xs.device)
    if m == 0:
        return y
    warps = cfg.num_warps
    wn = max(1, min(warps, cfg.block_n // 32))
    nb = 2 if m > SET_ROWS and cfg.block_m > SET_ROWS else 1
    tiles_m, tiles_n = triton.cdiv(m, SET_ROWS * nb), triton.cdiv(n, 32 * wn)
    unit = [units(pk, cfg.block_k) for pk in packs]
    splits = segment_splits(packs, unit, cfg.split_k * len(packs))
    total = sum(splits)
    if tiles_m * tiles_n > lock.numel():
        raise ValueError(f"lock: {lock.numel()} split-K counters for {tiles_m * tiles_n} tiles")
    part = torch.empty((total, m, n), dtype=torch.float32, device=xs.device) if total > 1 else y
    bf16 = xs.dtype == torch.bfloat16
    pad = MAX_SEGMENTS - len(packs)  # absent segments repeat the last one with no splits (never run)
    full, unit = [*packs, *[packs[-1]] * pad], [*unit, *[unit[-1]] * pad]
    offs, width = [*plan.offsets, *[plan.offsets[-1]] * pad], [*plan.widths, *[plan.widths[-1]] * pad]
    spl = [*splits, *[0] * pad]
    seg: dict[str, object] = {}
    for i, pk in enumerate(full):
        subz = cfg.sub_zero or (pk.bits == 8 and bf16)
        nf = (32 // pk.bits) * pk.rows_per_block // 8
        seg.update({f"GS{i}": pk.group, f"BITS{i}": pk.bits, f"R{i}": pk.rows_per_block, f"ZC{i}": pk.zero_const,
                    f"UNIT{i}": unit[i], f"EVEN_K{i}": width[i] == pk.kp, f"SUBZ{i}": subz,
                    f"ASM{i}": mma_asm(pk.bits, nf, bf16, nb, subz, not subz)})
    sum_rows = min(SET_ROWS * nb, _pow2_floor(max(1, cfg.sum_values * warps // wn)))
    exl2_tc_kernel[(tiles_m, tiles_n, total)](
        xs, full[0].qweight, full[0].scales, full[1].qweight, full[1].scales, full[2].qweight, full[2].scales,
        bias if bias is not None else y, y, part, lock, m, n, np_, xs.stride(0), y.stride(0), total,
        offs[1], offs[2], *width, *[pk.kp // (pk.rows_per_block * (32 // pk.bits)) for pk in full], *spl,
        **seg, NSEG=len(packs), HAS_BIAS=bias is not None, WN=wn, WK=warps // wn, NB=nb,
        EVEN_N=np_ % (32 * wn) == 0, PREFETCH=cfg.prefetch, STAGE_X=cfg.stage_x, VEC_PARAMS=cfg.vector_params,
        SPLIT=total > 1, SUM_ROWS=sum_rows, USE_ASM=use_asm, CONSTRAINTS=MMA_CONSTRAINTS, num_warps=warps,
        num_stages=1, **({"maxnreg": cfg.max_registers} if cfg.max_registers and use_asm else {}))
    return y
