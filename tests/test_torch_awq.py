"""AwqTorchLinear and the AwqQuantLinear tile decoders against the float64 numpy oracle (tests/oracle).

Tolerances, as a fraction of max |y_ref|: float16 2e-3 and bfloat16 1.5e-2 (the decoded weight and the output
are rounded to the activation dtype), float32 1e-5, as for TorchLinear.
"""

from __future__ import annotations

import gc
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from qlinear import AffineWeight, ConfigError, QuantLinear, Scheme, Target, create_layer, quantize_rtn
from qlinear.caps import Problem
from qlinear.kernels.awq_base import AwqQuantLinear
from qlinear.kernels.planned.awq import AwqTorchLinear as Declared
from qlinear.kernels.registry import kernel_by_name
from qlinear.kernels.torch_awq import AwqTorchLinear
from tests.oracle.awq_numpy import dequantize

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-5}


def make_weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.02


def make(q: AffineWeight, **kw: object) -> QuantLinear:
    """An AWQ GEMM layer on AwqTorchLinear (AUTO prefers the CPU int4pack kernels for 4-bit)."""
    return create_layer(q, format="gemm", backend="awq_torch", **kw)


def oracle_weight(layer: QuantLinear) -> np.ndarray:
    sd = {k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
          for k, v in layer.state_dict().items() if k != "bias"}
    s = layer.scheme
    return dequantize(s.format.value, sd, s.bits, s.in_features, s.out_features, s.group_size)


CASES = [  # bits, group, sym, K, N
    (4, 128, True, 256, 64),
    (4, 128, False, 320, 40),
    (4, 64, False, 192, 24),
    (4, 32, True, 96, 8),
    (4, -1, False, 100, 16),
    (2, 32, False, 64, 32),
    (8, 64, True, 128, 24),
    (8, -1, False, 72, 40),
]


