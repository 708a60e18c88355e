"""The CUDA-core bodies for FP8 weights (``fp8mm``'s ``gemv`` and ``dense`` variants) and the FP8 decode they
share with the tensor-core body.

``gemv``: grid ``(N tiles, SPLIT_K, M / ROWS)``; each program streams a ``[BN, BK]`` byte tile per step (16-byte
loads along K), decodes it to float32 once and multiplies it into one ``[BN, BK]`` float32 accumulator per
row (1, 2 or 4 rows; exact products), reduced along K once at the end; block scales per ``fp_common``.
``dense``: ``w * scale`` written in the activation dtype (one rounding per weight), for cuBLAS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import store_split
from .fp_common import (
    GROUPS,
    M_FOLD,
    M_GROUPS,
    M_KCONST,
    M_STEP,
    FConfig,
    elem_scale,
    group_scale,
    k_range,
    scale_mode,
    split_buffers,
    step_scale,
)

#: largest dense chunk (elements) the ``dense`` variant materialises at once
MAX_DENSE = 1 << 28


@triton.jit
def fp8_bits(w, E5: tl.constexpr):
    """FP8 codes -> float16 by bit arithmetic (exact): e5m2 is float16's high byte; e4m3's exponent and
    mantissa land at float16 bits 7-14 (subnormals included), so the value comes out times 2^-8."""
    b = w.to(tl.uint8, bitcast=True).to(tl.uint16)
    if E5:  # noqa: SIM108 (constexpr branch)
        h = b << 8
    else:
        h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
    return h.to(tl.float16, bitcast=True)


@triton.jit
def decode(w, DT: tl.constexpr, BITS: tl.constexpr, E5: tl.constexpr):
    """FP8 codes -> ``DT`` (exact): the hardware conversion, or ``fp8_bits`` (then e4m3 values are times 2^-8:
    the caller multiplies its float32 result by ``wscale(BITS, E5)``)."""
    if BITS:
        return fp8_bits(w, E5).to(DT)
    return w.to(DT)


@triton.jit
def wscale(BITS: tl.constexpr, E5: tl.constexpr):
    return 256.0 if BITS and not E5 else 1.0


@triton.jit
def fp8_gemv_kernel(X, W, S, BIAS, Y, PART, LOCK, M, N, K, stride_xm, stride_ym, SBN, SBK, stride_s, SPLIT_K,
                    NKS, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SCALE_MODE: tl.constexpr, GS: tl.constexpr, BITS: tl.constexpr, E5: tl.constexpr,
                    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr):
    """Grid ``(N tiles, SPLIT_K, M / ROWS)``: per row a ``[BN, BK]`` float32 accumulator of exact products,
    reduced once at the end. Rows past M re-read row M - 1 and are never stored. ``GS``: the block width when
    a step holds whole scale columns (``GROUPS``)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N  # wrapped: every row in range, no N mask on the loads
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    kb0, kb1 = k_range(K, BLOCK_K, SPLIT_K, pid_k)
    srow = (rn // SBN) * stride_s
    w_ptr = W + rn[:, None].to(tl.int64) * K + offs_k[None, :]
    m0 = pid_m * ROWS
    a0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    a1 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    a2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    a3 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK_K
        kk = k0 + offs_k
        if EVEN_K:
            w = decode(tl.load(w_ptr + k0), tl.float32, BITS, E5)
        else:
            w = decode(tl.load(w_ptr + k0, mask=(kk < K)[None, :], other=0.0), tl.float32, BITS, E5)
        if SCALE_MODE == M_STEP:
            w = w * step_scale(S, srow, k0, SBK)[:, None]
        elif SCALE_MODE == M_GROUPS:
            w = w * group_scale(S, srow, k0, NKS, BLOCK_K, GS)
        elif SCALE_MODE == M_FOLD:
            w = w * elem_scale(S, srow, kk, SBK, K)
        a0 += w * load_row(X, m0, kk, K, stride_xm, EVEN_K)[None, :]
        if ROWS > 1:
            a1 += w * load_row(X, tl.minimum(m0 + 1, M - 1), kk, K, stride_xm, EVEN_K)[None, :]
        if ROWS > 2:
            a2 += w * load_row(X, tl.minimum(m0 + 2, M - 1), kk, K, stride_xm, EVEN_K)[None, :]
            a3 += w * load_row(X, tl.minimum(m0 + 3, M - 1), kk, K, stride_xm, EVEN_K)[None, :]
    acc = rows_out(a0, a1, a2, a3, ROWS) * wscale(BITS, E5)
    if SCALE_MODE == M_KCONST:
        acc = acc * tl.load(S + srow)[None, :]
    store_split(Y, BIAS, PART, LOCK, acc, m0 + tl.arange(0, ROWS), offs_n, M, N, stride_ym,
                pid_m * tl.num_programs(0) + pid_n, pid_k, SPLIT_K, HAS_BIAS, SPLIT, ROWS, BLOCK_N, ROWS)


@triton.jit
def rows_out(a0, a1, a2, a3, ROWS: tl.constexpr):
    """``[ROWS, BN]``: the accumulators of rows 0 .. ROWS - 1 summed along K."""
    ridx = tl.arange(0, ROWS)[:, None]
    out = tl.where(ridx == 0, tl.sum(a0, axis=1)[None, :], 0.0)
    if ROWS > 1:
        out += tl.where(ridx == 1, tl.sum(a1, axis=1)[None, :], 0.0)
    if ROWS > 2:
        out += tl.where(ridx == 2, tl.sum(a2, axis=1)[None, :], 0.0)
        out += tl.where(ridx == 3, tl.sum(a3, axis=1)[None, :], 0.0)
    return out


@triton.jit
def load_row(X, m, kk, K, stride_xm, EVEN_K: tl.constexpr):
    """Row ``m`` of x at columns ``kk``, float32."""
    if EVEN_K:
        return tl.load(X + m * stride_xm + kk).to(tl.float32)
    return tl.load(X + m * stride_xm + kk, mask=kk < K, other=0.0).to(tl.float32)


@triton.jit
def fp8_dense_kernel(W, S, OUT, N, K, SBN, SBK, stride_s, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     BITS: tl.constexpr, E5: tl.constexpr):
    """``OUT [N, K] = w * scale`` in OUT's dtype (one rounding per weight)."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    rn = offs_n % N
    mask = (offs_n < N)[:, None] & (kk < K)[None, :]
    off = rn[:, None].to(tl.int64) * K + kk[None, :]
    w = decode(tl.load(W + off, mask=mask, other=0.0), tl.float32, BITS, E5) * wscale(BITS, E5)
    s = elem_scale(S, (rn // SBN) * stride_s, kk, SBK, K)
    tl.store(OUT + off, (w * s).to(OUT.dtype.element_ty), mask=mask)


def decode_by_bits(w: torch.Tensor, dtype: torch.dtype, cfg: FConfig) -> bool:
    """Decode FP8 weights by bit arithmetic (``fp8_bits``) rather than the hardware conversion: when the config
    asks, on GPUs before sm_89 (no FP8 conversions; the codes then travel as uint8), and for e5m2 -> float16
    under the interpreter (its converter drops e5m2 subnormals)."""
    if cfg.fp8_bits:
        return True
    if w.device.type == "cuda":
        return torch.cuda.get_device_capability(w.device) < (8, 9)
    return w.dtype == torch.float8_e5m2 and dtype == torch.float16


def launch_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bn: int, bk: int, bias: torch.Tensor | None,
                config: FConfig, y: torch.Tensor, lock: torch.Tensor | None = None) -> torch.Tensor:
    """``fp8_gemv_kernel`` over ``block_m`` (1, 2 or 4) rows a program."""
    m, k = x.shape
    n = w.shape[0]
    rows = config.block_m if config.block_m in (1, 2, 4) else 4
    grid_n = triton.cdiv(n, config.block_n)
    grid_m = triton.cdiv(m, rows)
    split = max(1, min(config.split_k, triton.cdiv(k, config.block_k)))
    part, lck = split_buffers(m, n, grid_n * grid_m, split, x.device, lock)
    mode = scale_mode(bk, k, config.block_k, groups=True)
    bits = decode_by_bits(w, x.dtype, config)
    fp8_gemv_kernel[(grid_n, split, grid_m)](
        x, w.view(torch.uint8) if bits else w, scale, bias if bias is not None else y, y,
        part if part is not None else y, lck if lck is not None else y, m, n, k, x.stride(0), y.stride(0), bn, bk,
        scale.stride(0), split,
        scale.shape[1], ROWS=rows, BLOCK_N=config.block_n, BLOCK_K=config.block_k, SCALE_MODE=mode,
        GS=bk if mode == GROUPS else 1, BITS=bits, E5=w.dtype == torch.float8_e5m2, HAS_BIAS=bias is not None,
        SPLIT=split > 1, EVEN_K=k % config.block_k == 0, num_warps=config.num_warps, num_stages=config.num_stages)
    return y


def dense_weight(w: torch.Tensor, scale: torch.Tensor, bn: int, bk: int, dtype: torch.dtype, cfg: FConfig,
                 n0: int = 0, n1: int | None = None) -> torch.Tensor:
    """``(w * scale)[n0:n1]`` as a fresh dense ``[n1 - n0, K]`` tensor in ``dtype`` (``n0`` a multiple of bn)."""
    n1 = w.shape[0] if n1 is None else n1
    k = w.shape[1]
    out = torch.empty((n1 - n0, k), dtype=dtype, device=w.device)
    if out.numel():
        bits = decode_by_bits(w, dtype, cfg)
        grid = (triton.cdiv(n1 - n0, cfg.block_n), triton.cdiv(k, cfg.block_k))
        fp8_dense_kernel[grid]((w.view(torch.uint8) if bits else w)[n0:n1], scale[n0 // bn:], out, n1 - n0, k, bn,
                               bk, scale.stride(0), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, BITS=bits,
                               E5=w.dtype == torch.float8_e5m2, num_warps=cfg.num_warps)
    return out
