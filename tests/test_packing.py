"""The reference's packing API: hf_pack_layer, hf_repack_layer, hf_post_init and the feasibility checks.

Bit-exactness against GPTQModel itself is in tests/external/test_gptqmodel_crosscheck.py; here the
packed codes are checked against the spec's formula evaluated independently in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear import (
    FORMAT,
    NoKernelError,
    Scheme,
    TorchLinear,
    create_layer,
    hf_check_best_packing_format,
    hf_check_packing_feasibility,
    hf_pack_layer,
    hf_post_init,
    hf_repack_layer,
    quantize_rtn,
)
from tests.oracle.gptq_numpy import unpack_qweight


def fake_quantized(n: int = 32, k: int = 128, gs: int = 32, sym: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    q = quantize_rtn(torch.randn(n, k) * 0.02, bits=4, group_size=gs, sym=sym)
    linear = torch.nn.Linear(k, n, bias=True)
    linear.weight.data = q.dequantize()
    return q, linear


def module_for(q, fmt: str = "gptq_v2", bias: bool = True) -> TorchLinear:
    return TorchLinear(Scheme(bits=q.bits, group_size=q.group_size, in_features=q.in_features,
                              out_features=q.out_features, sym=q.sym, format=FORMAT(fmt)), bias=bias)


def test_pack_layer_codes_follow_the_reference_formula() -> None:
    q, linear = fake_quantized()
    module = hf_pack_layer(module_for(q), linear, q.scales, q.zeros, q.g_idx)
    w = linear.weight.detach().double().numpy()
    s = q.scales.double().numpy()[:, q.g_idx.numpy()]
    z = q.zeros.double().numpy()[:, q.g_idx.numpy()]
    expected = np.clip(np.round((w + z * s) / s), 0, 15).T
    np.testing.assert_array_equal(unpack_qweight(module.qweight.numpy(), 4, 128), expected)
    assert torch.equal(module.scales, q.scales.t().half())
    assert torch.equal(module.bias, linear.bias.detach().half())


@pytest.mark.parametrize("impl", [None, "original", "pack_original", "block", "cpu", "auto", "default"])
def test_every_pack_impl_is_bit_identical(impl) -> None:
    q, linear = fake_quantized(k=256, seed=1)
    ref = hf_pack_layer(module_for(q), linear, q.scales, q.zeros, q.g_idx)
    other = hf_pack_layer(module_for(q), linear, q.scales, q.zeros, q.g_idx, pack_impl=impl, block_in=48,
                          workers=2)
    for key in ("qweight", "qzeros", "scales", "g_idx", "bias"):
        assert torch.equal(getattr(other, key), getattr(ref, key)), key


def test_pack_impl_errors() -> None:
    q, linear = fake_quantized()
    with pytest.raises(ValueError, match="pack_impl must be one of"):
        hf_pack_layer(module_for(q), linear, q.scales, q.zeros, pack_impl="fast")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pack_impl='gpu' needs a CUDA device"):
            hf_pack_layer(module_for(q), linear, q.scales, q.zeros, pack_impl="gpu")


def test_symmetric_zeros_are_synthesised_and_asymmetric_required() -> None:
    q, linear = fake_quantized(sym=True)
    module = hf_pack_layer(module_for(q, "gptq"), linear, q.scales)
    assert torch.all(module.qzeros == 0x77777777)  # v1 stores z - 1 = 7 in every field
    q2, linear2 = fake_quantized(sym=False)
    with pytest.raises(ValueError, match="an asymmetric layer needs its zero points"):
        hf_pack_layer(module_for(q2), linear2, q2.scales)


def test_pack_layer_shape_errors_name_the_tensor() -> None:
    q, linear = fake_quantized()
    with pytest.raises(ValueError, match=r"scales: expected shape \[32, 4\], got \(4, 32\) \(scales are"):
        hf_pack_layer(module_for(q), linear, q.scales.t(), q.zeros)
    with pytest.raises(ValueError, match=r"linear.weight: expected shape \[32, 128\]"):
        hf_pack_layer(module_for(q), torch.nn.Linear(64, 32), q.scales, q.zeros)
    with pytest.raises(TypeError, match="expected a qlinear QuantLinear module"):
        hf_pack_layer(torch.nn.Linear(4, 4), linear, q.scales, q.zeros)
    with pytest.raises(ValueError, match="does not hold format gemm"):
        hf_pack_layer(module_for(q), linear, q.scales, q.zeros, checkpoint_format="gemm")


def test_checkpoint_format_switch_and_post_init() -> None:
    q, linear = fake_quantized(sym=True)
    module = hf_pack_layer(module_for(q), linear, q.scales, checkpoint_format="gptq", post_init=True)
    assert module.scheme.format is FORMAT.GPTQ and module._runtime_key is not None
    with pytest.raises(TypeError, match="unexpected options"):
        hf_post_init(module, fast=True)
    container = torch.nn.Sequential(module_for(q), torch.nn.ReLU())
    container[0].load_affine(q, linear.bias.detach())
    assert hf_post_init(container) is container and container[0]._runtime_key is not None


def test_repack_layer() -> None:
    q, _ = fake_quantized()
    layer = create_layer(q, dtype=torch.float32)
    assert hf_repack_layer(layer) is layer
    half = hf_repack_layer(layer, dtype=torch.bfloat16)
    assert half is not layer and half.dtype == torch.bfloat16
    assert torch.equal(half.qweight, layer.qweight) and half._runtime_key is not None
    with pytest.raises(NoKernelError, match="MarlinLinear"):
        hf_repack_layer(layer, "gptq_marlin")
    layer.checkpoint_released = True
    with pytest.raises(ValueError, match="holds only its private runtime layout"):
        hf_repack_layer(layer, dtype=torch.bfloat16)


def test_raw_packing_refused_where_declared() -> None:
    class LoadOnly(TorchLinear):
        raw_packing = False

    q, linear = fake_quantized()
    module = LoadOnly(module_for(q).scheme, bias=True)
    with pytest.raises(ValueError, match="cannot pack raw quantizer outputs"):
        hf_pack_layer(module, linear, q.scales, q.zeros)


def test_feasibility_and_best_format() -> None:
    assert hf_check_packing_feasibility(4, 128, sym=False, desc_act=True)
    assert not hf_check_packing_feasibility(5, 128, format="gptq")  # continuous GPTQ has no 5-bit
    assert hf_check_packing_feasibility(5, 128, format="gptq_p")
    assert not hf_check_packing_feasibility(4, 128, backend="gptq_marlin", device="cpu")
    with pytest.raises(ValueError, match="unknown FORMAT"):
        hf_check_packing_feasibility(4, 128, format="gptq9")
    assert hf_check_best_packing_format(4, 128) is FORMAT.GPTQ_V2
    assert hf_check_best_packing_format(5, 128) is FORMAT.GPTQ_P
    with pytest.raises(ValueError, match="no feasible packing format"):
        hf_check_best_packing_format(4, 100, formats=["gptq_p"], in_features=100)