@pytest.mark.parametrize(("bits", "group", "sym", "k", "n"), CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_forward_matches_float64_oracle(bits: int, group: int, sym: bool, k: int, n: int, dtype: torch.dtype) -> None:
    q = quantize_rtn(make_weight(n, k, seed=bits * 1000 + k), bits=bits, group_size=group, sym=sym)
    bias = torch.randn(n) * 0.1
    layer = make(q, dtype=dtype, bias=bias)
    assert isinstance(layer, AwqTorchLinear) and layer.choice.kernel is AwqTorchLinear
    w64 = oracle_weight(layer)
    np.testing.assert_array_equal(layer.dequantize().numpy(), w64.astype(np.float32))
    np.testing.assert_allclose(w64, q.dequantize(torch.float64).numpy(), rtol=1e-3, atol=1e-6)
    for m in (1, 3, 7):
        x = torch.randn(2, m, k).to(dtype)
        y = layer(x)
        assert y.dtype == dtype and y.shape == (2, m, n)
        ref = x.double().numpy() @ w64.T + bias.half().double().numpy()
        err = np.abs(y.double().numpy() - ref).max() / np.abs(ref).max()
        assert err < TOL[dtype], f"relative error {err:.2e} over {TOL[dtype]:.0e}"


def test_declaration_is_the_reference_one_and_replaces_the_planned_class() -> None:
    widened = AwqTorchLinear.caps.dtypes - Declared.caps.dtypes  # float32: the documented widening
    assert widened == {torch.float32} and AwqTorchLinear.implemented and not Declared.implemented
    assert replace(AwqTorchLinear.caps, dtypes=Declared.caps.dtypes) == Declared.caps
    assert kernel_by_name("AwqTorchLinear") is AwqTorchLinear
    auto = create_layer(quantize_rtn(make_weight(16, 64, 1), bits=8, group_size=32), format="gemm")
    assert isinstance(auto, AwqTorchLinear)  # AUTO: the only CPU kernel for 8-bit AWQ GEMM
    layer = make(quantize_rtn(make_weight(16, 64, 1), group_size=32), dtype=torch.bfloat16)
    assert isinstance(layer, AwqTorchLinear)


def test_runtime_reasons() -> None:
    t = Target.fake_cpu()
    two = Scheme(bits=2, group_size=32, in_features=64, out_features=24, method="awq", format="gemm")
    assert AwqTorchLinear.reasons(Problem(two), t) == [
        "out_features 24 not a multiple of 16 (2-bit AWQ GEMM words hold 16 columns)"]
    four = Scheme(bits=4, group_size=32, in_features=64, out_features=24, method="awq", format="gemm")
    assert AwqTorchLinear.reasons(Problem(four), t) == []
    assert AwqTorchLinear.reasons(Problem(four, dtype=torch.float32), t) == []
    with pytest.raises(ConfigError, match="AWQ never reorders input channels"):
        make(quantize_rtn(make_weight(16, 64, 1), group_size=32, desc_act=True))


def test_forward_input_errors() -> None:
    layer = make(quantize_rtn(make_weight(8, 32, 2), group_size=32))
    with pytest.raises(ValueError, match=r"input: expected last dimension 32 \(in_features\), got shape \(2, 31\)"):
        layer(torch.randn(2, 31, dtype=torch.float16))
    with pytest.raises(ValueError, match="input: dtype torch.float64 not supported; expected bfloat16, float16, flo"):
        layer(torch.randn(2, 32, dtype=torch.float64))


def test_tiled_forward_equals_single_tile(monkeypatch) -> None:
    q = quantize_rtn(make_weight(64, 500, 3), bits=4, group_size=32, sym=False)  # last group partial
    layer = make(q, dtype=torch.bfloat16)
    x = torch.randn(5, 500, dtype=torch.bfloat16)
    whole = layer(x).float()
    monkeypatch.setattr("qlinear.kernels.torch_awq.TILE_ELEMENTS", 64 * 48)
    assert layer.tile_rows() == 32  # whole groups
    torch.testing.assert_close(layer(x).float(), whole, rtol=2e-2, atol=2e-2)
    monkeypatch.setattr("qlinear.kernels.torch_awq.TILE_ELEMENTS", 64 * 20)
    assert layer.tile_rows() == 20  # smaller than a group: tiles straddle groups
    torch.testing.assert_close(layer(x).float(), whole, rtol=2e-2, atol=2e-2)


def test_state_dict_is_the_checkpoint_and_bfloat16_scales_load_unrounded() -> None:
    q = quantize_rtn(make_weight(48, 128, 4), bits=4, group_size=64, sym=False)
    layer = make(q, bias=torch.zeros(48))
    sd = layer.state_dict()
    assert {k: (tuple(v.shape), v.dtype) for k, v in sd.items()} == {
        "qweight": ((128, 6), torch.int32), "qzeros": ((2, 6), torch.int32), "scales": ((2, 48), torch.float16),
        "bias": ((48,), torch.float16)}
    fresh = AwqTorchLinear(layer.scheme, bias=True)
    fresh.load_state_dict(sd)
    x = torch.randn(3, 128, dtype=torch.float16)
    torch.testing.assert_close(fresh(x), layer(x))
    bf = dict(sd, scales=sd["scales"].bfloat16(), bias=torch.randn(48).bfloat16())
    fresh.load_state_dict(bf)
    assert fresh.scales.dtype == torch.bfloat16 and torch.equal(fresh.scales, bf["scales"])
    assert fresh.bias.dtype == torch.bfloat16 and torch.equal(fresh.bias, bf["bias"])
    np.testing.assert_array_equal(fresh.dequantize().numpy(), oracle_weight(fresh).astype(np.float32))


def test_runtime_state_follows_buffer_mutation() -> None:
    q1 = quantize_rtn(make_weight(32, 64, 5), bits=4, group_size=32)
    q2 = quantize_rtn(make_weight(32, 64, 6), bits=4, group_size=32)
    layer = make(q1, dtype=torch.bfloat16)
    calls = []
    original = layer.prepare
    layer.prepare = lambda: (calls.append(1), original())[1]
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    layer(x)
    assert calls == []
    layer.load_affine(q2)
    y = layer(x)
    assert calls == [1]
    ref = x.float() @ q2.dequantize().t()
    assert (y.float() - ref).abs().max() < 2e-2 * ref.abs().max()


def test_no_dense_weight_survives_forwards() -> None:
    k = n = 1024
    q = quantize_rtn(torch.randn(n, k) * 0.02, bits=4, group_size=128)
    layer = make(q, dtype=torch.bfloat16)
    del q
    x = torch.randn(4, k, dtype=torch.bfloat16)
    for _ in range(5):
        layer(x)
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.numel() >= k * n]
    assert big == [], [tuple(t.shape) for t in big]
    assert sum(b.numel() * b.element_size() for b in layer.buffers()) < k * n * 0.6


@pytest.mark.parametrize("fmt", ["gemm", "gemv", "gemv_fast", "llm-awq"])
def test_tile_decoders_agree_with_the_canonical_form(fmt: str) -> None:
    q = quantize_rtn(make_weight(16, 192, 7), bits=4, group_size=64, sym=False)
    s = Scheme(bits=4, group_size=64, in_features=192, out_features=16, sym=False, method="awq", format=fmt)
    layer = AwqQuantLinear(s)
    layer.load_affine(q)
    canon = layer.affine()
    assert torch.equal(canon.codes, q.codes) and torch.equal(canon.zeros, q.zeros)
    block = layer.code_block
    assert block == {"gemm": 1, "gemv": 8}.get(fmt, 64)
    k0 = block * (64 // block)
    assert torch.equal(layer.codes_rows(k0, 150), q.codes[:, k0:150].t())
    zeros = layer.true_zeros()  # gemv_fast: -zbuf/s, the integer z up to the float16 rounding of -s*z
    assert torch.equal(zeros.round(), q.zeros.t().float()) and (zeros - zeros.round()).abs().max() <= 15 * 2**-11
    assert torch.equal(layer.group_scales(), q.scales.t().half().float())
    assert layer.group_index(60, 70).tolist() == [0] * 4 + [1] * 6
    if block > 1:
        with pytest.raises(ValueError, match=f"k0: 3 is not a multiple of {block}"):
            layer.codes_rows(3, 10)
