"""``mlx_quant.quantize`` against ``mx.quantize`` (mlx 0.32.4, CPU): codes, scales and biases bit for bit for every
bits x group size x float16/bfloat16/float32, including constant, zero and one-signed groups; and its errors."""

from __future__ import annotations

import pytest
import torch

from qlinear.layouts import mlx
from qlinear.mlx_quant import quantize


def weights(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal weights with a few special groups in row 0: all zero, constant, all positive, all negative, tiny."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0, :32] = 0.0
    w[0, 32:64] = 0.375
    w[1, :32] = w[1, :32].abs() + 0.01
    w[1, 32:64] = -w[1, 32:64].abs()
    w[2, :32] *= 1e-6
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("bits", mlx.BITS)
@pytest.mark.parametrize("gs", mlx.GROUP_SIZES)
def test_quantize_matches_mx_quantize(bits: int, gs: int, dtype: torch.dtype) -> None:
    from tests import mlx_support as mxs

    mxs.need_mlx()
    w = weights(19, 256, dtype, bits * gs)
    ours = quantize(w, bits, gs)
    words, scales, biases = mxs.quantize(w, gs, bits)
    assert torch.equal(mlx.pack(ours.codes, bits), words)
    assert ours.scales.dtype == ours.biases.dtype == dtype
    assert torch.equal(bits_of(ours.scales), bits_of(scales)) and torch.equal(bits_of(ours.biases), bits_of(biases))


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """The stored bits (so -0.0 and 0.0 differ)."""
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize(("weight", "bits", "gs", "message"), [
    (torch.zeros(4, 64, dtype=torch.float64), 4, 32, "weight: expected a float16/bfloat16/float32"),
    (torch.zeros(4, 64), 7, 32, "bits: MLX affine quantization holds"),
    (torch.zeros(4, 48), 4, 32, "in_features 48 is not a multiple of the group size 32"),
    (torch.tensor([[0.0] * 31 + [float("nan")]]), 4, 32,
     r"weight: every value must be finite; found nan at \[out=0, in=31\]"),
])
def test_bad_input_is_named(weight: torch.Tensor, bits: int, gs: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        quantize(weight, bits, gs)
