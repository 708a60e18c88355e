"""FP4 (E2M1) weights with block scales (NVFP4, MXFP4) times float16/bfloat16 activations, weight-only.

``packed [N, K/2]`` uint8 (read as int32 words of 8 codes; K a multiple of the scale block): low nibble =
column ``2j``, high nibble = column ``2j + 1``; a nibble is E2M1 (bit 3 sign, bits 0-2 index
``[0, 0.5, 1, 1.5, 2, 3, 4, 6]``). ``nvfp4``: ``scales [N, K/16]`` float8_e4m3fn; ``mxfp4``: ``scales [N, K/32]``
uint8 E8M0 (``2^(e - 127)``; e = 255 is NaN: ``mxfp4_scale_errors`` checks that on the host, once, where a
caller prepares the layer; the kernels do not). ``global_mul`` (NVFP4: ``1 / global_scale``, MXFP4: 1.0) scales
the float32 result.

``y[m, n] = global_mul * sum_k x[m, k] * e2m1(code[n, k]) * scale[n, k // bs] (+ bias[n])``, in x's dtype.

Decoding is plain integer arithmetic on 32-bit words (sm_90 has no E2M1 conversion instruction): a nibble's
bits placed at float16 bits 9-11 (magnitude) and 15 (sign) are the float16 of its value times 2^-14, subnormal
0.5 included, and nibbles ``i``, ``i + 4`` of a word land in one register's two halves with two shifts and a
LOP3 (``e2m1_pair``). The weight is that value times ``scale * 2^14`` in float32 (every E2M1 x e4m3 / E8M0
product is exact there), then rounded to x's dtype for the tensor-core variants: exact whenever the weight
is representable in it (NVFP4: always, in float16 and bfloat16; MXFP4: bfloat16 for e <= 240, float16 for
weights within float16's range). The CUDA-core GEMV keeps float32.

Variants (``choose_fp4_variant(m, n, k)``; a caller overrides with ``variant=`` or ``config=``): ``gemv``
(M <= 4, CUDA cores, split-K), ``skinny`` (M <= 32, swap-AB ``tl.dot``), ``mma`` (tiles, L2 swizzle), ``dense``
(M > 1024: a transient dense ``[N, K]`` chunk and cuBLAS), with the same bodies' structure as ``fp8mm``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import store_split
from .fp8mv import MAX_DENSE, fp8_bits, rows_out
from .fp_common import (
    FConfig,
    check_bias,
    check_tensor,
    check_x,
    fail,
    k_range,
    repeat_cols,
    sm_count,
    split_buffers,
    split_for,
    tile_of,
)

#: kind -> (values per scale, scale dtype)
KINDS = {"nvfp4": (16, torch.float8_e4m3fn), "mxfp4": (32, torch.uint8)}
VARIANTS = ("gemv", "skinny", "mma", "dense")


@triton.jit
def e2m1_pair(u, i: tl.constexpr):
    """Nibbles ``i`` and ``i + 4`` of uint32 words ``u`` (columns ``8j + i``, ``8j + i + 4``) as float16 values
    times 2^-14: both land in one 32-bit pair by two shifts and a LOP3, magnitude at bits 9-11, sign at 15."""
    if i == 3:  # noqa: SIM108 (constexpr branch)
        mag = (u >> 3) & 0x0E000E00
    else:
        mag = (u << (9 - 4 * i)) & 0x0E000E00
    p = mag | ((u << (12 - 4 * i)) & 0x80008000)
    lo = (p & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (p >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    return lo, hi


@triton.jit
def word_scales(S, rn, w0, KS, BKW: tl.constexpr, GS: tl.constexpr, MX: tl.constexpr):
    """Scales of words ``w0 .. w0 + BKW`` (8 weights each) of rows ``rn``, float32 times 2^14, ``[BN, BKW]``.
    The scale bytes are read as uint8 and decoded by bit arithmetic (no FP8 type needed: sm_80 runs it too)."""
    g = (8 * w0) // GS + tl.arange(0, 8 * BKW // GS)
    raw = tl.load(S + rn[:, None].to(tl.int64) * KS + g[None, :], mask=(g < KS)[None, :], other=0)
    if MX:
        e = raw.to(tl.int32)
        s = tl.where(e == 0, 0x00400000, e << 23).to(tl.float32, bitcast=True) * 16384.0  # e = 0: 2^-127
    else:  # e4m3 as float16 bits: its value times 2^-8
        s = fp8_bits(raw, False).to(tl.float32) * 4194304.0  # 2^8 * 2^14
    return repeat_cols(s, GS // 8)


@triton.jit
def load_words(p_ptr, w0, KW, BKW: tl.constexpr, EVEN_K: tl.constexpr):
    """The step's packed words ``[BN, BKW]`` as uint32 (words past K read 0)."""
    if EVEN_K:  # noqa: SIM108 (constexpr branch)
        u = tl.load(p_ptr + w0)
    else:
        u = tl.load(p_ptr + w0, mask=(w0 + tl.arange(0, BKW) < KW)[None, :], other=0)
    return u.to(tl.uint32, bitcast=True)


