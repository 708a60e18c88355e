"""GGUF matmul bodies over raw GGML blocks (``y = x @ W^T``) and their launchers; decoding is in ``gguf.py``.

* ``gemv_kernel`` (variant ``gemv``, one activation row per program, split-K): per chunk and field class it
  sums ``q * x`` on CUDA cores (LOP3 + FFMA to decode, FFMA to multiply) and scales once per chunk, adding
  ``C * sum(x)`` for types with a min: the weight is never formed, so it is memory bound.
* ``dot_kernel`` (``skinny`` and ``gemm``, split-K optional): each field's weights ``[BN, NC*HC]`` are
  formed in the activation dtype and meet the activations gathered at the same input channels in
  ``tl.dot`` with the weights as the left operand (``acc[BN, BM]``: the tensor core's long side is N, so
  a 16-row input wastes nothing on the weights' side).
* ``dequant_kernel``: bit-exact float32 (or activation-dtype: the float32 value rounded once, to nearest even)
  weights ``[N, K]``; launched without FP fusion. With torch's matmul it is the ``dense`` variant for large M.

Split-K partials go to a float32 scratch ``[SPLIT_K, M, N]``; the last program of a tile (an acq_rel
counter per tile, reset by that program) sums them in a fixed order and writes y.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import to_dtype
from .gguf import GEOMS, Geom, field_q, scales, step_tiles, value_pos, weights
from .gguf_configs import GConfig
from .runtime import interpreting

#: the last compiled kernel launched (benchmarks inspect registers and spills)
LAST: dict[str, object] = {}


@triton.jit
def _finish(Y, BIAS, PART, LOCK, out, offs_n, offs_m, M, N, stride_ym, tile, pid_k, SPLIT_K,
            HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr):
    """Store ``out [BN, BM]`` (= y^T tile), or its split-K partial and, in the last program, the sum."""
    mn = (offs_n < N)[:, None] & (offs_m < M)[None, :]
    if SPLIT:
        part = PART + offs_m[None, :] * N + offs_n[:, None]
        tl.store(part + pid_k * M * N, out, mask=mn)
        tl.debug_barrier()  # every thread's partial is written before the counter is released
        seen = tl.atomic_add(LOCK + tile, 1, sem="acq_rel", scope="gpu")
        if seen == SPLIT_K - 1:
            total = tl.zeros_like(out)
            for sk in range(SPLIT_K):
                total += tl.load(part + sk * M * N, mask=mn, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(BIAS + offs_n, mask=offs_n < N, other=0.0)[:, None]
            tl.store(Y + offs_m[None, :] * stride_ym + offs_n[:, None], total.to(Y.dtype.element_ty), mask=mn)
            tl.atomic_xchg(LOCK + tile, 0, sem="relaxed", scope="gpu")
    else:
        if HAS_BIAS:
            out += tl.load(BIAS + offs_n, mask=offs_n < N, other=0.0)[:, None]
        tl.store(Y + offs_m[None, :] * stride_ym + offs_n[:, None], out.to(Y.dtype.element_ty), mask=mn)


@triton.jit
def gemv_kernel(W, X, Y, BIAS, PART, LOCK, M, N, K, NB, RHW, stride_xm, stride_ym, SPLIT_K,
                QT: tl.constexpr, B: tl.constexpr, HWB: tl.constexpr, CPB: tl.constexpr, HV: tl.constexpr,
                HC: tl.constexpr, F: tl.constexpr, G: tl.constexpr, BPS: tl.constexpr, HAS_MIN: tl.constexpr,
                HAS_BIAS: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
                JT: tl.constexpr):
    # Tile [HV, BN, NC, HC] (JT: [HC, BN, NC, HV]): the halfwords a scale multiplies stay within one
    # thread, chunk and row dims spread over the lanes like the [.., BN, NC, ..] scale tensors, so sums
    # meet the scales with no layout conversion and no shuffle. Aligned types load one 16-byte vector per
    # (vector, row, chunk); the others (JT) load halfwords one by one, in-thread.
    NC: tl.constexpr = BPS * CPB
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = offs_n[None, :, None, None]
    c = tl.arange(0, NC)[None, None, :, None]
    if JT:  # unaligned blocks: halfwords on the in-thread dim 0 (an opaque 1 hides their contiguity)
        one = tl.maximum(NB, 1) // tl.maximum(NB, 1)
        j = tl.arange(0, HC)[:, None, None, None] * one
        hv = tl.arange(0, HV)[None, None, None, :]
        RED: tl.constexpr = 0
    else:  # 16-byte aligned vectors (Q4_K, Q5_K): one vector a thread on dim 3, vectors on dim 0
        j = tl.arange(0, HC)[None, None, None, :]
        hv = tl.arange(0, HV)[:, None, None, None]
        RED: tl.constexpr = 3
    nsteps = tl.cdiv(NB, BPS)
    per = tl.cdiv(nsteps, SPLIT_K)
    s0 = pid_k * per
    s1 = tl.minimum(s0 + per, nsteps)
    xrow = X + pid_m.to(tl.int64) * stride_xm
    acc = tl.zeros((1, BN, NC, HV) if JT else (HV, BN, NC, 1), dtype=tl.float32)
    HIOFF: tl.constexpr = 32 if QT == 12 or QT == 13 else 64 if QT == 14 else 16
    hi6 = tl.arange(0, 2)[:, None, None, None, None, None]
    hv6 = tl.arange(0, HV)[None, :, None, None, None, None]
    c6 = tl.arange(0, NC)[None, None, None, :, None, None]
    j6 = tl.arange(0, HC)[None, None, None, None, :, None]
    p6 = tl.arange(0, 2)[None, None, None, None, None, :]
    for s in range(s0, s1):
        base, wq, wh, qh = step_tiles(W, rows, s * BPS, N, NB, RHW, c, hv, j, QT, CPB, HWB)
        k0 = s * BPS * B
        if F == 4:  # nibble types: field f = (hi, p) reads x at xbase + HIOFF * hi + 2j + p
            xk = k0 + (value_pos(c6, hv6, j6, 0, QT, CPB, B) + HIOFF * hi6 + p6)
            if EVEN_K:
                xe = tl.load(xrow + xk).to(tl.float32)
            else:
                xe = tl.load(xrow + xk, mask=xk < K, other=0.0).to(tl.float32)
            if HAS_MIN:  # sum(x) per scale run, once per program (not per row) for the C * sum(x) term
                xs0, xs1 = tl.split(tl.permute(tl.sum(tl.sum(xe, axis=5), axis=4), (1, 2, 3, 0)))  # [HV, 1, NC]
                if JT:
                    xs0 = tl.permute(xs0, (1, 2, 0))[None]
                    xs1 = tl.permute(xs1, (1, 2, 0))[None]
                else:
                    xs0 = xs0[:, :, :, None]
                    xs1 = xs1[:, :, :, None]
            x_p0, x_p1 = tl.split(xe)
            x00, x01 = tl.split(tl.permute(x_p0, (1, 2, 3, 4, 0)))  # [HV, 1, NC, HC]
            x10, x11 = tl.split(tl.permute(x_p1, (1, 2, 3, 4, 0)))
            if JT:
                x00 = tl.permute(x00, (3, 1, 2, 0))
                x01 = tl.permute(x01, (3, 1, 2, 0))
                x10 = tl.permute(x10, (3, 1, 2, 0))
                x11 = tl.permute(x11, (3, 1, 2, 0))
        for g in tl.static_range(G):
            a, cm = scales(W, base, c, hv, g, QT, CPB)
            p = tl.zeros(wq.shape, dtype=tl.float32)
            for f in tl.static_range(F):
                if f % G == g:
                    if F == 4:
                        if f == 0:
                            xv = x00
                        elif f == 1:
                            xv = x01
                        elif f == 2:
                            xv = x10
                        else:
                            xv = x11
                    else:
                        kk = k0 + value_pos(c, hv, j, f, QT, CPB, B)
                        xv = tl.load(xrow + kk, mask=kk < K, other=0.0).to(tl.float32)
                    p += field_q(wq, wh, qh, c, j, f, QT, CPB) * xv
            acc += a * tl.sum(p, axis=RED, keep_dims=True)
            if HAS_MIN:  # only nibble types have a min
                if G == 1:
                    xs = xs0 + xs1
                elif g == 0:
                    xs = xs0
                else:
                    xs = xs1
                acc += cm * xs
    out = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=0)[:, None]  # [BN, 1]
    offs_m = pid_m + tl.arange(0, 1)
    _finish(Y, BIAS, PART, LOCK, out, offs_n, offs_m, M, N, stride_ym, pid_m * tl.num_programs(1) + pid_n,
            pid_k, SPLIT_K, HAS_BIAS, SPLIT)


@triton.jit
def dot_kernel(W, X, Y, BIAS, PART, LOCK, M, N, K, NB, RHW, stride_xm, stride_ym, SPLIT_K,
               QT: tl.constexpr, B: tl.constexpr, HWB: tl.constexpr, CPB: tl.constexpr, HV: tl.constexpr,
               HC: tl.constexpr, F: tl.constexpr, G: tl.constexpr, BPS: tl.constexpr, HAS_MIN: tl.constexpr,
               HAS_BIAS: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, SPLIT: tl.constexpr,
               PREC: tl.constexpr):
    NC: tl.constexpr = BPS * CPB
    KF: tl.constexpr = HV * NC * HC  # one field's weights per row and step, flattened as (hv, c, j)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    rows = offs_n[:, None, None, None]
    hv = tl.arange(0, HV)[None, :, None, None]
    c = tl.arange(0, NC)[None, None, :, None]
    j = tl.arange(0, HC)[None, None, None, :]
    kf = tl.arange(0, KF)[:, None]
    kf_hv, kf_c, kf_j = kf // (NC * HC), kf // HC % NC, kf % HC
    nsteps = tl.cdiv(NB, BPS)
    per = tl.cdiv(nsteps, SPLIT_K)
    s0 = pid_k * per
    s1 = tl.minimum(s0 + per, nsteps)
    xcols = X + offs_m.to(tl.int64)[None, :] * stride_xm
    mrow = (offs_m < M)[None, :]
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for s in range(s0, s1):
        base, wq, wh, qh = step_tiles(W, rows, s * BPS, N, NB, RHW, c, hv, j, QT, CPB, HWB)
        k0 = s * BPS * B
        for g in tl.static_range(G):
            a, cm = scales(W, base, c, hv, g, QT, CPB)
            for f in tl.static_range(F):
                if f % G == g:
                    w = weights(wq, wh, qh, a, cm, c, j, f, QT, CPB, HAS_MIN).to(X.dtype.element_ty)
                    kk = k0 + value_pos(kf_c, kf_hv, kf_j, f, QT, CPB, B)
                    xt = tl.load(xcols + kk, mask=(kk < K) & mrow, other=0.0)
                    acc = tl.dot(tl.reshape(w, (BN, KF)), xt, acc, input_precision=PREC)
    _finish(Y, BIAS, PART, LOCK, acc, offs_n, offs_m, M, N, stride_ym, pid_m * tl.num_programs(1) + pid_n,
            pid_k, SPLIT_K, HAS_BIAS, SPLIT)


@triton.jit
def dequant_kernel(W, OUT, N, K, NB, RHW, stride_o,
                   QT: tl.constexpr, B: tl.constexpr, HWB: tl.constexpr, CPB: tl.constexpr, HV: tl.constexpr,
                   HC: tl.constexpr, F: tl.constexpr, G: tl.constexpr, BPS: tl.constexpr,
                   HAS_MIN: tl.constexpr, BN: tl.constexpr, BF16_BITS: tl.constexpr):
    NC: tl.constexpr = BPS * CPB
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    s = tl.program_id(1)
    rows = offs_n[:, None, None, None]
    hv = tl.arange(0, HV)[None, :, None, None]
    c = tl.arange(0, NC)[None, None, :, None]
    j = tl.arange(0, HC)[None, None, None, :]
    base, wq, wh, qh = step_tiles(W, rows, s * BPS, N, NB, RHW, c, hv, j, QT, CPB, HWB)
    dst = OUT + rows.to(tl.int64) * stride_o
    k0 = s * BPS * B
    if QT == 40 or QT == 41:  # 1-bit types (one field class): 16 fields a halfword, stored field by field
        a, cm = scales(W, base, c, hv, 0, QT, CPB)
        for f in tl.static_range(F):
            w = weights(wq, wh, qh, a, cm, c, j, f, QT, CPB, HAS_MIN)
            kk = k0 + value_pos(c, hv, j, f, QT, CPB, B)
            tl.store(dst + kk, to_dtype(w, OUT.dtype.element_ty, BF16_BITS), mask=(rows < N) & (kk < K))
    else:
        # Every other type puts field f of halfword j at 2j + (f // 2) (Q8_0: 2j + f) past a start that depends
        # on (chunk, vector, f % 2) only: joining the two fields of each start gives 2 * HC consecutive values,
        # stored as one contiguous run per row (field by field, each store wrote every other value: 2 of 32
        # bytes per sector used, ncu on an H100, results/h100-ncu-gguf-2026-12-05.md).
        PAIRS: tl.constexpr = 1 if QT == 8 else 2
        run = tl.arange(0, 2 * HC)[None, None, None, :]
        for h in tl.static_range(PAIRS):
            a, cm = scales(W, base, c, hv, h % G, QT, CPB)
            lo = weights(wq, wh, qh, a, cm, c, j, h, QT, CPB, HAS_MIN)
            hi = weights(wq, wh, qh, a, cm, c, j, h + PAIRS, QT, CPB, HAS_MIN)
            w = tl.reshape(tl.join(lo, hi), (BN, HV, NC, 2 * HC))
            kk = k0 + value_pos(c, hv, 0, h, QT, CPB, B) + run
            tl.store(dst + kk, to_dtype(w, OUT.dtype.element_ty, BF16_BITS), mask=(rows < N) & (kk < K))


def _meta(g: Geom, bps: int) -> dict[str, object]:
    return dict(QT=g.qt, B=g.block, HWB=g.type_size // 2, CPB=g.cpb, HV=g.hv, HC=g.hc, F=g.fields,
                G=g.classes, BPS=bps or g.bps, HAS_MIN=g.has_min)


def halfwords(qweight: torch.Tensor) -> torch.Tensor:
    """The raw block bytes ``uint8 [N, R]`` as int16 halfwords ``[N, R / 2]`` (a view: nothing moves)."""
    if qweight.shape[-1] % 2 or not qweight.is_contiguous() or qweight.data_ptr() % 2:
        raise ValueError(f"qweight: expected contiguous, 2-byte aligned rows of even length, got shape "
                         f"{tuple(qweight.shape)}")
    return qweight.view(torch.int16)


def dequantize(qweight: torch.Tensor, qt: int, k: int, dtype: torch.dtype = torch.float32,
               out: torch.Tensor | None = None, block_n: int = 16) -> torch.Tensor:
    """Weights ``[N, k]`` in ``dtype`` from raw blocks ``uint8 [N, nb * T]``; float32 is bit-exact."""
    g = GEOMS[qt]
    n, w = qweight.shape[0], halfwords(qweight)
    nb = qweight.shape[1] // g.type_size
    y = torch.empty((n, k), dtype=dtype, device=qweight.device) if out is None else out
    if y.numel() == 0:
        return y
    grid = (triton.cdiv(n, block_n), triton.cdiv(nb, g.bps))
    LAST["dequant"] = dequant_kernel[grid](w, y, n, k, nb, w.shape[1], y.stride(0), **_meta(g, 0), BN=block_n,
                                           BF16_BITS=interpreting() and y.dtype == torch.bfloat16, num_warps=4,
                                           num_stages=1, enable_fp_fusion=False)
    return y


def matmul(x2: torch.Tensor, qweight: torch.Tensor, qt: int, cfg: GConfig, bias: torch.Tensor | None = None,
           lock: torch.Tensor | None = None) -> torch.Tensor:
    """``x2 [M, K] @ W^T (+ bias float32)`` -> ``[M, N]`` in x2's dtype with the variant and tiles of ``cfg``.

    ``lock`` (int32 zeros, one per output tile at least) enables split-K."""
    g = GEOMS[qt]
    m, k = x2.shape
    n, w = qweight.shape[0], halfwords(qweight)
    nb = qweight.shape[1] // g.type_size
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    if m == 0 or n == 0:
        return y
    gemv = cfg.variant == "gemv"
    bm = 1 if gemv else cfg.block_m
    grid_m, grid_n = (m if gemv else triton.cdiv(m, bm)), triton.cdiv(n, cfg.block_n)
    split = cfg.split_k if lock is not None and grid_m * grid_n <= lock.numel() else 1
    part = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if split > 1 else y
    args = (w, x2, y, bias if bias is not None else y, part, lock if lock is not None else w,
            m, n, k, nb, w.shape[1], x2.stride(0), y.stride(0), split)
    meta = dict(_meta(g, cfg.bps), HAS_BIAS=bias is not None, BN=cfg.block_n, SPLIT=split > 1,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True)
    if gemv:
        even = k % (meta["BPS"] * g.block) == 0  # every step's activations lie inside the row
        jt = g.qt not in (12, 13) if cfg.jt < 0 else bool(cfg.jt)  # Q4_K / Q5_K: 16-byte aligned vectors
        LAST["gemv"] = gemv_kernel[(grid_m, grid_n, split)](*args, **meta, EVEN_K=even, JT=jt)
    else:
        prec = "ieee" if x2.dtype == torch.float32 else "tf32"
        LAST["dot"] = dot_kernel[(grid_m, grid_n, split)](*args, **meta, BM=bm, PREC=prec)
    return y
