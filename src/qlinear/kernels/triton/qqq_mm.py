"""QQQ W4A8 on the GPU: per-token int8 activations times int8 weights unpacked from 4-bit words, exact int32 sums.

``quantize_rows(x)``: per row ``s1 = dtype(max|x| / 127)`` (IEEE division in float32 rounded to x's dtype, as torch
divides a float16/bfloat16 tensor by a scalar), ``xq = clamp(rne(x / s1), -128, 127)``; a zero row gets ``s1 = 0``
and codes 0. One program per row; rows up to ``ONE_PASS_K`` stay in registers (one read), longer ones are read twice.

``qqq_mm(xq, s1, words, sg, sc, ...)``: ``acc = sum_k xq * w8`` exactly, then ``y = dtype(float32(acc) * s1 * sc)``
and ``+ bias`` in the output dtype, as GPTQModel's torch path. The weights are ``kernels/qqq.py``'s runtime words
``[KP/8, N]`` (nibble ``c + 8``), a 128-deep K step unpacking to 8 fields of 16 rows in natural K order. The int8
weight: grouped ``clamp(rne((q - 8) * s), -128, 127)`` in float32, ``q - 8`` read exactly from a nibble OR-ed into
the mantissa of 2^23 and one FMA, the rounding by adding 1.5 * 2^23 (whose float's low byte is then the int8 two's
complement: no int<->float conversions); per-channel ``16 (q - 8)``. Variants (``QConfig.variant``):

* ``gemv`` (M <= 4): CUDA cores; each weight decoded once to its int8 value as a float32 and multiplied by the rows'
  int8 activations, products summed in float32 within a step (exact: below 2^21), steps added in int32;
* ``dense`` (M > 4): ``w8_dense_kernel`` writes the int8 weight ``[N, KP]`` into a transient buffer (dropped on
  return), then ``qqq_mm_kernel`` multiplies it by ``tl.dot`` int8 x int8 -> int32 (mma / wgmma);
* ``mma``: ``qqq_mm_kernel`` unpacking the words inside its K loop; correct, but slow on Triton 3.6 (the int8
  operand built in registers is re-laid out through shared memory in every tile), so AUTO never picks it.

Split-K programs write int32 partials (exact, so the sum is order-free); the last one of a tile (an acq_rel counter)
adds them and finishes. Under the interpreter float32 -> bfloat16 casts round by integer arithmetic (the
interpreter's own cast truncates), so the interpreter reproduces the GPU's numbers bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .common import stack2, to_dtype
from .fp_common import check_tensor, fail, k_range, sm_count, split_for, tile_of
from .runtime import interpreting

ONE_PASS_K = 8192
STEP = 128  # K rows per step (one runtime block of 16 word rows)


@dataclass(frozen=True)
class QConfig:
    """One launch: tile ``block_m x block_n`` (K steps of 128), split-K ways, warps, stages, M tiles per L2 swizzle
    group, and the variant: ``gemv`` (``qqq_gemv_kernel``, CUDA cores, ``block_m`` rows a program), ``mma``
    (``qqq_mm_kernel`` unpacking the words in every tile), ``dense`` (the int8 weight written whole first into a
    transient ``[N, KP]`` by ``w8_dense_kernel``, then ``qqq_mm_kernel`` reads it)."""

    block_m: int
    block_n: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    variant: str = "mma"


VARIANTS = ("gemv", "mma", "dense")


def qqq_config(m: int, n: int, kp: int, sms: int = 132) -> QConfig:
    """The variant and tiles by M (benchmarks/gpu_qqq.py measures them). H200, 4096x14336 g128, bf16: unpacking the
    words inside the ``tl.dot`` loop (``mma``) cost 83 us at M = 16, 186 at 256 and 2652 at 4096 (the int8 operand's
    register layout is converted through shared memory in every tile), ``dense`` 45.8 / 59.6 / 394 us (128x128, 8
    warps, 3 stages above 64 rows), ``gemv`` 41.0 us at M = 1 (benchmarks/results/h200-gpu_qqq-2026-12-04*.md)."""
    if m == 1:  # sweep at 4096x14336: 1x64 split 8 41.0 us, 1x128 split 5 47.5
        return QConfig(1, 64, max(1, min(8, kp // STEP // 2)), 4, 3, variant="gemv")
    if m <= 4:
        rows = 2 if m == 2 else 4
        bn = 128 if rows <= 2 else 64
        return QConfig(rows, bn, split_for(triton.cdiv(n, bn), kp, STEP, sms, 4), 4, 3, variant="gemv")
    if m <= 16:  # sweep at 4096x14336: 16x64 split 2 45.8 us, 16x128 split 5 54.9
        return QConfig(16, 64, 2 if triton.cdiv(n, 64) < 4 * sms else 1, 4, 4, variant="dense")
    if m <= 64:
        bm = 32 if m <= 32 else 64
        split = split_for(triton.cdiv(m, bm) * triton.cdiv(n, 128), kp, STEP, sms, 4)
        return QConfig(bm, 128, split, 4, 4, variant="dense")
    return QConfig(128, 128, 1, 8, 3, variant="dense")


@triton.jit
def quant_store(XQ, off, mask, v, d):
    q = tl.minimum(tl.maximum(tl.math.div_rn(v, d), -128.0), 127.0)
    q = (q + 12582912.0) - 12582912.0  # round half to even (|q| < 2^22)
    tl.store(XQ + off, q.to(tl.int8), mask=mask)


@triton.jit
def quant_rows_kernel(X, XQ, S1, K, stride_xm, stride_qm, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
                      BF16_BITS: tl.constexpr):
    """Row ``program_id(0)``: its scale (float32, a value of x's dtype), then its int8 codes."""
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    row = X + m.to(tl.int64) * stride_xm
    qrow = XQ + m.to(tl.int64) * stride_qm
    if ONE_PASS:
        v = tl.load(row + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(v), axis=0)
    else:
        part = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            part = tl.maximum(part, tl.abs(tl.load(row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)))
        amax = tl.max(part, axis=0)
    s = to_dtype(tl.math.div_rn(amax, 127.0), X.dtype.element_ty, BF16_BITS).to(tl.float32)
    tl.store(S1 + m, s)
    d = tl.where(s == 0.0, 1.0, s)
    if ONE_PASS:
        quant_store(qrow, offs, offs < K, v, d)
    else:
        for k0 in range(0, K, BLOCK):
            v = tl.load(row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            quant_store(qrow, k0 + offs, k0 + offs < K, v, d)


@triton.jit
def field(w, lo, hi, s, j: tl.constexpr, GROUPED: tl.constexpr):
    """Field ``j`` of every word as int8 weights (module docstring)."""
    if GROUPED:
        i: tl.constexpr = j % 4
        half = lo if j < 4 else hi
        f = (half & ((15 << (4 * i)) | 0x4B000000)).to(tl.float32, bitcast=True)  # 2^23 + q * 16^i
        c: tl.constexpr = 1.0 / (1 << (4 * i))
        v = tl.fma(f, c, -(8388608.0 * c + 8.0)) * s  # (q - 8) exactly, then the one rounding of the product
        v = tl.minimum(tl.maximum(v, -128.0), 127.0) + 12582912.0  # round half to even; low byte = two's complement
        return v.to(tl.int32, bitcast=True).to(tl.int8)
    elif j == 0:  # 16 (q - 8): the nibble in a byte's high half, top bit flipped
        return (((w << 4) & 0xF0) ^ 0x80).to(tl.int8)
    else:
        return (((w >> (4 * j - 4)) & 0xF0) ^ 0x80).to(tl.int8)


@triton.jit
def field_f32(lo, hi, s, j: tl.constexpr, GROUPED: tl.constexpr):
    """Field ``j`` of every word as the int8 weight's value in float32 (exact), for the CUDA-core GEMV."""
    i: tl.constexpr = j % 4
    half = lo if j < 4 else hi
    f = (half & ((15 << (4 * i)) | 0x4B000000)).to(tl.float32, bitcast=True)  # 2^23 + q * 16^i
    c: tl.constexpr = 1.0 / (1 << (4 * i))
    if GROUPED:
        v = tl.fma(f, c, -(8388608.0 * c + 8.0)) * s
        v = tl.minimum(tl.maximum(v, -128.0), 127.0) + 12582912.0
        return v - 12582912.0
    else:
        return tl.fma(f, 16.0 * c, -(8388608.0 * 16.0 * c + 128.0))  # 16 (q - 8)


@triton.jit
def w8_tile(w, s, GROUPED: tl.constexpr):
    """Words ``[16, BN]`` -> int8 weights ``[128, BN]``, row ``16 j + r`` = field ``j`` of word row ``r``."""
    lo = (w & 0xFFFF) | 0x4B000000
    hi = ((w >> 16) & 0xFFFF) | 0x4B000000
    a = stack2(stack2(field(w, lo, hi, s, 0, GROUPED), field(w, lo, hi, s, 1, GROUPED)),
               stack2(field(w, lo, hi, s, 2, GROUPED), field(w, lo, hi, s, 3, GROUPED)))
    b = stack2(stack2(field(w, lo, hi, s, 4, GROUPED), field(w, lo, hi, s, 5, GROUPED)),
               stack2(field(w, lo, hi, s, 6, GROUPED), field(w, lo, hi, s, 7, GROUPED)))
    return stack2(a, b)


@triton.jit
def w8_dense_kernel(W, SG, W8T, N, KP, GS, BLOCK_N: tl.constexpr, GROUPED: tl.constexpr):
    """K step ``program_id(0)``, columns ``program_id(1)``: the int8 weight, transposed into ``W8T [N, KP]``."""
    kb = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nn = rn < N
    w = tl.load(W + (kb * 16 + tl.arange(0, 16))[:, None].to(tl.int64) * N + rn[None, :], mask=nn[None, :], other=0)
    if GROUPED:  # noqa: SIM108 (constexpr branch)
        s = tl.load(SG + (kb * 128 // GS) * N + rn, mask=nn, other=0.0)[None, :]
    else:
        s = 0.0
    kk = kb * 128 + tl.arange(0, 128)
    tl.store(W8T + rn[None, :].to(tl.int64) * KP + kk[:, None], w8_tile(w, s, GROUPED), mask=nn[None, :])


@triton.jit
def finish(Y, S1, SC, BIAS, acc, offs_m, offs_n, M, N, stride_ym, HAS_BIAS: tl.constexpr, BF16_BITS: tl.constexpr):
    """``y = dtype(float32(acc) * s1 * sc)`` (+ bias in the output dtype); writes the in-range elements."""
    mm, nn = offs_m < M, offs_n < N
    s1 = tl.load(S1 + offs_m, mask=mm, other=0.0)
    sc = tl.load(SC + offs_n, mask=nn, other=0.0)
    y = acc.to(tl.float32) * s1[:, None]
    y = y * sc[None, :]
    DT: tl.constexpr = Y.dtype.element_ty
    y = to_dtype(y, DT, BF16_BITS)
    if HAS_BIAS:
        b = tl.load(BIAS + offs_n, mask=nn, other=0.0).to(tl.float32)
        y = to_dtype(y.to(tl.float32) + b[None, :], DT, BF16_BITS)
    tl.store(Y + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], y, mask=mm[:, None] & nn[None, :])


@triton.jit
def qqq_mm_kernel(XQ, S1, W, SG, SC, BIAS, Y, PART, LOCK, M, N, K, KP, stride_xm, stride_ym, GS, SPLIT_K,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, GROUPED: tl.constexpr,
                  HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BF16_BITS: tl.constexpr,
                  DENSE: tl.constexpr):
    """Tile ``program_id(0)`` (swizzled), K split ``program_id(1)``: int8 tiles, int32 ``tl.dot``, then finish.
    ``DENSE``: ``W`` is the int8 weight ``[N, KP]`` (``w8_dense_kernel``), read as is."""
    pid_m, pid_n, grid_n, offs_m, offs_n, rm, rn = tile_of(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    kb0, kb1 = k_range(KP, 128, SPLIT_K, pid_k)
    offs_k = tl.arange(0, 128)
    x_ptr = XQ + rm[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    if DENSE:
        w_ptr = W + rn[:, None].to(tl.int64) * KP + offs_k[None, :]
    else:
        w_ptr = W + tl.arange(0, 16)[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for kb in range(kb0, kb1):
        k0 = kb * 128
        if EVEN_K:  # noqa: SIM108 (constexpr branch)
            x = tl.load(x_ptr + k0)
        else:
            x = tl.load(x_ptr + k0, mask=(k0 + offs_k < K)[None, :], other=0)
        if DENSE:
            acc = tl.dot(x, tl.trans(tl.load(w_ptr + k0)), acc, out_dtype=tl.int32)
        else:
            w = tl.load(w_ptr + kb * 16 * N)
            if GROUPED:  # noqa: SIM108 (constexpr branch)
                s = tl.load(SG + (k0 // GS) * N + rn)[None, :]
            else:
                s = 0.0
            acc = tl.dot(x, w8_tile(w, s, GROUPED), acc, out_dtype=tl.int32)
    store_acc(Y, S1, SC, BIAS, PART, LOCK, acc, offs_m, offs_n, M, N, stride_ym, pid_m * grid_n + pid_n, pid_k,
              SPLIT_K, BLOCK_M, BLOCK_N, HAS_BIAS, SPLIT, BF16_BITS)


@triton.jit
def store_acc(Y, S1, SC, BIAS, PART, LOCK, acc, offs_m, offs_n, M, N, stride_ym, tile, pid_k, SPLIT_K,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
              BF16_BITS: tl.constexpr):
    """Finish an int32 tile directly, or write it as split ``pid_k``'s partial; the last split of the tile (an acq_rel
    counter ``LOCK[tile]``, reset to 0 by it) adds the partials (exact) and finishes."""
    if not SPLIT:
        finish(Y, S1, SC, BIAS, acc, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, BF16_BITS)
    else:
        mn = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        part = PART + offs_m[:, None] * N + offs_n[None, :]
        tl.store(part + pid_k * M * N, acc, mask=mn)
        tl.debug_barrier()  # every thread's partial is written before the counter is released
        seen = tl.atomic_add(LOCK + tile, 1, sem="acq_rel", scope="gpu")
        if seen == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
            for sk in range(0, SPLIT_K):
                total += tl.load(part + sk * M * N, mask=mn, other=0, cache_modifier=".cg")
            finish(Y, S1, SC, BIAS, total, offs_m, offs_n, M, N, stride_ym, HAS_BIAS, BF16_BITS)
            tl.atomic_xchg(LOCK + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def qqq_gemv_kernel(XQ, S1, W, SG, SC, BIAS, Y, PART, LOCK, M, N, K, KP, stride_xm, stride_ym, GS, SPLIT_K,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, GROUPED: tl.constexpr, HAS_BIAS: tl.constexpr,
                    SPLIT: tl.constexpr, EVEN_K: tl.constexpr, BF16_BITS: tl.constexpr):
    """CUDA cores, ``ROWS`` rows a program: every weight decoded once to its int8 value in float32 and multiplied
    by each row's int8 activations; products summed in float32 within a 128-deep step (exact: < 2^21), the step's
    sums added in int32. Tile ``program_id(0)`` (row block major), K split ``program_id(1)``."""
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tl.program_id(0) // grid_n, tl.program_id(0) % grid_n
    pid_k = tl.program_id(1)
    offs_m = pid_m * ROWS + tl.arange(0, ROWS)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    r16 = tl.arange(0, 16)
    x_ptr = XQ + (offs_m % M)[:, None].to(tl.int64) * stride_xm + r16[None, :]
    w_ptr = W + r16[:, None].to(tl.int64) * N + (offs_n % N)[None, :]
    kb0, kb1 = k_range(KP, 128, SPLIT_K, pid_k)
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.int32)
    for kb in range(kb0, kb1):
        k0 = kb * 128
        w = tl.load(w_ptr + kb * 16 * N)
        if GROUPED:  # noqa: SIM108 (constexpr branch)
            s = tl.load(SG + (k0 // GS) * N + (offs_n % N))[None, :]
        else:
            s = 0.0
        lo = (w & 0xFFFF) | 0x4B000000
        hi = ((w >> 16) & 0xFFFF) | 0x4B000000
        part = tl.zeros((ROWS, 16, BLOCK_N), dtype=tl.float32)
        for j in tl.static_range(8):
            if EVEN_K:
                xj = tl.load(x_ptr + k0 + 16 * j)
            else:
                xj = tl.load(x_ptr + k0 + 16 * j, mask=(k0 + 16 * j + r16 < K)[None, :], other=0)
            part += xj.to(tl.float32)[:, :, None] * field_f32(lo, hi, s, j, GROUPED)[None, :, :]
        acc += tl.sum(part, axis=1).to(tl.int32)
    store_acc(Y, S1, SC, BIAS, PART, LOCK, acc, offs_m, offs_n, M, N, stride_ym, tl.program_id(0), pid_k, SPLIT_K,
              ROWS, BLOCK_N, HAS_BIAS, SPLIT, BF16_BITS)


def _check_x(op: str, name: str, x: object, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    check_tensor(op, name, x, dtypes, contiguous=False)
    assert isinstance(x, torch.Tensor)
    if x.dim() != 2 or (x.shape[1] > 1 and x.stride(1) != 1):
        raise fail(op, name, "a 2-D [M, K] tensor with unit stride along K",
                   f"{x.dim()}-D shape {list(x.shape)} strides {list(x.stride())}")
    if x.device.type != "cuda" and not interpreting():
        raise fail(op, name, "a CUDA tensor (TRITON_INTERPRET=1 runs the kernels on CPU tensors, for tests)", x.device)
    return x


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` float16/bfloat16 -> ``(xq int8 [M, K], s1 float32 [M])`` (module docstring)."""
    x = _check_x("qqq quantize_rows", "x", x, (torch.float16, torch.bfloat16))
    m, k = x.shape
    xq = torch.empty((m, k), dtype=torch.int8, device=x.device)
    s1 = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        return xq, s1.zero_()
    one = k <= ONE_PASS_K
    block = triton.next_power_of_2(k) if one else 4096
    quant_rows_kernel[(m,)](x, xq, s1, k, x.stride(0), xq.stride(0), BLOCK=block, ONE_PASS=one,
                            BF16_BITS=interpreting() and x.dtype == torch.bfloat16,
                            num_warps=8 if block >= 4096 else 4)
    return xq, s1


def qqq_mm(xq: torch.Tensor, s1: torch.Tensor, words: torch.Tensor, sg: torch.Tensor | None, sc: torch.Tensor,
           bias: torch.Tensor | None, out_dtype: torch.dtype, group_size: int = 0, config: QConfig | None = None,
           lock: torch.Tensor | None = None) -> torch.Tensor:
    """``xq [M, K]`` int8 (row scales ``s1 [M]``) times the runtime words ``[KP/8, N]`` -> ``[M, N]`` ``out_dtype``.

    ``sg [K/group_size, N]`` float32 group scales (``group_size`` a multiple of 128) or None per-channel; ``sc [N]``
    float32; ``bias [N]`` in ``out_dtype``; ``lock`` int32 zeros for split-K counters (kept at zero), else allocated.
    """
    op = "qqq_mm"
    _check_x(op, "xq", xq, (torch.int8,))
    m, k = xq.shape
    dev = xq.device
    check_tensor(op, "s1", s1, (torch.float32,), (m,), dev)
    check_tensor(op, "words", words, (torch.int32,), device=dev)
    if words.dim() != 2 or words.shape[0] * 8 != -(-k // STEP) * STEP:
        raise fail(op, "words", f"int32 [{-(-k // STEP) * STEP // 8}, N] (K = {k} rounded up to 128, / 8)",
                   list(words.shape))
    n, kp = words.shape[1], words.shape[0] * 8
    check_tensor(op, "sc", sc, (torch.float32,), (n,), dev)
    if sg is not None:
        if group_size <= 0 or group_size % STEP or k % group_size:
            raise fail(op, "group_size", f"a multiple of {STEP} dividing K = {k}", group_size)
        check_tensor(op, "sg", sg, (torch.float32,), (k // group_size, n), dev)
    if out_dtype not in (torch.float16, torch.bfloat16):
        raise fail(op, "out_dtype", "float16 or bfloat16", out_dtype)
    if bias is not None:
        check_tensor(op, "bias", bias, (out_dtype,), (n,), dev)
    y = torch.empty((m, n), dtype=out_dtype, device=dev)
    if m == 0 or n == 0:
        return y
    cfg = config or qqq_config(m, n, kp, sm_count(dev))
    tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    split = max(1, min(cfg.split_k, kp // STEP))
    if split * m * n >= 1 << 31:
        split = 1
    part = torch.empty((split, m, n), dtype=torch.int32, device=dev) if split > 1 else y
    if split > 1 and (lock is None or lock.numel() < tiles):
        lock = torch.zeros(tiles, dtype=torch.int32, device=dev)
    if cfg.variant not in VARIANTS:
        raise fail(op, "config.variant", "one of " + ", ".join(VARIANTS), repr(cfg.variant))
    args = (xq, s1, words, sg if sg is not None else sc, sc, bias if bias is not None else y, y, part,
            lock if split > 1 else y, m, n, k, kp, xq.stride(0), y.stride(0), max(group_size, 1), split)
    flags = {"GROUPED": sg is not None, "HAS_BIAS": bias is not None, "SPLIT": split > 1, "EVEN_K": k % STEP == 0,
             "BF16_BITS": interpreting() and out_dtype == torch.bfloat16}
    if cfg.variant == "gemv":
        qqq_gemv_kernel[(tiles, split)](*args, ROWS=cfg.block_m, BLOCK_N=cfg.block_n, **flags,
                                        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return y
    if cfg.variant == "dense":
        w8 = torch.empty((n, kp), dtype=torch.int8, device=dev)
        w8_dense_kernel[(kp // STEP, triton.cdiv(n, 64))](words, args[3], w8, n, kp, max(group_size, 1), BLOCK_N=64,
                                                          GROUPED=sg is not None)
        args = (*args[:2], w8, *args[3:])
    qqq_mm_kernel[(tiles, split)](*args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, **flags,
                                  DENSE=cfg.variant == "dense", num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y


def qqq_linear(x: torch.Tensor, words: torch.Tensor, sg: torch.Tensor | None, sc: torch.Tensor,
               bias: torch.Tensor | None, group_size: int = 0, config: QConfig | None = None,
               lock: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K]`` float16/bfloat16 -> per-token int8 (``quantize_rows``) -> ``qqq_mm`` -> ``[M, N]`` in x's dtype."""
    xq, s1 = quantize_rows(x)
    return qqq_mm(xq, s1, words, sg, sc, bias, x.dtype, group_size, config, lock)
