"""W4A8-FP8: GPTQ int4 weights times per-token E4M3 activations on FP8 tensor cores (sm_89+).

The centred codes ``q - 8`` (-8..7) are exact E4M3 values, so each 128-wide group's product ``xq . (q - 8)`` runs
as one FP8 ``tl.dot`` into a float32 partial, scaled by the group's scale and added; the rows are scaled by their
activation scale at the end: ``y[m, n] = sx[m] * sum_g s[g, n] * sum_{k in g} xq[m, k] (q[k, n] - 8)``. The codes
are unpacked from GPTQ's int32 words (8 along K) and converted to E4M3 in registers, a tile at a time: no E4M3
copy of the weight is kept (the reference keeps one, ``_weight_e4m3``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp_common import check_tensor, fail
from .runtime import interpreting

GROUP = 128


@triton.jit
def w4afp8_kernel(XQ, SX, W, S, BIAS, Y, M, N, K, stride_xm, stride_ym, stride_s,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr):
    """One ``[BLOCK_M, BLOCK_N]`` output tile over all groups (a K step is one 128-wide group)."""
    G: tl.constexpr = 128
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = offs_m % M  # wrapped: every load in range; rows and columns past the edge are never stored
    rn = offs_n % N
    offs_k = tl.arange(0, G)
    rows = tl.arange(0, G // 8)
    shifts = (tl.arange(0, 8) * 4)[None, :, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, K // G):
        xq = tl.load(XQ + rm[:, None] * stride_xm + (g * G + offs_k)[None, :])
        words = tl.load(W + (g * (G // 8) + rows)[:, None].to(tl.int64) * N + rn[None, :])
        codes = (words[:, None, :] >> shifts) & 0xF  # [16, 8, BN]: field j of word r is k = 8r + j
        q = tl.reshape(codes, (G, BLOCK_N)) - 8
        wq = q.to(tl.float16).to(XQ.dtype.element_ty)
        part = tl.dot(xq, wq)
        s = tl.load(S + g * stride_s + rn).to(tl.float32)
        acc += part * s[None, :]
    acc *= tl.load(SX + rm).to(tl.float32)[:, None]
    if HAS_BIAS:
        acc += tl.load(BIAS + rn).to(tl.float32)[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=mask)


def w4afp8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                  block_m: int | None = None, block_n: int | None = None, num_warps: int = 4,
                  num_stages: int = 3) -> torch.Tensor:
    """``x [M, K]`` (float16/bfloat16) quantized to E4M3 per token, times GPTQ 4-bit symmetric g128 words
    ``qweight [K/8, N]`` int32 with ``scales [K/128, N]`` (float16/bfloat16/float32); returns ``[M, N]`` in x's dtype.
    """
    from .fp8_w8a8 import quantize_fp8_per_token

    op = "w4afp8_linear"
    check_tensor(op, "x", x, (torch.float16, torch.bfloat16))
    if x.dim() != 2:
        raise fail(op, "x", "a 2-D [M, K] tensor", f"shape {list(x.shape)}")
    m, k = x.shape
    if k % GROUP:
        raise fail(op, "x", f"K a multiple of {GROUP}", f"K = {k}")
    check_tensor(op, "qweight", qweight, (torch.int32,), device=x.device)
    if qweight.dim() != 2 or qweight.shape[0] * 8 != k:
        raise fail(op, "qweight", f"int32 [{k // 8}, N] (8 codes along K a word)", f"shape {list(qweight.shape)}")
    n = qweight.shape[1]
    check_tensor(op, "scales", scales, (torch.float16, torch.bfloat16, torch.float32), shape=(k // GROUP, n),
                 device=x.device)
    if bias is not None:
        check_tensor(op, "bias", bias, None, shape=(n,), device=x.device)
    if x.device.type != "cuda" and not interpreting():
        raise fail(op, "x", "a CUDA tensor (TRITON_INTERPRET=1 runs the kernel on CPU tensors, for tests)", x.device)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    xq, sx = quantize_fp8_per_token(x.contiguous())
    # H200 tiles (benchmarks/results/h200-gpu_w4afp8-2026-12-04.md, 4096x14336): 16x64 at M=1 48.8 us against
    # 16x128's 73.8; 128x128 from M=256. The unpack of K-packed words, not the tile, bounds the kernel.
    bm = block_m or (16 if m <= 16 else (64 if m <= 64 else 128))
    bn = block_n or (64 if m <= 16 else 128)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    w4afp8_kernel[grid](xq, sx, qweight, scales, bias if bias is not None else y, y, m, n, k, xq.stride(0),
                        y.stride(0), scales.stride(0), BLOCK_M=bm, BLOCK_N=bn, HAS_BIAS=bias is not None,
                        num_warps=num_warps, num_stages=num_stages)
    return y
