"""``MlxTorchLinear``: the forward against a float64 product with the weight ``mx.dequantize`` gives (mlx 0.32.4),
tiles, selection, state dict names and errors."""

from __future__ import annotations

import pytest
import torch

from qlinear.caps import Problem
from qlinear.enums import BACKEND, FORMAT
from qlinear.kernels.mlx_torch import MlxTorchLinear
from qlinear.layouts import mlx
from qlinear.layouts.mlx import MlxWeight
from qlinear.select import select
from qlinear.target import Target


def random_mlx(n: int, k: int, bits: int, gs: int, dtype: torch.dtype, seed: int = 0) -> MlxWeight:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.int64).to(torch.uint8)
    scales = ((torch.rand(n, k // gs, generator=g) - 0.5) * 0.02).to(dtype)
    biases = ((torch.rand(n, k // gs, generator=g) - 0.5) * 0.1).to(dtype)
    return MlxWeight(codes, scales, biases, bits, gs)


def layer_for(w: MlxWeight, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float16) -> MlxTorchLinear:
    layer = MlxTorchLinear(mlx.scheme_for(w.bits, w.group_size, w.in_features, w.out_features), bias=bias is not None,
                           dtype=dtype)
    layer.load_mlx(w, bias)
    layer.prepare()
    return layer


@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("bits", "gs", "sdtype"), [(4, 64, torch.float16), (3, 32, torch.bfloat16),
                                                    (8, 128, torch.float32), (5, 64, torch.float16)])
def test_forward_matches_float64_product_of_mlx_weight(bits: int, gs: int, sdtype: torch.dtype,
                                                       act: torch.dtype) -> None:
    """y = x @ W.T (+ bias) with W exactly as mx.dequantize gives it, over two row tiles (N = 150 at K = 2048:
    128-row tiles)."""
    from tests import mlx_support as mxs

    mxs.need_mlx()
    n, k = 150, 2048
    w = random_mlx(n, k, bits, gs, sdtype, seed=bits)
    bias = torch.randn(n).to(sdtype)
    layer = layer_for(w, bias, act)
    assert layer.tile_rows() == 128
    tensors = mlx.to_checkpoint(w)
    w_mx = mxs.dequantize(tensors["weight"], w.scales, w.biases, gs, bits)
    x = torch.randn(3, 5, k).to(act)
    y = layer(x)
    assert y.shape == (3, 5, n) and y.dtype == act
    ref = x.double() @ w_mx.to(act).double().t() + bias.double()
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}[act]
    assert torch.allclose(y.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_decoded_rows_are_mlx_dequantize_bit_for_bit() -> None:
    from tests import mlx_support as mxs

    mxs.need_mlx()
    w = random_mlx(40, 256, 6, 32, torch.bfloat16)
    layer = layer_for(w)
    expected = mxs.dequantize(mlx.pack(w.codes, 6), w.scales, w.biases, 32, 6)
    assert torch.equal(layer.decode_rows(0, 40, torch.bfloat16), expected)
    assert torch.equal(layer.dequantize(torch.bfloat16), expected)


def test_state_dict_is_the_checkpoint_module() -> None:
    w = random_mlx(8, 64, 4, 32, torch.bfloat16)
    layer = layer_for(w, torch.zeros(8, dtype=torch.bfloat16))
    sd = layer.state_dict()
    assert list(sd) == ["weight", "scales", "biases", "bias"]
    assert sd["weight"].dtype == torch.uint32 and sd["scales"].dtype == sd["bias"].dtype == torch.bfloat16
    fresh = MlxTorchLinear(layer.scheme, bias=True)
    fresh.load_state_dict(sd, strict=True)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in sd.items())
    assert torch.equal(fresh.mlx_weight().codes, w.codes)


def test_create_from_a_symmetric_gptq_weight() -> None:
    """``create_layer(q, format="mlx")``: the weight goes in through ``load_affine`` (biases -8 s, exact)."""
    from qlinear import create_layer
    from qlinear.affine import quantize_rtn

    q = quantize_rtn(torch.randn(32, 256) * 0.02, 4, 64, sym=True)
    q = type(q)(q.codes, q.scales.half(), q.zeros, q.g_idx, q.bits, q.group_size, q.sym)
    layer = create_layer(q, format="mlx", dtype=torch.float32)
    assert isinstance(layer, MlxTorchLinear) and layer.biases.dtype == torch.float16
    assert torch.equal(layer.biases.double(), -8 * layer.scales.double())
    assert torch.equal(layer.affine().zeros, q.zeros) and torch.equal(layer.affine().codes, q.codes)
    x = torch.randn(2, 256)
    exact = x.double() @ q.dequantize(torch.float64).t()
    assert torch.allclose(layer(x).double(), exact, rtol=1e-3, atol=1e-3 * exact.abs().max().item())


def test_auto_selects_the_exact_kernel_everywhere() -> None:
    scheme = mlx.scheme_for(4, 64, 4096, 4096)
    for target in (Target.fake_cpu(), Target.fake_cuda((9, 0))):
        assert select(Problem(scheme, torch.bfloat16), target, BACKEND.AUTO).kernel is MlxTorchLinear
    assert MlxTorchLinear.caps.formats == {FORMAT.MLX: 50}


def test_reasons_for_shapes_mlx_cannot_hold() -> None:
    scheme = mlx.scheme_for(4, 32, 64, 8)
    bad = type(scheme)(**{**scheme.__dict__, "bits": 7})
    reasons = MlxTorchLinear.reasons(Problem(bad, torch.float16), Target.fake_cpu())
    assert any("7-bit not supported" in r for r in reasons)


def test_errors_name_the_input() -> None:
    layer = layer_for(random_mlx(8, 64, 4, 32, torch.float16))
    with pytest.raises(ValueError, match="input: expected last dimension 64"):
        layer(torch.zeros(2, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="input: dtype torch.float64 not supported"):
        layer(torch.zeros(2, 64, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"weight: expected \[8, 64\] 4-bit group size 32"):
        layer.load_mlx(random_mlx(8, 64, 4, 64, torch.float16))
    layer.scales.view(-1)[3] = float("nan")
    with pytest.raises(ValueError, match="scales: every value must be finite"):
        layer(torch.zeros(2, 64, dtype=torch.float16))


def test_no_dense_weight_is_kept() -> None:
    layer = layer_for(random_mlx(64, 256, 4, 64, torch.float16))
    layer(torch.zeros(1, 256, dtype=torch.float16))
    held = [*layer.buffers(), *(v for v in vars(layer).values() if isinstance(v, torch.Tensor))]
    assert all(t.is_floating_point() is False or t.numel() < 64 * 256 for t in held)
