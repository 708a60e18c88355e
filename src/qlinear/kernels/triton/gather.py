"""x's columns in another order, in one launch: act-order's sorted rows and gemm5's fragment order.

``torch.index_select`` along dim 1 took 9.9 us at M=16 on an H100 (results/h100-gemm5-*), and the int32 index
needed a clamp and a cast (two more launches) plus a ``masked_fill`` for padding rows. Here each program copies
``BLOCK`` output columns of one row, reading the int32 index as stored: ``-1`` (a padding row) reads 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layout import Packed

BLOCK = 1024


@triton.jit
def gather_kernel(X, IDX, OUT, KO, stride_x, stride_o, BLOCK: tl.constexpr):
    """``OUT[m, j] = X[m, IDX[j]]``, 0 where ``IDX[j] < 0``."""
    m = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < KO
    src = tl.load(IDX + offs, mask=inside, other=-1)
    v = tl.load(X + m * stride_x + src, mask=inside & (src >= 0), other=0.0)
    tl.store(OUT + m * stride_o + offs, v, mask=inside)


def gather(x2: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x2 [M, K]`` (unit column stride) -> ``[M, len(index)]``: column ``j`` is ``x2[:, index[j]]``, zeros where
    ``index[j]`` is -1. ``index`` is int32 on x's device, every entry below K (the layout builds it so)."""
    if x2.dim() != 2 or x2.stride(1) != 1:
        raise ValueError(f"gather: expected a 2-D input with unit column stride, got shape {list(x2.shape)} "
                         f"strides {list(x2.stride())}")
    if index.dtype != torch.int32 or index.dim() != 1:
        raise ValueError(f"gather: expected a 1-D int32 index, got {index.dtype} of shape {list(index.shape)}")
    m, ko = x2.shape[0], index.numel()
    out = torch.empty(m, ko, dtype=x2.dtype, device=x2.device)
    if m and ko:
        gather_kernel[(m, triton.cdiv(ko, BLOCK))](x2, index, out, ko, x2.stride(0), out.stride(0), BLOCK=BLOCK)
    return out


def gather_cols(x2: torch.Tensor, p: Packed) -> torch.Tensor:
    """Activations in sorted-row order ``[M, KP]`` (zeros in padding rows): contiguous A tiles for the GEMM."""
    if p.perm is None:
        raise ValueError("gather_cols: the layout has no act-order permutation")
    return gather(x2 if x2.stride(1) == 1 else x2.contiguous(), p.perm)


def sorted_input(x2: torch.Tensor, p: Packed) -> tuple[torch.Tensor, int]:
    """x in sorted-row order and its row length: gathered once for act-order weights, else as it is."""
    return (gather_cols(x2, p), p.kp) if p.perm is not None else (x2, p.k)