@triton.jit
def scaled(t, s, DT: tl.constexpr):
    return (t.to(tl.float32) * s).to(DT)


@triton.jit
def fp4_tile(u, s, DT: tl.constexpr):
    """Words ``[BN, BKW]`` and their scales -> weights ``[BN, 8 BKW]`` in ``DT``, columns in K order: the eight
    ``[BN, BKW]`` fields joined innermost-last (``join`` + ``reshape``: register renames, no data movement)."""
    t0, t4 = e2m1_pair(u, 0)
    t1, t5 = e2m1_pair(u, 1)
    t2, t6 = e2m1_pair(u, 2)
    t3, t7 = e2m1_pair(u, 3)
    j = tl.join(tl.join(tl.join(scaled(t0, s, DT), scaled(t4, s, DT)), tl.join(scaled(t2, s, DT), scaled(t6, s, DT))),
                tl.join(tl.join(scaled(t1, s, DT), scaled(t5, s, DT)), tl.join(scaled(t3, s, DT), scaled(t7, s, DT))))
    return tl.reshape(j, (u.shape[0], 8 * u.shape[1]))


@triton.jit
def row_step(acc, f0, f1, f2, f3, f4, f5, f6, f7, s, xrow, kw, KW):
    """One row's GEMV step: per word ``sum_i f_i x[8 w + i]`` (exact products, float32), times the word's
    scale, into ``acc [BN, BKW]``. x comes as eight strided loads of ``BKW`` values."""
    ok = kw < KW
    b = xrow + 8 * kw
    t = f0 * tl.load(b, mask=ok, other=0.0).to(tl.float32)[None, :]
    t += f1 * tl.load(b + 1, mask=ok, other=0.0).to(tl.float32)[None, :]
    t += f2 * tl.load(b + 2, mask=ok, other=0.0).to(tl.float32)[None, :]
    t += f3 * tl.load(b + 3, mask=ok, other=0.0).to(tl.float32)[None, :]
    t += f4 * tl.load(b + 4, mask=ok, other=0.0).to(tl.float32)[None, :]
    t += f5 * tl.load(b + 5, mask=ok, other=0.0).to(tl.float32)[None, :]
    t += f6 * tl.load(b + 6, mask=ok, other=0.0).to(tl.float32)[None, :]
    t += f7 * tl.load(b + 7, mask=ok, other=0.0).to(tl.float32)[None, :]
    return acc + t * s


