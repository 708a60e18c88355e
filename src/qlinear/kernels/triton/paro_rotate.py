"""ParoQuant's input transform in one launch: channel scales, then ``krot`` rounds of Givens rotations.

One program per (block of rows, group) keeps the group's values in registers from the first load to the last
store. It loads the group's columns in order (one contiguous run per row), scales them, and for every round
gathers that round's ``x_i`` / ``x_j`` halves from the previous values (``tl.gather`` along the row, through the
group-local maps of ``layouts/paroquant.group_maps``), computes ``x_i' = x_i*c + x_j*s``, ``x_j' = -x_i*s +
x_j*c`` with each product and sum rounded to the input dtype (float32 arithmetic, exact products, one
round-to-nearest-even per operation: the torch reference's roundings, so the result is bit-identical to
``paroquant.rotate``), and interleaves the two halves as the next round's source. A last gather restores column
order for one contiguous store. (Before 2026-12-05 the rounds went through the output buffer in global memory,
2-byte scattered loads and stores each round: 154 us for 256 rows of 4096 on an H100, 542 us for 14336.)
``cos``/``sin`` are precomputed in torch. Launched with ``enable_fp_fusion=False``: with fusion on, Triton folds
the float32 round trips into float16 arithmetic and contracts ``x_i*c + x_j*s`` into one ``fma.rn.f16`` (one
rounding instead of the reference's three); without it the PTX has only ``mul.rn``/``add.rn``/``sub.rn`` in the
input dtype, which equal the reference's float32-then-round operations (tests/test_triton_paro_interpret.py
compiles it for sm_90 and checks). Under the interpreter float32 -> bfloat16 casts truncate, so bfloat16 rounding
is done in integer arithmetic there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...layouts.paroquant import pair_block
from .common import to_dtype

#: compile options the bit-exactness depends on (module docstring)
COMPILE_OPTIONS = {"enable_fp_fusion": False}
#: values of one half held per program (rows x pairs): up to 16 rows of a 128-group (no more than M), fewer rows of
#: wider groups; one warp for a tile of at most 128 pairs (a token's row), four above
TILE = 1024


@triton.jit
def _rotate_kernel(X, OUT, GMAP, COS, SIN, SCALES, M, K, stride_xm, stride_om, KROT: tl.constexpr,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr, BF16_BITS: tl.constexpr):
    pid_m, g = tl.program_id(0), tl.program_id(1)
    BG: tl.constexpr = 2 * BLOCK_H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    lane = tl.arange(0, BG)
    cols = g * (2 * HALF) + lane
    mask = (rows[:, None] < M) & (lane < 2 * HALF)[None, :]
    dt: tl.constexpr = OUT.dtype.element_ty
    x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sc = tl.load(SCALES + cols, mask=lane < 2 * HALF, other=1.0).to(tl.float32)
    x = to_dtype(x * sc[None, :], dt, BF16_BITS).to(tl.float32)
    p = tl.arange(0, BLOCK_H)
    pm = p < HALF
    groups = K // (2 * HALF)
    for r in tl.static_range(KROT):
        maps = GMAP + (r * groups + g) * BG
        xi = tl.gather(x, tl.broadcast_to(tl.load(maps + p)[None, :], (BLOCK_M, BLOCK_H)), 1)
        xj = tl.gather(x, tl.broadcast_to(tl.load(maps + BLOCK_H + p)[None, :], (BLOCK_M, BLOCK_H)), 1)
        c = tl.load(COS + r * (K // 2) + g * HALF + p, mask=pm, other=1.0).to(tl.float32)[None, :]
        s = tl.load(SIN + r * (K // 2) + g * HALF + p, mask=pm, other=0.0).to(tl.float32)[None, :]
        a = to_dtype(xi * c, dt, BF16_BITS).to(tl.float32)
        b = to_dtype(xj * s, dt, BF16_BITS).to(tl.float32)
        yi = to_dtype(a + b, dt, BF16_BITS).to(tl.float32)
        a = to_dtype(-xi * s, dt, BF16_BITS).to(tl.float32)
        b = to_dtype(xj * c, dt, BF16_BITS).to(tl.float32)
        yj = to_dtype(a + b, dt, BF16_BITS).to(tl.float32)
        x = tl.reshape(tl.join(yi, yj), (BLOCK_M, BG))  # x_i' of pair q at 2q, x_j' at 2q + 1
    last = tl.load(GMAP + (KROT * groups + g) * BG + lane)
    y = tl.gather(x, tl.broadcast_to(last[None, :], (BLOCK_M, BG)), 1)
    tl.store(OUT + rows[:, None].to(tl.int64) * stride_om + cols[None, :], y.to(dt), mask=mask)


def rotate(x2: torch.Tensor, maps: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scales: torch.Tensor,
           group_size: int, interpreting: bool = False) -> torch.Tensor:
    """``x2 [M, K]`` (float16/bfloat16, unit stride along K) transformed; ``maps [krot + 1, K/gs, 2 P]`` the
    group-local gather maps (``layouts/paroquant.group_maps``), ``cos``/``sin [krot, K/2]`` and ``scales [K]`` in
    ``x2``'s dtype (``kernels/paro_base.py`` builds them)."""
    m, k = x2.shape
    krot = maps.shape[0] - 1
    out = torch.empty_like(x2)
    if m == 0:
        return out
    half = group_size // 2
    block_h = pair_block(group_size)
    block_m = max(1, min(16, TILE // block_h, triton.next_power_of_2(m)))
    grid = (triton.cdiv(m, block_m), k // group_size)
    _rotate_kernel[grid](x2, out, maps, cos, sin, scales, m, k, x2.stride(0), out.stride(0), KROT=krot, HALF=half,
                         BLOCK_H=block_h, BLOCK_M=block_m,
                         BF16_BITS=interpreting and x2.dtype == torch.bfloat16,
                         num_warps=1 if block_m * block_h <= 128 else 4, **COMPILE_OPTIONS)
    return out
