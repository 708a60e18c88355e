"""W8A8 FP8: e4m3 weights ``[N, K]`` times e4m3 activations quantized per token at run time (llm-compressor's
``FP8_DYNAMIC`` / vLLM's dynamic per-token scheme).

``quantize_fp8_per_token(x)``: ``sx[m] = max(max_k |x[m, k]| / 448, 1 / (448 * 512))`` (vLLM's floor, so an
all-zero row gets a finite scale and quantizes to zeros), ``xq = e4m3(clamp(x / sx, -448, 448))`` rounded to
nearest even (IEEE division, as torch's ``x / s``). One program per row; rows up to ``ONE_PASS_K`` are held in
registers (one read), longer ones are read twice.

``fp8_w8a8_linear(x, w, w_scale, block, bias)``: ``y = (sum_k xq * w) * sx[m] * w_scale[n // bn, k // bk]``
(+ bias), in x's dtype. Per-tensor / per-channel weight scales (``bk >= K``) scale the float32 accumulator once;
``(128, 128)`` blocks scale each 128-wide K step's partial product and add it (``fp_common.STEP``). The product
is fp8 x fp8 ``tl.dot`` (wgmma on sm_90, float32 accumulation; the interpreter multiplies the decoded values).

Variants (``choose_w8a8_variant``): ``skinny`` (M <= 64: swap-AB, the weight tile is the MMA's 64-row side and
the few activation rows its N, split-K over CTAs) and ``mma`` (tiles ``x [BM, BK] @ w^T``, L2 swizzle).
``w8a8_config`` (documented there) picks tiles by M bucket; ``tma=True`` in a config loads both operands with
host-built TMA descriptors (K % 16 == 0).

Under the interpreter float32 -> e4m3 conversion rounds wrongly where the mantissa carries into the exponent,
so the quantizer there builds the byte with integer arithmetic (``MANUAL``, same RNE); on the GPU it is
``cvt.rn.satfinite.e4m3x2.f32``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fp8mm import launch_dot
from .fp_common import (
    FConfig,
    check_bias,
    check_fp8_weight,
    check_tensor,
    fail,
    sm_count,
    split_for,
)
from .runtime import interpreting

E4M3_MAX = 448.0
#: vLLM's smallest dynamic scale (``1 / (448 * 512)``)
MIN_SCALE = 1.0 / (448.0 * 512.0)
#: rows up to this length are quantized from registers in one read
ONE_PASS_K = 8192
VARIANTS = ("skinny", "mma")


@triton.jit
def e4m3_rne_bits(v):
    """``v`` (float32, already within [-448, 448]) -> its e4m3 byte, round to nearest even, by integer
    arithmetic: normal values round the float32 mantissa to 3 bits (a carry moves into the exponent),
    subnormals (|v| < 2^-6) are ``rne(|v| * 2^9)`` codes 0..8 (8 is 2^-6, the first normal)."""
    bits = v.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    r = (a + 0x7FFFF + ((a >> 20) & 1)) & 0x7FF00000
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    sub = ((a.to(tl.float32, bitcast=True) * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
    code = tl.where(a < 0x3C800000, sub, normal)  # 0x3C800000 = 2^-6
    return (code | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def quant_store(XQ, off, mask, v, s, MANUAL: tl.constexpr):
    q = tl.minimum(tl.maximum(tl.math.div_rn(v, s), -448.0), 448.0)
    if MANUAL:
        tl.store(XQ + off, e4m3_rne_bits(q), mask=mask)
    else:
        tl.store(XQ + off, q.to(XQ.dtype.element_ty), mask=mask)


@triton.jit
def quant_row_kernel(X, XQ, SX, K, stride_xm, stride_qm, BLOCK: tl.constexpr, ONE_PASS: tl.constexpr,
                     MANUAL: tl.constexpr):
    """Row ``program_id(0)``: its scale, then its e4m3 codes."""
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    row = X + m.to(tl.int64) * stride_xm
    qrow = XQ + m.to(tl.int64) * stride_qm
    if ONE_PASS:
        v = tl.load(row + offs, mask=offs < K, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(v), axis=0)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            amax = tl.maximum(amax, tl.abs(tl.load(row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)))
        amax = tl.max(amax, axis=0)
    s = tl.maximum(tl.math.div_rn(amax, 448.0), 1.0 / (448.0 * 512.0))
    tl.store(SX + m, s)
    if ONE_PASS:
        quant_store(qrow, offs, offs < K, v, s, MANUAL)
    else:
        for k0 in range(0, K, BLOCK):
            v = tl.load(row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)
            quant_store(qrow, k0 + offs, k0 + offs < K, v, s, MANUAL)


def quantize_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (float16/bfloat16/float32) -> ``(xq float8_e4m3fn [M, K], sx float32 [M])``."""
    op = "quantize_fp8_per_token"
    check_tensor(op, "x", x, (torch.float16, torch.bfloat16, torch.float32))
    if x.dim() != 2:
        raise fail(op, "x", "a 2-D [M, K] tensor", f"{x.dim()}-D shape {list(x.shape)}")
    if x.device.type != "cuda" and not interpreting():
        raise fail(op, "x", "a CUDA tensor (TRITON_INTERPRET=1 runs the kernels on CPU tensors, for tests)",
                   x.device)
    m, k = x.shape
    xq = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    sx = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return xq, sx
    if k == 0:
        return xq, sx.fill_(MIN_SCALE)
    one = k <= ONE_PASS_K
    block = triton.next_power_of_2(k) if one else 4096
    manual = interpreting()  # the interpreter's float32 -> e4m3 cast rounds wrongly when the mantissa carries
    quant_row_kernel[(m,)](x, xq.view(torch.uint8) if manual else xq, sx, k, x.stride(0), xq.stride(0),
                           BLOCK=block, ONE_PASS=one, MANUAL=manual, num_warps=8 if block >= 4096 else 4)
    return xq, sx


