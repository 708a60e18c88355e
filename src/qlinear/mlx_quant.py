"""MLX's affine quantizer in torch: the same codes, scales and biases as ``mx.quantize`` (mlx 0.32.4, CPU), so an
MLX checkpoint can be written from float weights without mlx installed.

The recipe (facts from mlx's CPU quantizer; every step in float32, rounding half to even): per group of
``group_size`` inputs, ``scale = max((w_max - w_min) / (2^bits - 1), 1e-7)``, negated unless ``|w_min| > |w_max|``;
the edge is ``w_min`` (positive scale) or ``w_max`` (negative scale); ``q0 = rint(edge / scale)``, and when
``q0 != 0`` the scale becomes ``edge / q0`` and the bias the edge (else the bias is 0), so that zero is exactly a
code. Codes are ``clamp(rint((w - bias) / scale), 0, 2^bits - 1)`` with the float32 scale; the stored scale and bias
are then rounded to the weight's dtype. One-bit groups skip the zero step: ``scale = max(w_max - w_min, 1e-7)`` and
``bias = w_min`` (found by testing mlx 0.32.4: its 1-bit quantizer differs from the recipe above).
"""

from __future__ import annotations

import torch

from .layouts import mlx
from .layouts.mlx import MlxWeight

EPS = 1e-7


def quantize(weight: torch.Tensor, bits: int = 4, group_size: int = 64) -> MlxWeight:
    """``mx.quantize(weight, group_size, bits)`` for a float16 / bfloat16 / float32 ``[N, K]`` weight."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype not in mlx.SCALE_DTYPES:
        found = f"{weight.dtype} shape {list(weight.shape)}" if isinstance(weight, torch.Tensor) else type(weight)
        raise ValueError(f"weight: expected a float16/bfloat16/float32 [N, K] tensor; got {found}")
    n, k = weight.shape
    mlx.check_params(bits, group_size, k)
    if not bool(torch.isfinite(weight).all()):
        r, c = (~torch.isfinite(weight)).nonzero()[0].tolist()
        raise ValueError(f"weight: every value must be finite; found {weight[r, c].item()} at [out={r}, in={c}]")
    w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    n_bins = torch.tensor(float((1 << bits) - 1), dtype=torch.float32)
    w_min, w_max = w.amin(dim=-1), w.amax(dim=-1)
    mask = w_min.abs() > w_max.abs()
    scale = torch.clamp_min((w_max - w_min) / n_bins, torch.tensor(EPS, dtype=torch.float32))
    if bits == 1:  # no zero-representability step: the two codes are the group's minimum and maximum
        bias = w_min
    else:
        scale = torch.where(mask, scale, -scale)
        edge = torch.where(mask, w_min, w_max)
        q0 = torch.round(edge / scale)
        moved = q0 != 0
        scale = torch.where(moved, edge / torch.where(moved, q0, 1.0), scale)
        bias = torch.where(moved, edge, 0.0)
    codes = torch.round((w - bias[..., None]) / scale[..., None]).clamp_(0, n_bins)
    return MlxWeight(codes.reshape(n, k).to(torch.uint8), scale.to(weight.dtype), bias.to(weight.dtype), bits,
                     group_size)
