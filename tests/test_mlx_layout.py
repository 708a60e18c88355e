"""The MLX layout (``layouts/mlx.py``) against the producer, mlx 0.32.4 on CPU (``mx.quantize`` / ``mx.dequantize``),
and against an independent numpy oracle (``tests/oracle/mlx_numpy.py``: the bit stream read bit by bit, the weight
in float64); plus clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear.layouts import mlx
from qlinear.layouts.mlx import MlxWeight
from tests.oracle import mlx_numpy as ref

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def weight(n: int, k: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) * 0.05).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bits", mlx.BITS)
@pytest.mark.parametrize("gs", mlx.GROUP_SIZES)
def test_words_and_dequantize_match_mlx(bits: int, gs: int, dtype: torch.dtype) -> None:
    """Unpack -> pack gives mx.quantize's words back; dequantize equals mx.dequantize bit for bit (odd N)."""
    from tests import mlx_support as mxs

    mxs.need_mlx()
    n, k = 37, 384
    words, scales, biases = mxs.quantize(weight(n, k, dtype, bits * gs), gs, bits)
    assert words.shape == (n, k * bits // 32) and scales.dtype == biases.dtype == dtype
    codes = mlx.unpack(words, bits, k)
    assert np.array_equal(codes.numpy(), ref.unpack_stream(words.view(torch.int32).numpy().view(np.uint32), bits, k))
    assert torch.equal(mlx.pack(codes, bits), words)
    w = MlxWeight(codes, scales, biases, bits, gs)
    expected = mxs.dequantize(words, scales, biases, gs, bits)
    assert w.dequantize().dtype == dtype
    assert torch.equal(w.dequantize(), expected)
    exact = ref.weight64(codes.numpy(), scales.double().numpy(), biases.double().numpy(), gs)
    # MLX rounds twice in the scales' dtype: within one ulp of the exact value (two half-ulp roundings)
    ulp = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23}[dtype]
    err = np.abs(expected.double().numpy() - exact)
    assert (err <= ulp * np.maximum(np.abs(exact), np.abs(biases.double().numpy()).repeat(gs, 1)) + 1e-30).all()


def test_three_bit_codes_straddle_words() -> None:
    """By hand: 3-bit code 10 occupies stream bits 30..32, i.e. bits 30-31 of word 0 and bit 0 of word 1."""
    codes = torch.zeros(1, 32, dtype=torch.uint8)
    codes[0, 10] = 0b101
    words = mlx.pack(codes, 3).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    assert words.tolist() == [[0b01 << 30, 0b1, 0]]
    assert mlx.unpack(mlx.pack(codes, 3), 3, 32)[0, 10] == 5


def test_mlx_quantizer_facts() -> None:
    """Facts the docs state: about half of MLX's scales are negative; a constant group gets a tiny negative scale
    and the constant as bias."""
    from tests import mlx_support as mxs

    mxs.need_mlx()
    _, scales, _ = mxs.quantize(weight(64, 512, torch.float16), 64, 4)
    assert 0.3 < (scales < 0).float().mean().item() < 0.7
    _, s, b = mxs.quantize(torch.full((2, 64), 0.5, dtype=torch.float16), 64, 4)
    assert (s < 0).all() and (s.abs() < 1e-6).all() and (b == 0.5).all()


def test_checkpoint_round_trip() -> None:
    w = MlxWeight(torch.randint(0, 64, (5, 64), dtype=torch.uint8), torch.rand(5, 2).half(), torch.rand(5, 2).half(),
                  6, 32)
    scheme = mlx.scheme_for(6, 32, 64, 5)
    tensors = mlx.to_checkpoint(w)
    assert tensors["weight"].dtype == torch.uint32 and tuple(tensors["weight"].shape) == (5, 12)
    back = mlx.from_checkpoint(tensors, scheme)
    assert torch.equal(back.codes, w.codes) and back.scales is w.scales and back.biases is w.biases


# ---------------------------------------------------------------- errors
def good() -> dict[str, torch.Tensor]:
    return {"codes": torch.zeros(4, 64, dtype=torch.uint8), "scales": torch.ones(4, 2).half(),
            "biases": torch.zeros(4, 2).half()}


@pytest.mark.parametrize(("change", "bits", "gs", "message"), [
    ({"codes": torch.zeros(4, 64, dtype=torch.int32)}, 4, 32, "codes: expected a uint8"),
    ({"codes": torch.full((4, 64), 16, dtype=torch.uint8)}, 4, 32, "codes: 4-bit codes must lie in 0..15; found 16"),
    ({}, 7, 32, "bits: MLX affine quantization holds 1, 2, 3, 4, 5, 6, 8 bits; got 7"),
    ({}, 4, 16, "group_size: MLX affine quantization uses 32, 64, 128; got 16"),
    ({"codes": torch.zeros(4, 96, dtype=torch.uint8)}, 4, 64, "in_features 96 is not a multiple of the group size 64"),
    ({"scales": torch.ones(4, 3).half()}, 4, 32, "scales: expected a float16/bfloat16/float32 tensor of shape [4, 2]"),
    ({"biases": torch.zeros(4, 2)}, 4, 32, "biases: expected the scales' dtype torch.float16"),
    ({"scales": torch.tensor([[1.0, 1.0]] * 3 + [[1.0, float("nan")]]).half()}, 4, 32,
     "scales: every value must be finite; found nan at [out=3, group=1]"),
    ({"biases": torch.tensor([[0.0, float("inf")]] * 4).half()}, 4, 32, "biases: every value must be finite"),
])
def test_bad_weights_are_named(change: dict[str, torch.Tensor], bits: int, gs: int, message: str) -> None:
    t = {**good(), **change}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        MlxWeight(t["codes"], t["scales"], t["biases"], bits, gs)


def test_bad_checkpoint_tensors_are_named() -> None:
    scheme = mlx.scheme_for(4, 32, 64, 4)
    tensors = mlx.to_checkpoint(MlxWeight(**good(), bits=4, group_size=32))
    with pytest.raises(ValueError, match=r"weight: expected shape \[4, 8\] dtype torch.uint32"):
        mlx.from_checkpoint({**tensors, "weight": tensors["weight"].view(torch.int32)}, scheme)
    with pytest.raises(ValueError, match="biases: missing"):
        mlx.from_checkpoint({k: v for k, v in tensors.items() if k != "biases"}, scheme)
