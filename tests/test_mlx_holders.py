"""The MLX checkpoint holders (``kernels/mlx_holders.py``): each holds its format's tensors, refuses a Torch forward,
and ``to_mlx()`` gives an MLX module that mlx itself (CPU wheel) runs: its dequantized weight equals the float64
truth exactly and its output the float64 product within float16 rounding; a holder loaded from a Torch kernel's
state dict agrees with that kernel's forward; weights MLX cannot hold exactly are refused, naming why."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from qlinear.affine import AffineWeight, quantize_rtn
from qlinear.kernels import mlx_holders as h
from qlinear.kernels.registry import kernel_by_name
from qlinear.mlx_convert import MlxConversionError
from qlinear.spec import Scheme
from tests.mlx_support import need_mlx

K, N = 256, 96
#: (holder, format, method, symmetric)
HOLDERS = [(h.MlxQuantLinear, "gptq", "gptq", True), (h.MlxQuantLinear, "gptq_v2", "gptq", False),
           (h.AwqMlxQuantLinear, "gemm", "awq", False), (h.AwqGemvMlxQuantLinear, "gemv", "awq", False),
           (h.AwqGemvFastMlxQuantLinear, "gemv_fast", "awq", False), (h.LLMAwqMlxQuantLinear, "llm-awq", "awq", False),
           (h.GPTQBitBLASMlxQuantLinear, "bitblas", "gptq", True),
           (h.AWQBitBLASMlxQuantLinear, "bitblas", "awq", False)]


def weight(bits: int, group: int, sym: bool, seed: int) -> AffineWeight:
    """A round-to-nearest weight whose scales have 3 significant bits, so every ``scale * (q - z)`` and
    ``-scale * zero`` is exact in float16: the MLX values must then equal the float64 truth bit for bit."""
    g = torch.Generator().manual_seed(seed)
    q = quantize_rtn(torch.randn(N, K, generator=g) * 0.02, bits, group, sym=sym)
    scales = torch.randint(1, 8, q.scales.shape, generator=g).double() * 2.0 ** -9
    return replace(q, scales=scales.to(q.scales.dtype))


def truth(q: AffineWeight) -> torch.Tensor:
    gi = q.g_idx.long()
    return q.scales.double()[:, gi] * (q.codes.double() - q.zeros.double()[:, gi])


def holder(cls: type, fmt: str, method: str, q: AffineWeight, bias: torch.Tensor) -> torch.nn.Module:
    s = Scheme(bits=q.bits, group_size=q.group_size, in_features=K, out_features=N, sym=q.sym, method=method,
               format=fmt)
    layer = cls(s, bias=True)
    layer.load_affine(q, bias=bias)
    return layer


def mlx_out(module: object, x: torch.Tensor) -> torch.Tensor:
    mx = need_mlx()
    return torch.from_numpy(np.array(module(mx.array(x.numpy())).astype(mx.float32))).double()


@pytest.mark.parametrize(("cls", "fmt", "method", "sym"), HOLDERS)
@pytest.mark.parametrize("group", [128, 32])
def test_holder_to_mlx_holds_the_weight_exactly(cls: type, fmt: str, method: str, sym: bool, group: int) -> None:
    mx = need_mlx()
    q = weight(4, group, sym, seed=group)
    bias = (torch.randn(N, generator=torch.Generator().manual_seed(1)) * 0.1).half()
    module = holder(cls, fmt, method, q, bias).to_mlx()
    assert type(module).__name__ == "QuantizedLinear"
    w = mx.dequantize(module.weight, module.scales, module.biases, group_size=module.group_size, bits=module.bits)
    assert torch.equal(torch.from_numpy(np.array(w.astype(mx.float32))).double(), truth(q))
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(2))  # float32: mlx computes in float32
    ref = x.double() @ truth(q).t() + bias.double()
    assert float((mlx_out(module, x) - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize(("cls", "fmt"), [(h.AwqMlxQuantLinear, "gemm")])
def test_groups_of_16_run_as_two_group32_products(cls: type, fmt: str) -> None:
    """MLX has no group 16: the even and odd half-groups each get exact group-32 scales and biases, and each product
    sees only its half's inputs."""
    mx = need_mlx()
    q = weight(4, 16, False, seed=16)
    module = holder(cls, fmt, "awq", q, torch.zeros(N).half()).to_mlx()
    assert type(module).__name__ == "Group16Linear"
    real = truth(q)
    for half, (s, b) in enumerate([(module.scales_even, module.biases_even), (module.scales_odd, module.biases_odd)]):
        w = mx.dequantize(module.weight, s, b, group_size=32, bits=4)
        cols = (torch.arange(K) // 16) % 2 == half
        assert torch.equal(torch.from_numpy(np.array(w.astype(mx.float32))).double()[:, cols], real[:, cols])
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(3))
    ref = x.double() @ real.t()
    assert float((mlx_out(module, x) - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize(("torch_kernel", "cls", "fmt", "method", "sym"),
                         [("TorchLinear", h.MlxQuantLinear, "gptq", "gptq", True),
                          ("AwqTorchLinear", h.AwqMlxQuantLinear, "gemm", "awq", False)])
def test_holder_loads_a_torch_kernels_state_dict_and_agrees_with_it(torch_kernel: str, cls: type, fmt: str,
                                                                   method: str, sym: bool) -> None:
    need_mlx()
    q = weight(4, 64, sym, seed=7)
    s = Scheme(bits=4, group_size=64, in_features=K, out_features=N, sym=sym, method=method, format=fmt)
    src = kernel_by_name(torch_kernel)(s, bias=True)
    src.load_affine(q, bias=torch.randn(N, generator=torch.Generator().manual_seed(4)) * 0.1)
    layer = cls(s, bias=True)
    layer.load_state_dict(src.state_dict())
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(5))
    want = src(x).double()
    got = mlx_out(layer.to_mlx(), x)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_a_torch_forward_is_refused_with_what_to_do() -> None:
    layer = holder(h.MlxQuantLinear, "gptq", "gptq", weight(4, 128, True, 0), torch.zeros(N).half())
    with pytest.raises(RuntimeError, match=r"to_mlx\(\)"):
        layer(torch.zeros(1, K, dtype=torch.float16))


def test_weights_mlx_cannot_hold_are_refused_naming_why() -> None:
    need_mlx()
    act_order = quantize_rtn(torch.randn(N, K) * 0.02, 4, 64, sym=True, desc_act=True, perm=torch.randperm(K))
    s = Scheme(bits=4, group_size=64, in_features=K, out_features=N, sym=True, desc_act=True, method="gptq",
               format="gptq")
    layer = h.MlxQuantLinear(s, bias=False)
    layer.load_affine(act_order)
    with pytest.raises(MlxConversionError, match="act-order"):
        layer.to_mlx()
    seven = holder(h.MlxQuantLinear, "gptq_p", "gptq", weight(7, 128, True, 1), torch.zeros(N).half())
    with pytest.raises(MlxConversionError, match="bits"):
        seven.to_mlx()
    q = quantize_rtn(torch.randn(N, K, generator=torch.Generator().manual_seed(9)) * 0.02, 4, 128, sym=False)
    inexact = holder(h.AwqMlxQuantLinear, "gemm", "awq", replace(q, scales=(q.scales.float() * 1.0009765625 + 1e-4)
                                                               .to(q.scales.dtype)), torch.zeros(N).half())
    with pytest.raises(MlxConversionError, match="biases"):
        inexact.to_mlx()


def test_holders_are_registered_and_the_marlin_holders_stay_declared() -> None:
    for cls, *_ in HOLDERS:
        assert kernel_by_name(cls.__name__) is cls and cls.implemented
    assert not kernel_by_name("GPTQMarlinMlxQuantLinear").implemented
