"""ParoQuant's input transform in one launch: channel scales, then ``krot`` rounds of Givens rotations.

One program per (block of rows, group). It loads the group's ``x_i`` and ``x_j`` halves of round 0 through the
round's column map (``perm[r] = [i-columns | j-columns]``, ``layouts/paroquant.py``), scales them, and for every
round computes ``x_i' = x_i*c + x_j*s``, ``x_j' = -x_i*s + x_j*c`` with each product and sum rounded to the input
dtype (float32 arithmetic, exact products, one round-to-nearest-even per operation: the torch reference's
roundings, so the result is bit-identical to ``paroquant.rotate``). Between rounds the values go through the output
buffer in column order (stored through ``perm[r]``, read back through ``perm[r + 1]``; a barrier on each side), so
no inverse map is needed; the last round's store is the result. ``cos``/``sin`` are precomputed in torch.
Launched with ``enable_fp_fusion=False``: with fusion on, Triton folds the float32 round trips into float16
arithmetic and contracts ``x_i*c + x_j*s`` into one ``fma.rn.f16`` (one rounding instead of the reference's three);
without it the PTX has only ``mul.rn``/``add.rn``/``sub.rn`` in the input dtype, which equal the reference's
float32-then-round operations (tests/test_triton_paro_interpret.py compiles it for sm_90 and checks).
Under the interpreter float32 -> bfloat16 casts truncate, so bfloat16 rounding is done in integer arithmetic there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import to_dtype

#: compile options the bit-exactness depends on (module docstring)
COMPILE_OPTIONS = {"enable_fp_fusion": False}
#: values of one half held per program (rows x pairs): 16 rows of a 128-group, fewer rows of wider groups
TILE = 1024


@triton.jit
def _rotate_kernel(X, OUT, PERM, COS, SIN, SCALES, M, K, stride_xm, stride_om, KROT: tl.constexpr,
                   HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr, BF16_BITS: tl.constexpr):
    pid_m, g = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    p = tl.arange(0, BLOCK_H)
    pm = p < HALF
    mask = (rows[:, None] < M) & pm[None, :]
    pos_i = g * HALF + p  # this group's pairs in the [i-half | j-half] order of every round
    pos_j = K // 2 + pos_i
    dt: tl.constexpr = OUT.dtype.element_ty
    col_i = tl.load(PERM + pos_i, mask=pm, other=0)
    col_j = tl.load(PERM + pos_j, mask=pm, other=0)
    xrow = X + rows[:, None].to(tl.int64) * stride_xm
    xi = tl.load(xrow + col_i[None, :], mask=mask, other=0.0).to(tl.float32)
    xj = tl.load(xrow + col_j[None, :], mask=mask, other=0.0).to(tl.float32)
    si = tl.load(SCALES + col_i, mask=pm, other=1.0).to(tl.float32)
    sj = tl.load(SCALES + col_j, mask=pm, other=1.0).to(tl.float32)
    xi = to_dtype(xi * si[None, :], dt, BF16_BITS).to(tl.float32)
    xj = to_dtype(xj * sj[None, :], dt, BF16_BITS).to(tl.float32)
    orow = OUT + rows[:, None].to(tl.int64) * stride_om
    for r in tl.static_range(KROT):
        if r > 0:  # the previous round's values, this round's pairs
            tl.debug_barrier()
            col_i = tl.load(PERM + r * K + pos_i, mask=pm, other=0)
            col_j = tl.load(PERM + r * K + pos_j, mask=pm, other=0)
            xi = tl.load(orow + col_i[None, :], mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            xj = tl.load(orow + col_j[None, :], mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
            tl.debug_barrier()
        c = tl.load(COS + r * (K // 2) + pos_i, mask=pm, other=1.0).to(tl.float32)[None, :]
        s = tl.load(SIN + r * (K // 2) + pos_i, mask=pm, other=0.0).to(tl.float32)[None, :]
        a = to_dtype(xi * c, dt, BF16_BITS).to(tl.float32)
        b = to_dtype(xj * s, dt, BF16_BITS).to(tl.float32)
        yi = to_dtype(a + b, dt, BF16_BITS)
        a = to_dtype(-xi * s, dt, BF16_BITS).to(tl.float32)
        b = to_dtype(xj * c, dt, BF16_BITS).to(tl.float32)
        yj = to_dtype(a + b, dt, BF16_BITS)
        tl.store(orow + col_i[None, :], yi, mask=mask)
        tl.store(orow + col_j[None, :], yj, mask=mask)


def rotate(x2: torch.Tensor, perm: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scales: torch.Tensor,
           group_size: int, interpreting: bool = False) -> torch.Tensor:
    """``x2 [M, K]`` (float16/bfloat16, unit stride along K) transformed; ``perm [krot, K]`` int32 column maps,
    ``cos``/``sin [krot, K/2]`` and ``scales [K]`` in ``x2``'s dtype (``kernels/paro_base.py`` builds them)."""
    m, k = x2.shape
    krot = perm.shape[0]
    out = torch.empty_like(x2)
    if m == 0:
        return out
    half = group_size // 2
    block_h = triton.next_power_of_2(half)
    block_m = max(1, min(16, TILE // block_h))
    grid = (triton.cdiv(m, block_m), k // group_size)
    _rotate_kernel[grid](x2, out, perm, cos, sin, scales, m, k, x2.stride(0), out.stride(0), KROT=krot, HALF=half,
                         BLOCK_H=block_h, BLOCK_M=block_m,
                         BF16_BITS=interpreting and x2.dtype == torch.bfloat16, **COMPILE_OPTIONS)
    return out