def choose_w8a8_variant(m: int, n: int, k: int) -> str:
    """``skinny`` up to M = 64, ``mma`` above (heuristic; benchmarks/gpu_float.py --sweep measures it)."""
    del n, k
    return "skinny" if m <= 64 else "mma"


def w8a8_config(variant: str, m: int, n: int, k: int, sms: int = 132, bk: int | None = None) -> FConfig:
    """Tiles by M bucket (fp8 operands: 1 byte, so K steps of 128-256 bytes match 16-bit kernels' 64-128):

    * ``skinny`` M <= 16 / 32 / 64: ``block_m`` 16 / 32 / 64 activation rows (wgmma's N), 64 weight rows a CTA
      (one warpgroup's M), K steps of 256, 4 stages (24-40 KiB a stage), split-K to about 3 CTAs per SM.
    * ``mma`` M <= 128: 64x128x128, 4 warps, 4 stages, split-K where tiles are few, TMA loads; above:
      128x256x128, 8 warps, 3 stages (48 KiB a stage), ``group_m`` 8; with scale blocks narrower than K
      (``bk < K``: a second accumulator per step) 128x128x128 (128x256 spills there).

    H200 sweep (benchmarks/results/h200-gpu_float_sweep-w8a8-2026-12-04.md): at M = 64 no split (skinny 64x64x256
    22.3 us on 4096x14336 against 34.3 split 2 ways); 128x256x128 from M = 129 where its tiles fill the GPU
    (M = 256: 30.3 / 107.0 us on 4096x14336 / 8192x28672 against 128x128's 35.2 / 122.6), but not on N = 4096
    at M = 256 (32 tiles: 24.2 / 71.8 us, 1.68x / 1.84x _scaled_mm, where 128x128 measured 15.5 / 44.6).
    """
    if variant == "skinny":
        bm = 16 if m <= 16 else (32 if m <= 32 else 64)
        tiles = -(-n // 64) * -(-m // bm)
        return FConfig("skinny", bm, 64, 256, 1 if bm == 64 else split_for(tiles, k, 256, sms, 3), 4, 4)
    if variant == "mma":
        if m <= 128:
            tiles = -(-n // 128) * -(-m // 64)
            return FConfig("mma", 64, 128, 128, split_for(tiles, k, 128, sms, 1, 4), 4, 4, tma=k % 16 == 0)
        wide = -(-n // 256) * -(-m // 128)
        if (bk is None or bk >= k) and wide >= 0.8 * sms:
            return FConfig("mma", 128, 256, 128, 1, 8, 3)
        if -(-n // 128) * -(-m // 128) >= 0.45 * sms:  # N = 4096, M = 256: 128x256 left 100 SMs idle (1.68x)
            return FConfig("mma", 128, 128, 128, 1, 8, 4)
        tiles = -(-n // 128) * -(-m // 64)
        return FConfig("mma", 64, 128, 128, split_for(tiles, k, 128, sms, 1, 4), 4, 4, tma=k % 16 == 0)
    raise ValueError(f"fp8_w8a8_linear: variant: expected one of {', '.join(VARIANTS)}, found {variant!r}")


def fp8_w8a8_mm(xq: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: tuple[int, int],
                bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16, variant: str | None = None,
                config: FConfig | None = None, lock: torch.Tensor | None = None) -> torch.Tensor:
    """The product of already-quantized activations ``xq [M, K]`` e4m3 (row scales ``sx [M]`` float32) and
    ``w [N, K]`` e4m3 with block scales, -> ``[M, N]`` in ``out_dtype``."""
    op = "fp8_w8a8_linear"
    check_tensor(op, "xq", xq, (torch.float8_e4m3fn,))
    if xq.dim() != 2:
        raise fail(op, "xq", "a 2-D [M, K] tensor", f"{xq.dim()}-D shape {list(xq.shape)}")
    if xq.device.type != "cuda" and not interpreting():
        raise fail(op, "xq", "a CUDA tensor (TRITON_INTERPRET=1 runs the kernels on CPU tensors)", xq.device)
    if xq.device.type == "cuda" and torch.cuda.get_device_capability(xq.device) < (8, 9):
        cap = torch.cuda.get_device_capability(xq.device)
        raise fail(op, "xq", "a GPU with FP8 tensor cores (sm_89 or later)", f"sm_{cap[0]}{cap[1]}")
    m, k = xq.shape
    check_tensor(op, "sx", sx, (torch.float32,), (m,), xq.device)
    n, bn, bk = check_fp8_weight(op, w, w_scale, block, k, xq.device, (torch.float8_e4m3fn,), "w_scale")
    check_bias(op, bias, n, xq.device)
    if out_dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise fail(op, "out_dtype", "float16, bfloat16 or float32", out_dtype)
    if config is None:
        v = variant or choose_w8a8_variant(m, n, k)
        config = w8a8_config(v, m, n, k, sm_count(xq.device), bk)
    elif config.variant not in VARIANTS:
        raise fail(op, "config.variant", "one of " + ", ".join(VARIANTS), repr(config.variant))
    y = torch.empty((m, n), dtype=out_dtype, device=xq.device)
    if m == 0 or n == 0:
        return y
    if k == 0:
        return y.zero_() if bias is None else y.copy_(bias.expand(m, n))
    return launch_dot(xq, w, w_scale, bn, bk, bias, config, y, sx=sx, lock=lock)


def fp8_w8a8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, block: tuple[int, int],
                    bias: torch.Tensor | None = None, variant: str | None = None, config: FConfig | None = None,
                    lock: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K]`` float16/bfloat16 -> per-token e4m3 -> ``fp8_w8a8_mm`` -> ``[M, N]`` in x's dtype."""
    op = "fp8_w8a8_linear"
    check_tensor(op, "x", x, (torch.float16, torch.bfloat16))
    xq, sx = quantize_fp8_per_token(x)
    return fp8_w8a8_mm(xq, sx, w, w_scale, block, bias, x.dtype, variant, config, lock)