@triton.jit
def fp4_gemv_kernel(X, P, S, BIAS, Y, PART, LOCK, M, N, K, KW, KS, stride_xm, stride_ym, SPLIT_K, gmul,
                    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GS: tl.constexpr,
                    MX: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr):
    """Grid ``(N tiles, SPLIT_K, M / ROWS)``: each word's eight codes decoded once (float16 bits, then float32)
    for up to 4 rows; per row and word the eight exact products are summed, then scaled (one FFMA per word)."""
    BKW: tl.constexpr = BLOCK_K // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = offs_n % N
    offs_w = tl.max_contiguous(tl.multiple_of(tl.arange(0, BKW), BKW), BKW)
    kb0, kb1 = k_range(K, BLOCK_K, SPLIT_K, pid_k)
    p_ptr = P + rn[:, None].to(tl.int64) * KW + offs_w[None, :]
    m0 = pid_m * ROWS
    a0 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    a1 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    a2 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    a3 = tl.zeros((BLOCK_N, BKW), dtype=tl.float32)
    for kb in range(kb0, kb1):
        w0 = kb * BKW
        u = load_words(p_ptr, w0, KW, BKW, EVEN_K)
        s = word_scales(S, rn, w0, KS, BKW, GS, MX)
        t0, t4 = e2m1_pair(u, 0)
        t1, t5 = e2m1_pair(u, 1)
        t2, t6 = e2m1_pair(u, 2)
        t3, t7 = e2m1_pair(u, 3)
        f0, f1, f2, f3 = t0.to(tl.float32), t1.to(tl.float32), t2.to(tl.float32), t3.to(tl.float32)
        f4, f5, f6, f7 = t4.to(tl.float32), t5.to(tl.float32), t6.to(tl.float32), t7.to(tl.float32)
        kw = w0 + offs_w
        a0 = row_step(a0, f0, f1, f2, f3, f4, f5, f6, f7, s, X + m0 * stride_xm, kw, KW)
        if ROWS > 1:
            xr = X + tl.minimum(m0 + 1, M - 1) * stride_xm
            a1 = row_step(a1, f0, f1, f2, f3, f4, f5, f6, f7, s, xr, kw, KW)
        if ROWS > 2:
            xr = X + tl.minimum(m0 + 2, M - 1) * stride_xm
            a2 = row_step(a2, f0, f1, f2, f3, f4, f5, f6, f7, s, xr, kw, KW)
            xr = X + tl.minimum(m0 + 3, M - 1) * stride_xm
            a3 = row_step(a3, f0, f1, f2, f3, f4, f5, f6, f7, s, xr, kw, KW)
    acc = rows_out(a0, a1, a2, a3, ROWS)
    store_split(Y, BIAS, PART, LOCK, acc * gmul, m0 + tl.arange(0, ROWS), offs_n, M, N, stride_ym,
                pid_m * tl.num_programs(0) + pid_n, pid_k, SPLIT_K, HAS_BIAS, SPLIT, ROWS, BLOCK_N, ROWS)


