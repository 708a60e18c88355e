"""The 128-point Walsh-Hadamard transforms around EXL3's product, as in-register butterflies.

EXL3 rotates the input (``H(x * suh)``, rounded to float16 as exllamav3 does) and the output (``H(y) * svh + bias``)
in 128-column blocks. A ``tl.dot`` against the 128x128 matrix in float32 ("ieee") kept that matrix in registers and
spilled: 36-48 us for the input and 87-124 us for the output of one token on an H100
(``benchmarks/results/h100-gpu-exl3-parts-2026-12-05.md``), more than the product itself. The butterfly does 7
add/subtract stages of 128 values per row instead (7 x 128 float32 operations against 128 x 128 FMAs) and needs no
matrix. It sums in a different order than ``x @ H``: results agree with ``layouts.exl3.had_last`` to float32
rounding (a few ulps), which is below the float16 rounding the input then takes.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

#: The orthonormal scale ``1/sqrt(128)``, applied once after the unnormalised butterfly.
SCALE = 1.0 / math.sqrt(128.0)
#: Rows per program: at most this many (a power of two); fewer when M is smaller, so a token wastes no lanes.
MAX_ROWS = 16


@triton.jit
def _stage(x, BM: tl.constexpr, H: tl.constexpr):
    """One butterfly stage: index ``i`` (bit ``log2 H`` clear) and ``i + H`` become their sum and difference."""
    y = tl.permute(tl.reshape(x, (BM, 64 // H, 2, H)), (0, 1, 3, 2))
    lo, hi = tl.split(y)
    return tl.reshape(tl.permute(tl.join(lo + hi, lo - hi), (0, 1, 3, 2)), (BM, 128))


@triton.jit
def _fwht128(x, BM: tl.constexpr):
    """``x [BM, 128] @ H128``, Sylvester order, unnormalised."""
    x = _stage(x, BM, 1)
    x = _stage(x, BM, 2)
    x = _stage(x, BM, 4)
    x = _stage(x, BM, 8)
    x = _stage(x, BM, 16)
    x = _stage(x, BM, 32)
    return _stage(x, BM, 64)


@triton.jit
def had_in_kernel(x_ptr, s_ptr, o_ptr, M, K, stride_xm, scale, BM: tl.constexpr):
    """``o[M, K] = float16(H(x * s))``, float32 arithmetic; one 128-column block of ``BM`` rows per program."""
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * 128 + tl.arange(0, 128)
    rows = m[:, None] < M
    x = tl.load(x_ptr + m[:, None] * stride_xm + cols[None, :], mask=rows, other=0.0).to(tl.float32)
    o = _fwht128(x * tl.load(s_ptr + cols)[None, :], BM) * scale
    tl.store(o_ptr + m[:, None] * K + cols[None, :], o.to(tl.float16), mask=rows)


@triton.jit
def had_out_kernel(y_ptr, s_ptr, b_ptr, o_ptr, M, N, scale, HAS_BIAS: tl.constexpr, BM: tl.constexpr):
    """``o[M, N] = H(y) * s (+ b)`` in float32, stored in ``o``'s dtype; one 128-column block of ``BM`` rows."""
    m = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * 128 + tl.arange(0, 128)
    rows = m[:, None] < M
    y = tl.load(y_ptr + m[:, None] * N + cols[None, :], mask=rows, other=0.0).to(tl.float32)
    o = _fwht128(y, BM) * scale * tl.load(s_ptr + cols)[None, :]
    if HAS_BIAS:
        o = o + tl.load(b_ptr + cols).to(tl.float32)[None, :]
    tl.store(o_ptr + m[:, None] * N + cols[None, :], o.to(o_ptr.dtype.element_ty), mask=rows)


def rows_per_program(m: int) -> int:
    """The smallest power of two holding ``m`` rows, at most ``MAX_ROWS``."""
    return min(MAX_ROWS, 1 << max(0, m - 1).bit_length())


def _warps(bm: int) -> int:
    return 1 if bm <= 2 else 4


def _check(t: torch.Tensor, name: str, cols: int) -> None:
    if t.dim() != 2 or t.shape[1] != cols or cols % 128:
        raise ValueError(f"{name}: expected [M, {cols}] with {cols} a multiple of 128, found {list(t.shape)}")


def input_transform(x: torch.Tensor, su: torch.Tensor, rows: int | None = None, warps: int | None = None
                    ) -> torch.Tensor:
    """float16 ``H(x * su)`` of ``x [M, K]`` (unit column stride) with float32 ``su [K]``. ``rows`` / ``warps``
    override the launch (benchmarks)."""
    m, k = x.shape
    _check(x, "x", su.numel())
    if x.stride(1) != 1:
        raise ValueError(f"x: expected unit column stride, found strides {x.stride()}")
    out = torch.empty(m, k, dtype=torch.float16, device=x.device)
    bm = rows or rows_per_program(m)
    had_in_kernel[(triton.cdiv(m, bm), k // 128)](x, su, out, m, k, x.stride(0), SCALE, BM=bm,
                                                  num_warps=warps or _warps(bm))
    return out


def output_transform(y: torch.Tensor, sv: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype,
                     rows: int | None = None, warps: int | None = None) -> torch.Tensor:
    """``H(y) * sv + bias`` of ``y [M, N]`` (contiguous, any float dtype; float32 arithmetic), as ``dtype``."""
    m, n = y.shape
    _check(y, "y", sv.numel())
    if not y.is_contiguous():
        raise ValueError(f"y: expected a contiguous tensor, found strides {y.stride()}")
    out = torch.empty(m, n, dtype=dtype, device=y.device)
    bm = rows or rows_per_program(m)
    had_out_kernel[(triton.cdiv(m, bm), n // 128)](y, sv, sv if bias is None else bias, out, m, n, SCALE,
                                                   HAS_BIAS=bias is not None, BM=bm, num_warps=warps or _warps(bm))
    return out
