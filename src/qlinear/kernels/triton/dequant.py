"""Dequantize the packed weight into a transient dense ``[K, N]`` tensor, and the large-M path built on it.

For large M the GEMM is compute bound and cuBLAS is the fastest tensor-core code there is, so the
cheapest correct thing is: one memory-bound pass writes ``W^T`` in the activation dtype (rows scattered
back to input-channel order, so act-order needs no activation gather), one cuBLAS GEMM, then the dense
weight is dropped. It exists only inside the call.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import gemv_term, group_params, halves, kpos, load_words
from .configs import Config
from .layout import Packed, one_group
from .runtime import LAST

#: largest dense chunk (elements) one call materialises; wider layers are done in column chunks
MAX_DENSE = 1 << 28


@triton.jit
def dequant_kernel(W, S, Z, OFF, SUP, PERM, OUT, N0, N1, K, KW, G, KP, NP, GS, stride_o,
                   BITS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr, ONE_GROUP: tl.constexpr,
                   HAS_Z: tl.constexpr, HAS_PERM: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
                   HAS_OFF: tl.constexpr, HAS_SUP: tl.constexpr):
    """One ``[BLOCK_K, BLOCK_N]`` tile: each field's ``[BKW, BN]`` rows go straight to their output rows,
    in the words' own layout (no tile assembly, no data moved between threads)."""
    PF: tl.constexpr = 32 // BITS
    BKW: tl.constexpr = BLOCK_K // PF
    row0 = tl.program_id(0) * BKW
    offs_n = N0 + tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = row0 + tl.arange(0, BKW)
    w = load_words(W, rows, offs_n, KW, NP, False, False)
    s, z, o = group_params(S, Z, OFF, SUP, rows, row0, offs_n, G, NP, GS, PF, R, BLOCK_N, ZC, HAS_Z, ONE_GROUP,
                           False, HAS_OFF, HAS_SUP)
    lo, hi = halves(w)
    cols = (offs_n - N0)[None, :]
    nmask = (offs_n < N1)[None, :]
    for j in tl.static_range(PF):
        if HAS_OFF:
            t = tl.fma(gemv_term(lo, hi, z, j, BITS, PF // 2), s, o).to(OUT.dtype.element_ty)
        else:
            t = (gemv_term(lo, hi, z, j, BITS, PF // 2) * s).to(OUT.dtype.element_ty)
        kk = kpos(j, rows, R, PF)
        if HAS_PERM:  # noqa: SIM108 (constexpr branch)
            dest = tl.load(PERM + kk, mask=kk < KP, other=-1)
        else:
            dest = tl.where(kk < K, kk, -1)
        tl.store(OUT + dest[:, None].to(tl.int64) * stride_o + cols, t, mask=(dest >= 0)[:, None] & nmask)


def dense_t(p: Packed, dtype: torch.dtype, cfg: Config | None = None, n0: int = 0,
            n1: int | None = None) -> torch.Tensor:
    """``W^T[:, n0:n1]`` as a fresh dense ``[K, n1 - n0]`` tensor in ``dtype`` (input-channel order)."""
    n1 = p.n if n1 is None else n1
    block_k = cfg.block_k if cfg else 16 * (32 // p.bits)
    block_n = cfg.block_n if cfg else 128
    out = torch.empty((p.k, n1 - n0), dtype=dtype, device=p.qweight.device)
    if out.numel() == 0:
        return out
    grid = (triton.cdiv(p.kp, block_k), triton.cdiv(n1 - n0, block_n))
    LAST["dequant"] = dequant_kernel[grid](
        p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales, p.offset_arg(), p.super_arg(),
        p.perm if p.perm is not None else p.qweight, out, n0, n1, p.k, p.kw, p.scales.shape[0],
        p.kp, p.np, p.group, out.stride(0), BITS=p.bits, R=p.rows_per_block, ZC=p.zero_const,
        ONE_GROUP=one_group(p, block_k), HAS_Z=p.zeros is not None,
        HAS_PERM=p.perm is not None, BLOCK_K=block_k, BLOCK_N=block_n,
        HAS_OFF=p.offsets is not None, HAS_SUP=p.supers is not None,
        num_warps=cfg.num_warps if cfg else 4, num_stages=1)
    return out


def dense_mm(x2: torch.Tensor, p: Packed, cfg: Config | None = None,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 @ W^T (+ bias)`` through a transient dense weight and torch's matmul (cuBLAS on CUDA)."""
    chunk = max(128, MAX_DENSE // max(1, p.k) // 128 * 128)
    b = bias.to(x2.dtype) if bias is not None else None
    if chunk >= p.n:
        w = dense_t(p, x2.dtype, cfg)
        y = torch.addmm(b, x2, w) if b is not None else x2 @ w
        del w
        return y
    y = torch.empty((x2.shape[0], p.n), dtype=x2.dtype, device=x2.device)
    for n0 in range(0, p.n, chunk):
        n1 = min(p.n, n0 + chunk)
        w = dense_t(p, x2.dtype, cfg, n0, n1)
        y[:, n0:n1] = torch.addmm(b[n0:n1], x2, w) if b is not None else x2 @ w
        del w
    return y
