"""FP8 weights (``float8_e4m3fn`` / ``float8_e5m2``, the checkpoint's ``[N, K]``) times float16/bfloat16 activations.

``y[m, n] = sum_k x[m, k] * float(w[n, k]) * scale[n // bn, k // bk] (+ bias[n])``, float32 accumulation, y in
x's dtype. Every e4m3/e5m2 value is exact in float16, bfloat16 and float32, so the products are exact; block
scales are applied in float32 (``fp_common``: ``KCONST``/``STEP``/``GROUPS``/``FOLD``). This module holds the
tensor-core body and the launcher; ``fp8mv`` the CUDA-core GEMV, the dense pass and the decode.

Variants (``choose_variant(m, n, k)`` picks one from M; a caller overrides with ``variant=`` or ``config=``):

* ``gemv`` (M <= 4): CUDA cores, one byte per weight streamed once; ``block_m`` rows (1, 2, 4) share each
  decoded weight tile, each row with a ``[BN, BK]`` float32 accumulator reduced once at the end; split-K
  over CTAs where N gives too few tiles.
* ``skinny`` (M <= 32): ``tl.dot`` swap-AB: the decoded weight tile ``[BN, BK]`` is the MMA's A (its 64-row
  side runs over output channels), ``x^T`` its B (``block_m`` rows, padded), split-K.
* ``mma`` (M <= 1024): ``tl.dot`` tiles ``x [BM, BK] @ w^T [BK, BN]`` with the weight decoded in registers
  (fp8 -> x.dtype: ``cvt.rn.f16x2.e4m3x2`` on sm_89+, then ``cvt.bf16.f16`` for bfloat16), L2 swizzle.
* ``dense`` (M > 1024): one pass writes ``w * scale`` in x's dtype (one rounding per weight) into a transient
  ``[N, K]`` chunk, then ``torch.addmm`` (cuBLAS); the chunk is dropped before returning.

Decoding (``decode``): on sm_89+ the hardware conversion (``w.to(x.dtype)``: one ``cvt.rn.f16x2.e4m3x2`` per
pair, plus ``cvt.bf16.f16`` per value for bfloat16), cheaper than bit arithmetic per element. ``BITS``
(``decode_by_bits``: before sm_89, where Triton has no e4m3, or forced by ``FConfig.fp8_bits``; and e5m2 ->
float16 under the interpreter, whose converter loses e5m2 subnormals) builds float16 bits instead: e5m2 is
float16's high byte, e4m3 lands at bits 7-14 as its value times 2^-8 (the float32 result is multiplied by
256). The interpreter decodes the NaN codes (e4m3 0x7F/0xFF, e5m2 0x7D-0x7F...) as finite numbers; weights are
finite.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import store_split
from .fp8mv import MAX_DENSE, decode, decode_by_bits, dense_weight, launch_gemv, wscale
from .fp_common import (
    FOLD,
    M_FOLD,
    M_KCONST,
    M_STEP,
    FConfig,
    check_bias,
    check_fp8_weight,
    check_x,
    elem_scale,
    fail,
    k_range,
    scale_mode,
    sm_count,
    split_buffers,
    split_for,
    step_for,
    step_scale,
    tile_of,
)
from .runtime import bind_cuda_context

VARIANTS = ("gemv", "skinny", "mma", "dense")


@triton.jit
def fp8_dot_kernel(X, W, S, SX, BIAS, Y, PART, LOCK, M, N, K, stride_xm, stride_ym, SBN, SBK, stride_s, SPLIT_K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   SWAP: tl.constexpr, A8: tl.constexpr, TMA: tl.constexpr, SCALE_MODE: tl.constexpr,
                   BITS: tl.constexpr, E5: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
                   EVEN_K: tl.constexpr):
    """The tensor-core body of ``skinny``/``mma`` here and of W8A8 (``fp8_w8a8``).

    ``A8``: x is e4m3 with a float32 scale per row (``SX``) and the product is fp8 x fp8 (wgmma on sm_90);
    else x is float16/bfloat16 and the weight tile is decoded to it in registers. ``SWAP``: the weight tile is
    the MMA's A (``acc [BN, BM]``), for few rows. ``TMA``: ``X`` and ``W`` are host-built tensor descriptors
    (blocks ``[BM, BK]`` and ``[BN, BK]``; out-of-range rows and columns read 0). Grid ``(tiles, SPLIT_K)``.
    """
    pid_m, pid_n, grid_n, offs_m, offs_n, rm, rn = tile_of(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_k = tl.arange(0, BLOCK_K)
    srow = (rn // SBN) * stride_s
    kb0, kb1 = k_range(K, BLOCK_K, SPLIT_K, pid_k)
    if not TMA:
        x_ptr = X + rm[:, None] * stride_xm + offs_k[None, :]
        w_ptr = W + rn[:, None].to(tl.int64) * K + offs_k[None, :]
    if SWAP:  # noqa: SIM108 (constexpr branch)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK_K
        if TMA:
            x = X.load([pid_m * BLOCK_M, k0])
            w = W.load([pid_n * BLOCK_N, k0])
        elif EVEN_K:
            x = tl.load(x_ptr + k0)
            w = tl.load(w_ptr + k0)
        else:
            kmask = (k0 + offs_k) < K
            x = tl.load(x_ptr + k0, mask=kmask[None, :], other=0.0)
            w = tl.load(w_ptr + k0, mask=kmask[None, :], other=0.0)
        if not A8:
            if SCALE_MODE == M_FOLD:
                w = (decode(w, tl.float32, BITS, E5) * elem_scale(S, srow, k0 + offs_k, SBK, K)).to(x.dtype)
            else:
                w = decode(w, x.dtype, BITS, E5)
        if SCALE_MODE == M_STEP:
            s = step_scale(S, srow, k0, SBK)
            if SWAP:
                acc += tl.dot(w, tl.trans(x)) * s[:, None]
            else:
                acc += tl.dot(x, tl.trans(w)) * s[None, :]
        elif SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    if SCALE_MODE == M_KCONST:
        s = tl.load(S + srow)
        acc = acc * (s[:, None] if SWAP else s[None, :])
    if not A8:
        acc = acc * wscale(BITS, E5)
    if A8:
        sx = tl.load(SX + rm)
        acc = acc * (sx[None, :] if SWAP else sx[:, None])
    out = tl.trans(acc) if SWAP else acc
    store_split(Y, BIAS, PART, LOCK, out, offs_m, offs_n, M, N, stride_ym, pid_m * grid_n + pid_n, pid_k, SPLIT_K,
                HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N, BLOCK_M)


def choose_variant(m: int, n: int, k: int) -> str:
    """The variant for an ``[M, K] x [N, K]^T`` call. Crossovers from the H200 sweep at 4096x14336
    (benchmarks/results/h200-gpu_float_sweep-2026-12-04.md): gemv only at M=1 (M=4: 59.7 us against skinny's
    29.0), mma from 33 (M=64: 41.0 against skinny's 51.7), dense above 512 (M=1024: 220.9 against mma's 280)."""
    del n, k
    if m == 1:
        return "gemv"
    if m <= 32:
        return "skinny"
    return "mma" if m <= 512 else "dense"


def fp8_config(variant: str, m: int, n: int, k: int, sms: int = 132, bk: int | None = None) -> FConfig:
    """Tiles by M bucket for the weight-only kernels (heuristic for H100/H200-class GPUs; registers and shared
    memory checked offline for sm_90). ``bk``: the scale block width; blocks narrower than K (``STEP``) keep a
    second accumulator per step, so ``mma`` stays at 128x128 tiles (128x256 spills there)."""
    if variant == "gemv":  # each row's accumulator is a [BN, BK] float32 tile: about 64 of them a thread
        rows = 1 if m == 1 else (2 if m == 2 else 4)
        bn, bk, warps = {1: (8, 512, 4), 2: (16, 256, 4), 4: (16, 128, 4)}[rows]  # M=1: 8x512 20.2 us, 16x512 25.6
        return FConfig("gemv", rows, bn, bk, split_for(-(-n // bn) * -(-m // rows), k, bk, sms, 8), warps, 3)
    if variant == "skinny":  # sweep: 16x64x128 with split 4, 4 stages (29.0 us at M=4)
        bm = 16 if m <= 16 else 32
        bn, bk = 64, 128
        return FConfig("skinny", bm, bn, bk, split_for(-(-n // bn) * -(-m // bm), k, bk, sms, 6), 4, 4)
    tma = k % 16 == 0  # TMA operand loads won every mma row of the sweep (41.0 vs 41.6, 73.3 vs 98.4, 280 vs 323)
    if variant == "mma":
        if m <= 128:
            return FConfig("mma", 64, 128, 64, split_for(-(-n // 128) * -(-m // 64), k, 64, sms, 2, 4), 4, 4,
                           tma=tma)
        return FConfig("mma", 128, 128, 64, 1, 8, 4, tma=tma)
    if variant == "dense":
        return FConfig("dense", 1, 32, 256, 1, 4, 1)
    raise ValueError(f"fp8_linear: variant: expected one of {', '.join(VARIANTS)}, found {variant!r}")


def launch_dot(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bn: int, bk: int, bias: torch.Tensor | None,
               cfg: FConfig, y: torch.Tensor, sx: torch.Tensor | None = None,
               lock: torch.Tensor | None = None) -> torch.Tensor:
    """``fp8_dot_kernel`` for ``skinny``/``mma`` (weight-only) and W8A8 (``sx`` given: x is e4m3)."""
    m, k = x.shape
    n = w.shape[0]
    a8 = sx is not None
    bk_step = step_for(bk, k, cfg.block_k, 32 if a8 else 16)
    mode = scale_mode(bk, k, bk_step)
    if a8 and mode == FOLD:
        raise fail("fp8_w8a8_linear", "block", "bk >= K or a multiple of 32 (fp8 MMA K steps)", (bn, bk))
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    split = max(1, min(cfg.split_k, triton.cdiv(k, bk_step)))
    part, lck = split_buffers(m, n, tiles, split, x.device, lock)
    bits = not a8 and decode_by_bits(w, x.dtype, cfg)
    xa, wa = x, w.view(torch.uint8) if bits else w
    if cfg.tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bind_cuda_context(x.device)
        if (k * x.element_size()) % 16 or k % 16:
            raise fail("fp8 tma", "x", "rows of a multiple of 16 bytes (K % 16 == 0) for TMA", f"K = {k}")
        xa = TensorDescriptor.from_tensor(x, [cfg.block_m, bk_step])
        wa = TensorDescriptor.from_tensor(wa, [cfg.block_n, bk_step])
    fp8_dot_kernel[(tiles, split)](
        xa, wa, scale, sx if a8 else scale, bias if bias is not None else y, y, part if part is not None else y,
        lck if lck is not None else y, m, n, k, x.stride(0), y.stride(0), bn, bk, scale.stride(0), split,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk_step, GROUP_M=cfg.group_m,
        SWAP=cfg.variant == "skinny", A8=a8, TMA=cfg.tma, SCALE_MODE=mode, BITS=bits,
        E5=w.dtype == torch.float8_e5m2,
        HAS_BIAS=bias is not None, SPLIT=split > 1, EVEN_K=k % bk_step == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y


def fp8_linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
               bias: torch.Tensor | None = None, variant: str | None = None, config: FConfig | None = None,
               lock: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K] @ (w * scale)^T (+ bias)`` -> ``[M, N]`` in x's dtype (module docstring).

    ``variant`` overrides ``choose_variant``; ``config`` overrides the tiles too (its variant wins).
    ``lock``: int32 zeros a caller keeps for split-K counters (left at zero), else allocated when needed.
    """
    op = "fp8_linear"
    x = check_x(op, x)
    m, k = x.shape
    n, bn, bk = check_fp8_weight(op, w, scale, block, k, x.device)
    check_bias(op, bias, n, x.device)
    if config is None:
        v = variant or choose_variant(m, n, k)
        if v not in VARIANTS:
            raise fail(op, "variant", "one of " + ", ".join(VARIANTS), repr(v))
        config = fp8_config(v, m, n, k, sm_count(x.device), bk)
    elif config.variant not in VARIANTS:
        raise fail(op, "config.variant", "one of " + ", ".join(VARIANTS), repr(config.variant))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_() if bias is None else y.copy_(bias.expand(m, n))
    if config.variant == "dense":
        chunk = max(bn, MAX_DENSE // k // bn * bn)
        b = bias.to(x.dtype) if bias is not None else None
        for n0 in range(0, n, chunk):
            n1 = min(n, n0 + chunk)
            wd = dense_weight(w, scale, bn, bk, x.dtype, config, n0, n1)
            y[:, n0:n1] = torch.addmm(b[n0:n1], x, wd.t()) if b is not None else x @ wd.t()
            del wd
        return y
    if config.variant == "gemv":
        return launch_gemv(x, w, scale, bn, bk, bias, config, y, lock)
    return launch_dot(x, w, scale, bn, bk, bias, config, y, lock=lock)