@triton.jit
def fp4_dot_kernel(X, P, S, BIAS, Y, PART, LOCK, M, N, K, KW, KS, stride_xm, stride_ym, SPLIT_K, gmul,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   SWAP: tl.constexpr, GS: tl.constexpr, MX: tl.constexpr, HAS_BIAS: tl.constexpr,
                   SPLIT: tl.constexpr, EVEN_K: tl.constexpr):
    """``skinny`` (``SWAP``: the weight tile is the MMA's A, ``acc [BN, BM]``) and ``mma``; the weight tile is
    built in x's dtype by ``fp4_tile``."""
    BKW: tl.constexpr = BLOCK_K // 8
    DT: tl.constexpr = X.dtype.element_ty
    pid_m, pid_n, grid_n, offs_m, offs_n, rm, rn = tile_of(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_k = tl.arange(0, BLOCK_K)
    kb0, kb1 = k_range(K, BLOCK_K, SPLIT_K, pid_k)
    x_ptr = X + rm[:, None] * stride_xm + offs_k[None, :]
    p_ptr = P + rn[:, None].to(tl.int64) * KW + tl.arange(0, BKW)[None, :]
    if SWAP:  # noqa: SIM108 (constexpr branch)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK_K
        if EVEN_K:  # noqa: SIM108 (constexpr branch)
            x = tl.load(x_ptr + k0)
        else:
            x = tl.load(x_ptr + k0, mask=(k0 + offs_k < K)[None, :], other=0.0)
        u = load_words(p_ptr, kb * BKW, KW, BKW, EVEN_K)
        w = fp4_tile(u, word_scales(S, rn, kb * BKW, KS, BKW, GS, MX), DT)
        if SWAP:  # noqa: SIM108 (constexpr branch)
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    out = tl.trans(acc) if SWAP else acc
    store_split(Y, BIAS, PART, LOCK, out * gmul, offs_m, offs_n, M, N, stride_ym, pid_m * grid_n + pid_n, pid_k,
                SPLIT_K, HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N, BLOCK_M)


@triton.jit
def fp4_dense_kernel(P, S, OUT, N, K, KW, KS, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GS: tl.constexpr,
                     MX: tl.constexpr):
    """``OUT [N, K]`` = the decoded weights (without ``global_mul``) in OUT's dtype."""
    BKW: tl.constexpr = BLOCK_K // 8
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    w0 = tl.program_id(1) * BKW
    rn = offs_n % N
    p_ptr = P + rn[:, None].to(tl.int64) * KW + tl.arange(0, BKW)[None, :]
    u = load_words(p_ptr, w0, KW, BKW, False)
    w = fp4_tile(u, word_scales(S, rn, w0, KS, BKW, GS, MX), OUT.dtype.element_ty)
    kk = 8 * w0 + tl.arange(0, BLOCK_K)
    mask = (offs_n < N)[:, None] & (kk < K)[None, :]
    tl.store(OUT + rn[:, None].to(tl.int64) * K + kk[None, :], w, mask=mask)


def choose_fp4_variant(m: int, n: int, k: int) -> str:
    """The variant for an ``[M, K]`` call. Crossovers from the H200 sweep at 4096x14336 (NVFP4,
    benchmarks/results/h200-gpu_float_sweep-2026-12-04.md): gemv only at M=1 (M=4: 74.5 us against skinny's
    29.1), mma from 33 (M=64: 46.2 against 57.4), dense above 512 (M=1024: 222.5 against mma's 333.8)."""
    del n, k
    if m == 1:
        return "gemv"
    if m <= 32:
        return "skinny"
    return "mma" if m <= 512 else "dense"


def fp4_config(variant: str, m: int, n: int, k: int, sms: int = 132) -> FConfig:
    """Tiles by M bucket (``block_k`` counts weights: half as many bytes; a multiple of the scale block)."""
    if variant == "gemv":  # one row: 32 rows x 256 bytes a step; more rows share the 8 decoded tiles, smaller
        rows = 1 if m == 1 else (2 if m == 2 else 4)
        bn, bk = {1: (32, 512), 2: (16, 256), 4: (16, 128)}[rows]
        return FConfig("gemv", rows, bn, bk, split_for(-(-n // bn) * -(-m // rows), k, bk, sms, 8), 4, 3)
    if variant == "skinny":  # sweep: split 4 (29.1 us at M=4)
        bm = 16 if m <= 16 else 32
        return FConfig("skinny", bm, 64, 128, split_for(-(-n // 64) * -(-m // bm), k, 128, sms, 6), 4, 3)
    if variant == "mma":
        if m <= 128:
            return FConfig("mma", 64, 128, 64, split_for(-(-n // 128) * -(-m // 64), k, 64, sms, 2, 4), 4, 3)
        return FConfig("mma", 256, 128, 64, 1, 8, 3)  # sweep M=256: 88.7 us against 128x128's 97.8
    if variant == "dense":
        return FConfig("dense", 1, 32, 256, 1, 4, 1)
    raise ValueError(f"fp4_linear: variant: expected one of {', '.join(VARIANTS)}, found {variant!r}")


def mxfp4_scale_errors(scales: torch.Tensor) -> list[str]:
    """Host-side data check a caller runs once (it synchronises): E8M0 code 255 is NaN."""
    bad = int((scales == 255).sum())
    return [f"mxfp4 scales: {bad} of {scales.numel()} are 255 (E8M0 NaN)"] if bad else []


def check_fp4(op: str, x: torch.Tensor, packed: object, scales: object, kind: object,
              global_mul: object) -> tuple[int, int, bool]:
    """Validate the weight tensors against x; returns ``(N, scale block, is_mx)``."""
    if kind not in KINDS:
        raise fail(op, "kind", "'nvfp4' or 'mxfp4'", repr(kind))
    if isinstance(global_mul, bool) or not isinstance(global_mul, (int, float)):
        raise fail(op, "global_mul", "a python float", type(global_mul).__name__)
    gs, sdt = KINDS[kind]  # type: ignore[index]
    k = x.shape[1]
    if k % gs:
        raise fail(op, "x", f"K a multiple of {gs} ({kind} scale blocks)", f"K = {k}")
    check_tensor(op, "packed", packed, (torch.uint8,), device=x.device)
    assert isinstance(packed, torch.Tensor)
    if packed.dim() != 2 or packed.shape[1] != k // 2:
        raise fail(op, "packed", f"shape [N, {k // 2}] (K/2 from x)", list(packed.shape))
    if packed.storage_offset() % 4:
        raise fail(op, "packed", "a tensor starting on a 4-byte boundary (read as int32 words)",
                   f"storage offset {packed.storage_offset()}")
    n = packed.shape[0]
    check_tensor(op, "scales", scales, (sdt,), (n, k // gs), x.device)
    return n, gs, kind == "mxfp4"


def fp4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, kind: str, global_mul: float,
               bias: torch.Tensor | None = None, variant: str | None = None, config: FConfig | None = None,
               lock: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K] @ W^T * global_mul (+ bias)`` -> ``[M, N]`` in x's dtype (module docstring)."""
    op = "fp4_linear"
    x = check_x(op, x)
    n, gs, mx = check_fp4(op, x, packed, scales, kind, global_mul)
    check_bias(op, bias, n, x.device)
    m, k = x.shape
    if config is None:
        v = variant or choose_fp4_variant(m, n, k)
        if v not in VARIANTS:
            raise fail(op, "variant", "one of " + ", ".join(VARIANTS), repr(v))
        config = fp4_config(v, m, n, k, sm_count(x.device))
    elif config.variant not in VARIANTS:
        raise fail(op, "config.variant", "one of " + ", ".join(VARIANTS), repr(config.variant))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_() if bias is None else y.copy_(bias.expand(m, n))
    bk = max(gs, 1 << (max(1, config.block_k).bit_length() - 1))  # a power of two, whole scale blocks
    words, kw, ks = packed.view(torch.int32), k // 8, scales.shape[1]
    scales = scales.view(torch.uint8)
    gmul = float(global_mul)
    if config.variant == "dense":
        chunk = max(64, MAX_DENSE // k // 64 * 64)
        b = bias.to(x.dtype) if bias is not None else None
        for n0 in range(0, n, chunk):
            n1 = min(n, n0 + chunk)
            wd = torch.empty((n1 - n0, k), dtype=x.dtype, device=x.device)
            grid = (triton.cdiv(n1 - n0, config.block_n), triton.cdiv(k, bk))
            fp4_dense_kernel[grid](words[n0:n1], scales[n0:n1], wd, n1 - n0, k, kw, ks, BLOCK_N=config.block_n,
                                   BLOCK_K=bk, GS=gs, MX=mx, num_warps=config.num_warps)
            if x.dtype == torch.float16:  # code * scale (<= 2688) summed over K overflows float16 before * gmul
                wd.mul_(gmul)
                yc = x @ wd.t()
            else:
                yc = (x @ wd.t()).mul_(gmul)
            del wd
            y[:, n0:n1] = yc + b[n0:n1] if b is not None else yc
        return y
    common = dict(GS=gs, MX=mx, HAS_BIAS=bias is not None, EVEN_K=k % bk == 0, num_warps=config.num_warps,
                  num_stages=config.num_stages)
    split = max(1, min(config.split_k, triton.cdiv(k, bk)))
    if config.variant == "gemv":
        rows = config.block_m if config.block_m in (1, 2, 4) else 4
        grid = (triton.cdiv(n, config.block_n), split, triton.cdiv(m, rows))
        part, lck = split_buffers(m, n, grid[0] * grid[2], split, x.device, lock)
        fp4_gemv_kernel[grid](x, words, scales, bias if bias is not None else y, y, part if part is not None else y,
                              lck if lck is not None else y, m, n, k, kw, ks, x.stride(0), y.stride(0), split, gmul,
                              ROWS=rows, BLOCK_N=config.block_n, BLOCK_K=bk, SPLIT=split > 1, **common)
        return y
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    part, lck = split_buffers(m, n, tiles, split, x.device, lock)
    fp4_dot_kernel[(tiles, split)](x, words, scales, bias if bias is not None else y, y,
                                   part if part is not None else y, lck if lck is not None else y, m, n, k, kw, ks,
                                   x.stride(0), y.stride(0), split, gmul, BLOCK_M=config.block_m,
                                   BLOCK_N=config.block_n, BLOCK_K=bk, GROUP_M=config.group_m,
                                   SWAP=config.variant == "skinny", SPLIT=split > 1, **common)
    return y
