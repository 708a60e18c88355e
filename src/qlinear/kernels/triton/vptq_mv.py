"""VPTQ in Triton: the main (non-outlier) columns of a VPTQ layer times activations.

Each program decodes a tile of ``BJ`` output vectors (``BJ * V`` rows) by ``BK`` decoded input columns: it reads
each code's bits from the packed int32 stream (a 64-bit window over two words), gathers the ``V``-value codebook
vector (and the residual one), applies the per-column norm, and rounds the value to the codebook dtype after
each operation and then to the activation dtype, exactly as the producers' dequantization does (launched with
``enable_fp_fusion=False`` so no multiply-add becomes an FMA). ``vptq_gemv_kernel`` (M <= 4 per launch; routed
M = 1) multiplies the tile in registers and adds its partial sums over a K slice into a float32 output (split-K,
atomics); ``vptq_mma_kernel`` (M <= 16) multiplies the same tile on tensor cores; ``vptq_decode_kernel`` writes the
decoded weight once for one ``torch.matmul`` above that.

Inputs are in decoded-column order: the caller gathers ``x[:, perm]`` and the norm ``scale[perm]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Rows the GEMV kernel takes per launch (``force="gemv"`` loops over blocks of this many).
GEMV_MAX_M = 4
#: Rows routed to the GEMV: one. On an H100 (``benchmarks/gpu_vptq.py``, 2026-12-05) M = 4 through the GEMV took
#: 477 us on 4096x14336 against 125 us for M = 16 through the tensor-core kernel, so M = 2..16 take that one.
GEMV_ROUTE_M = 1
MMA_MAX_M = 16


@triton.jit
def _round_like(v, ptr, INTERP: tl.constexpr):
    """float32 ``v`` rounded (nearest, ties to even) to ptr's element dtype, kept in float32. Triton's interpreter
    truncates float32 -> bfloat16 casts (the GPU rounds), so there bfloat16 is rounded with integer operations."""
    out = v
    if ptr.dtype.element_ty == tl.bfloat16:
        if INTERP:
            u = v.to(tl.uint32, bitcast=True)
            u = u + (0x7FFF + ((u >> 16) & 1))
            out = ((u >> 16) << 16).to(tl.float32, bitcast=True)
        else:
            out = v.to(tl.bfloat16).to(tl.float32)
    elif ptr.dtype.element_ty == tl.float16:
        out = v.to(tl.float16).to(tl.float32)
    return out


@triton.jit
def _decode_tile(idx_ptr, cb_ptr, res_ptr, s_ptr, b_ptr, offs_j, offs_k, k_end, J, W, GS, C, R,
                 V: tl.constexpr, VP: tl.constexpr, TB: tl.constexpr, IB: tl.constexpr,
                 HAS_RES: tl.constexpr, HAS_NORM: tl.constexpr, INTERP: tl.constexpr):
    """Weights ``[BJ, BK, VP]`` of vectors ``offs_j`` x decoded main columns ``offs_k``: float32 holding values of
    the codebook dtype, each operation rounded to it as the producers' Torch code rounds."""
    g = offs_k // GS
    bit = (offs_k % GS) * TB
    word = bit // 32
    sh = (bit % 32).to(tl.int64)
    mask = (offs_j[:, None] < J) & (offs_k[None, :] < k_end)
    row = (g[None, :] * J + offs_j[:, None]).to(tl.int64) * W + word[None, :]
    lo = tl.load(idx_ptr + row, mask=mask, other=0).to(tl.uint32, bitcast=True).to(tl.int64)  # zero-extended
    hi = tl.load(idx_ptr + row + 1, mask=mask & (word[None, :] + 1 < W), other=0).to(tl.uint32, bitcast=True)
    hi = hi.to(tl.int64)
    code = ((lo | (hi << 32)) >> sh[None, :]) & ((1 << TB) - 1)
    e = tl.arange(0, VP)
    mask3 = mask[:, :, None] & (e < V)[None, None, :]
    main = (g[None, :].to(tl.int64) * C + (code & ((1 << IB) - 1))) * V
    w = tl.load(cb_ptr + main[:, :, None] + e[None, None, :], mask=mask3, other=0.0).to(tl.float32)
    if HAS_RES:
        res = (g[None, :].to(tl.int64) * R + (code >> IB)) * V
        r = tl.load(res_ptr + res[:, :, None] + e[None, None, :], mask=mask3, other=0.0).to(tl.float32)
        w = _round_like(w + r, cb_ptr, INTERP)
    if HAS_NORM:
        kmask = offs_k < k_end
        s = tl.load(s_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        w = _round_like(w * s[None, :, None], cb_ptr, INTERP)
        w = _round_like(w + b[None, :, None], cb_ptr, INTERP)
    return w


@triton.jit
def vptq_gemv_kernel(x_ptr, idx_ptr, cb_ptr, res_ptr, s_ptr, b_ptr, out_ptr, M, N, J, KM, W, GS, C, R, K_SPLIT,
                     V: tl.constexpr, VP: tl.constexpr, TB: tl.constexpr, IB: tl.constexpr, MR: tl.constexpr,
                     BJ: tl.constexpr, BK: tl.constexpr, HAS_RES: tl.constexpr, HAS_NORM: tl.constexpr,
                     INTERP: tl.constexpr):
    """out[m, n] += sum over this program's K slice of W[n, k] * x[m, k], for M = MR <= 4 rows."""
    offs_j = tl.program_id(0) * BJ + tl.arange(0, BJ)
    k0 = tl.program_id(1) * K_SPLIT
    k_end = tl.minimum(k0 + K_SPLIT, KM)
    acc0 = tl.zeros([BJ, VP], dtype=tl.float32)
    acc1 = tl.zeros([BJ, VP], dtype=tl.float32)
    acc2 = tl.zeros([BJ, VP], dtype=tl.float32)
    acc3 = tl.zeros([BJ, VP], dtype=tl.float32)
    wide = tl.zeros([BJ, BK, VP], dtype=tl.float32)  # one row: products kept per lane, reduced once at the end
    for kk in range(k0, k_end, BK):
        offs_k = kk + tl.arange(0, BK)
        w = _decode_tile(idx_ptr, cb_ptr, res_ptr, s_ptr, b_ptr, offs_j, offs_k, k_end, J, W, GS, C, R,
                         V, VP, TB, IB, HAS_RES, HAS_NORM, INTERP)
        w = _round_like(w, x_ptr, INTERP)
        kmask = offs_k < k_end
        x0 = tl.load(x_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        if MR == 1:
            wide += w * x0[None, :, None]
        else:
            acc0 += tl.sum(w * x0[None, :, None], axis=1)
        if MR > 1:
            x1 = tl.load(x_ptr + KM + offs_k, mask=kmask, other=0.0).to(tl.float32)
            acc1 += tl.sum(w * x1[None, :, None], axis=1)
        if MR > 2:
            x2 = tl.load(x_ptr + 2 * KM + offs_k, mask=kmask, other=0.0).to(tl.float32)
            acc2 += tl.sum(w * x2[None, :, None], axis=1)
        if MR > 3:
            x3 = tl.load(x_ptr + 3 * KM + offs_k, mask=kmask, other=0.0).to(tl.float32)
            acc3 += tl.sum(w * x3[None, :, None], axis=1)
    if MR == 1:
        acc0 = tl.sum(wide, axis=1)
    e = tl.arange(0, VP)
    n = offs_j[:, None] * V + e[None, :]
    omask = (e < V)[None, :] & (n < N)
    tl.atomic_add(out_ptr + n, acc0, mask=omask)
    if MR > 1:
        tl.atomic_add(out_ptr + N + n, acc1, mask=omask)
    if MR > 2:
        tl.atomic_add(out_ptr + 2 * N + n, acc2, mask=omask)
    if MR > 3:
        tl.atomic_add(out_ptr + 3 * N + n, acc3, mask=omask)


@triton.jit
def vptq_mma_kernel(x_ptr, idx_ptr, cb_ptr, res_ptr, s_ptr, b_ptr, out_ptr, M, N, J, KM, W, GS, C, R, K_SPLIT,
                    V: tl.constexpr, VP: tl.constexpr, TB: tl.constexpr, IB: tl.constexpr, BM: tl.constexpr,
                    BJ: tl.constexpr, BK: tl.constexpr, HAS_RES: tl.constexpr, HAS_NORM: tl.constexpr,
                    PREC: tl.constexpr, INTERP: tl.constexpr):
    """As the GEMV for up to ``BM`` rows at once: the decoded tile, ``BJ * VP`` rows by ``BK``, times the
    activations on tensor cores (``tl.dot``, float32 accumulation), split-K partial sums added atomically."""
    offs_j = tl.program_id(0) * BJ + tl.arange(0, BJ)
    k0 = tl.program_id(1) * K_SPLIT
    offs_m = tl.program_id(2) * BM + tl.arange(0, BM)
    k_end = tl.minimum(k0 + K_SPLIT, KM)
    acc = tl.zeros([BJ * VP, BM], dtype=tl.float32)
    for kk in range(k0, k_end, BK):
        offs_k = kk + tl.arange(0, BK)
        w = _decode_tile(idx_ptr, cb_ptr, res_ptr, s_ptr, b_ptr, offs_j, offs_k, k_end, J, W, GS, C, R,
                         V, VP, TB, IB, HAS_RES, HAS_NORM, INTERP)
        w = _round_like(w, x_ptr, INTERP).to(x_ptr.dtype.element_ty)  # exact: already rounded
        w2 = tl.reshape(tl.permute(w, (0, 2, 1)), (BJ * VP, BK))
        xmask = (offs_k < k_end)[:, None] & (offs_m < M)[None, :]
        xt = tl.load(x_ptr + offs_m[None, :] * KM + offs_k[:, None], mask=xmask, other=0.0)
        acc = tl.dot(w2, xt, acc, input_precision=PREC)
    r = tl.arange(0, BJ * VP)
    e = r % VP
    n = (tl.program_id(0) * BJ + r // VP) * V + e
    omask = ((e < V) & (n < N))[:, None] & (offs_m < M)[None, :]
    tl.atomic_add(out_ptr + offs_m[None, :] * N + n[:, None], acc, mask=omask)


@triton.jit
def vptq_decode_kernel(idx_ptr, cb_ptr, res_ptr, s_ptr, b_ptr, w_ptr, N, J, KM, W, GS, C, R,
                       V: tl.constexpr, VP: tl.constexpr, TB: tl.constexpr, IB: tl.constexpr,
                       BJ: tl.constexpr, BK: tl.constexpr, HAS_RES: tl.constexpr, HAS_NORM: tl.constexpr,
                       INTERP: tl.constexpr):
    """The decoded main weight ``[N, KM]`` in w_ptr's dtype."""
    offs_j = tl.program_id(0) * BJ + tl.arange(0, BJ)
    offs_k = tl.program_id(1) * BK + tl.arange(0, BK)
    w = _decode_tile(idx_ptr, cb_ptr, res_ptr, s_ptr, b_ptr, offs_j, offs_k, KM, J, W, GS, C, R,
                     V, VP, TB, IB, HAS_RES, HAS_NORM, INTERP)
    e = tl.arange(0, VP)
    n = offs_j[:, None, None] * V + e[None, None, :]
    mask = (e < V)[None, None, :] & (n < N) & (offs_k < KM)[None, :, None]
    w = _round_like(w, w_ptr, INTERP)  # exact in w's dtype: the store's cast cannot round
    tl.store(w_ptr + n.to(tl.int64) * KM + offs_k[None, :, None], w.to(w_ptr.dtype.element_ty), mask=mask)


def _common(idx: torch.Tensor, p: object) -> dict[str, object]:
    vp = triton.next_power_of_2(p.vector_len)
    interp = type(vptq_gemv_kernel).__name__ == "InterpretedFunction"  # defined under TRITON_INTERPRET=1
    return dict(J=idx.shape[1], W=idx.shape[2], GS=p.group_size, C=p.num_centroids,
                R=max(p.num_res_centroids, 1), V=p.vector_len, VP=vp, TB=p.total_bits, IB=p.index_bits,
                INTERP=interp)


def gemv_split(programs_n: int, km: int, bk: int, sms: int) -> int:
    """K slices per output tile so about four programs per SM run (each slice a multiple of ``bk``)."""
    want = max(1, -(-4 * sms // max(programs_n, 1)))
    return max(1, min(want, -(-km // bk)))


def vptq_main(x: torch.Tensor, idx: torch.Tensor, cb: torch.Tensor, res: torch.Tensor | None,
              scale: torch.Tensor | None, bias: torch.Tensor | None, p: object, n: int,
              force: str | None = None) -> torch.Tensor:
    """``x [M, KM]`` (decoded-column order, outlier columns removed) times the main weight: float32 ``[M, N]``.

    Paths: ``gemv`` (M = 1), ``mma`` (M <= 16), else ``dense`` (decode once, then ``torch.matmul``); ``force``
    names one (tests, benchmarks)."""
    m, km = x.shape
    c = _common(idx, p)
    has_norm = scale is not None
    s = scale if has_norm else cb
    b = bias if has_norm else cb
    r = res if res is not None else cb
    path = force or ("gemv" if m <= GEMV_ROUTE_M else "mma" if m <= MMA_MAX_M else "dense")
    if path == "dense":
        return torch.matmul(x, decode_main(idx, cb, res, scale, bias, p, n, km, x.dtype).t()).float()
    y = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    bj, bk = max(1, 64 // c["VP"]), 64
    pj = triton.cdiv(c["J"], bj)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    k_split = triton.cdiv(triton.cdiv(km, gemv_split(pj, km, bk, sms)), bk) * bk
    flags = dict(BJ=bj, HAS_RES=res is not None, HAS_NORM=has_norm, enable_fp_fusion=False, num_warps=4)
    if path == "mma":
        bm = 16
        grid = (pj, triton.cdiv(km, k_split), triton.cdiv(m, bm))
        prec = "ieee" if x.dtype == torch.float32 else "tf32"
        vptq_mma_kernel[grid](x, idx, cb, r, s, b, y, m, n, KM=km, K_SPLIT=k_split, BM=bm, BK=bk, PREC=prec,
                              **flags, **c)
        return y
    for m0 in range(0, m, GEMV_MAX_M):
        mr = min(GEMV_MAX_M, m - m0)
        grid = (pj, triton.cdiv(km, k_split))
        # several rows: BK 32 keeps four rows at 128 registers on sm_90 (BK 64: 255 and spills; ptxas -v)
        vptq_gemv_kernel[grid](x[m0:], idx, cb, r, s, b, y[m0:], mr, n, KM=km, K_SPLIT=k_split, MR=mr,
                               BK=bk if mr == 1 else bk // 2, **flags, **c)
    return y


def decode_main(idx: torch.Tensor, cb: torch.Tensor, res: torch.Tensor | None, scale: torch.Tensor | None,
                bias: torch.Tensor | None, p: object, n: int, km: int, dtype: torch.dtype) -> torch.Tensor:
    """The main columns' weight ``[N, KM]`` (decoded-column order, normed) rounded to ``dtype``: one pass."""
    c = _common(idx, p)
    has_norm = scale is not None
    w = torch.empty(n, km, dtype=dtype, device=idx.device)
    bj, bk = max(1, 64 // c["VP"]), 64
    grid = (triton.cdiv(c["J"], bj), triton.cdiv(km, bk))
    vptq_decode_kernel[grid](idx, cb, cb if res is None else res, scale if has_norm else cb,
                             bias if has_norm else cb, w, n, KM=km, BJ=bj, BK=bk, HAS_RES=res is not None,
                             HAS_NORM=has_norm, enable_fp_fusion=False, num_warps=4, **c)
    return w
