"""TorchFP8Linear / TorchFP4Linear: every declared format x element x scale granularity x activation dtype runs
and matches the float64 oracle; activation quantization applied once; nothing dense kept; buffers are the
checkpoint; runtime state follows mutation; bad input named."""

from __future__ import annotations

import gc
import itertools
import warnings

import numpy as np
import pytest
import torch

from qlinear.activations import ActQuant, quantize_dequantize
from qlinear.build import create_float_layer
from qlinear.float_quant import quantize_fp8, quantize_mxfp4, quantize_nvfp4
from qlinear.kernels.torch_float import TorchFP4Linear, TorchFP8Linear
from tests.oracle import float_numpy as ref

K, N = 256, 40
TOL = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def weight(seed: int) -> torch.Tensor:
    return torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.05


def oracle_weight(layer) -> np.ndarray:
    """The layer's checkpoint tensors dequantized by the independent oracle (float64)."""
    sd = layer.state_dict()
    fmt = layer.scheme.format.value
    block = layer.scheme.scale_block
    if "weight_packed" in sd:
        raw = sd["weight_scale"].view(torch.uint8).numpy()
        if fmt == "mxfp4-pack-quantized":
            return ref.dequant_fp4(sd["weight_packed"].numpy(), np.vectorize(ref.e8m0_value)(raw), 32)
        s = np.vectorize(lambda c: ref.fp8_value(int(c), "e4m3"))(raw)
        return ref.dequant_fp4(sd["weight_packed"].numpy(), s, 16, float(sd["weight_global_scale"].item()))
    name = "weight_scale_inv" if fmt in ("fp8", "hf_fp8") else "weight_scale"
    scale = sd[name].float().numpy().astype(np.float64).reshape(-(-N // block[0]), -(-K // block[1]))
    kind = "e4m3" if sd["weight"].dtype == torch.float8_e4m3fn else "e5m2"
    return ref.dequant_fp8(sd["weight"].view(torch.uint8).numpy(), kind, scale, block, divide=fmt == "fp8")


MAKERS = {
    ("fp8", "row"): lambda w: quantize_fp8(w, rule="divide"),
    ("fp8", "tensor"): lambda w: quantize_fp8(w, rule="divide", block=(N, K)),
    ("fp8", "block"): lambda w: quantize_fp8(w, rule="divide", block=(8, 64)),
    ("hf_fp8", "block"): lambda w: quantize_fp8(w, block=(32, 128)),
    ("float-quantized", "channel"): lambda w: quantize_fp8(w, scale_dtype=torch.bfloat16),
    ("float-quantized", "group"): lambda w: quantize_fp8(w, block=(1, 64), scale_dtype=torch.float16),
    ("naive-quantized", "e5m2"): lambda w: quantize_fp8(w, element="e5m2"),
    ("nvfp4-pack-quantized", "g16"): quantize_nvfp4,
    ("mxfp4-pack-quantized", "g32"): quantize_mxfp4,
}
CASES = [(*key, dtype) for key, dtype in itertools.product(MAKERS, (torch.float32, torch.float16, torch.bfloat16))]


def test_the_cases_cover_both_kernels_declared_formats_and_dtypes() -> None:
    covered = {(k[0], d) for *k, d in [(key[0], key[1], d) for key, d in itertools.product(MAKERS, TOL)]}
    for kernel in (TorchFP8Linear, TorchFP4Linear):
        for fmt, dtype in itertools.product(kernel.caps.formats, kernel.caps.dtypes):
            assert (fmt.value, dtype) in covered, (kernel.__name__, fmt, dtype)


@pytest.mark.parametrize(("fmt", "what", "dtype"), CASES)
def test_declared_combination_matches_the_oracle(fmt: str, what: str, dtype: torch.dtype) -> None:
    w = weight(hash((fmt, what)) % 1000)
    bias = torch.randn(N) * 0.1
    layer = create_float_layer(MAKERS[fmt, what](w), format=fmt, dtype=dtype, bias=bias.to(torch.bfloat16))
    assert type(layer) in (TorchFP8Linear, TorchFP4Linear)
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(1)).to(dtype)
    want = x.double().numpy() @ oracle_weight(layer).T + bias.to(torch.bfloat16).double().numpy()
    got = layer(x).double().numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < TOL[dtype]


def test_activation_quantization_runs_once_before_the_product() -> None:
    act = ActQuant(bits=8, element="e4m3", strategy="token", scales="dynamic")
    layer = create_float_layer(quantize_fp8(weight(3)), format="float-quantized", dtype=torch.float32,
                               activations=act)
    x = torch.randn(4, K)
    want = quantize_dequantize(x, act).double() @ layer.dequantize(torch.float64).t()
    assert torch.allclose(layer(x).double(), want, rtol=1e-5, atol=1e-6)
    static = ActQuant(bits=8, element="e4m3", strategy="tensor", scales="static")
    with pytest.raises(ValueError, match="input_scale: the activation quantization .* is static; pass it"):
        create_float_layer(quantize_fp8(weight(3)), format="float-quantized", activations=static)
    layer = create_float_layer(quantize_fp8(weight(3)), format="float-quantized", dtype=torch.float32,
                               activations=static, input_scale=torch.tensor([0.02]))
    assert "input_scale" in layer.state_dict()
    want = quantize_dequantize(x, static, torch.tensor([0.02])).double() @ layer.dequantize(torch.float64).t()
    assert torch.allclose(layer(x).double(), want, rtol=1e-5, atol=1e-6)


def test_buffers_are_the_checkpoint_and_follow_mutation() -> None:
    fw = quantize_nvfp4(weight(4))
    layer = create_float_layer(fw, dtype=torch.float32)
    assert set(layer.state_dict()) == {"weight_packed", "weight_scale", "weight_global_scale"}
    assert layer.weight_scale.dtype == torch.float8_e4m3fn
    x = torch.randn(2, K)
    y1 = layer(x)
    with torch.no_grad():
        layer.weight_global_scale.mul_(2)
    assert torch.allclose(layer(x), y1 / 2, rtol=1e-6, atol=1e-7)


def test_no_dense_weight_survives_forwards() -> None:
    k = n = 2048
    layer = create_float_layer(quantize_fp8(torch.randn(n, k) * 0.02), dtype=torch.bfloat16)
    x = torch.randn(4, k, dtype=torch.bfloat16)
    for _ in range(5):
        layer(x)
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.numel() >= k * n // 4
               and t.dtype != torch.float8_e4m3fn]
    assert big == [], [(tuple(t.shape), t.dtype) for t in big]
    held = sum(b.numel() * b.element_size() for b in layer.buffers()) + layer._factors.numel() * 4
    assert held < k * n * 1.01  # one byte a weight plus the per-row scales


def test_bad_input_and_wrong_weight_are_named() -> None:
    layer = create_float_layer(quantize_fp8(weight(5)), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"input: expected last dimension 256 \(in_features\), got shape \(2, 255\)"):
        layer(torch.randn(2, 255))
    with pytest.raises(ValueError, match="input: dtype torch.int32 not supported"):
        layer(torch.ones(2, K, dtype=torch.int32))
    with pytest.raises(TypeError, match="holds float codes, which have no integer-affine form"):
        layer.affine()
    with pytest.raises(ValueError, match=r"block: .* here has scale blocks \(1, 256\), the weight \(1, 64\)"):
        layer.load_float(quantize_fp8(weight(5), block=(1, 64)))
