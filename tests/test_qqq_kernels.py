"""QQQ kernels on the CPU: ``QQQTorchLinear`` against the float64 numpy oracle (``tests/oracle/qqq_numpy.py``:
exact integer sums, one rounding; the kernel rounds in float32 on the way, so at most 1 ulp of the output dtype and
nearly always identical) and against a float matmul with the dequantized weight (the int8 activations' error, the
bound docs/formats.md states). Then the layer's contract: selection and reasons, the checkpoint layout as its state
dict, re-prepare on mutation, no dense weight kept, load_affine, and GPTQModel's saved checkpoints
(``tests/fixtures/qqq_*``, made by tests/fixtures/make_qqq_fixtures.py) loading bit-exact with GPTQModel's forward.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from qlinear.affine import quantize_rtn
from qlinear.caps import Problem
from qlinear.enums import BACKEND
from qlinear.kernels.qqq import QQQLinear, QQQTorchLinear
from qlinear.layouts.qqq import QQQWeight
from qlinear.select import select
from qlinear.spec import Scheme
from qlinear.target import Target
from tests.oracle import qqq_numpy as ref

FIXTURES = Path(__file__).parent / "fixtures"
#: Relative Frobenius error of a QQQ layer (int8 activations) against x @ dequantize(W)^T in float64, measured
#: 0.8-0.9 % on Gaussian inputs (docs/formats.md); the bound leaves room for other seeds.
FP_TOL = 1.5e-2


def scheme(n: int, k: int, gs: int) -> Scheme:
    return Scheme(bits=4, group_size=gs, in_features=k, out_features=n, method="qqq", format="qqq")


def random_weight(n: int, k: int, gs: int, seed: int = 0) -> QQQWeight:
    """Codes -8..7; group scales like GPTQModel's (4-bit scale over 8-bit channel scale: about 127 / 7.5 at most)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-8, 8, (n, k), generator=g).to(torch.int8)
    group = (torch.rand(n, k // gs, generator=g) * 12 + 4).half() if gs < k else torch.empty(n, 0).half()
    return QQQWeight(codes, group, torch.rand(n, generator=g) * 1e-3 + 1e-4, gs)


def layer_for(qw: QQQWeight, dtype: torch.dtype, bias: torch.Tensor | None = None) -> QQQTorchLinear:
    layer = QQQTorchLinear(scheme(qw.out_features, qw.in_features, qw.group_size), bias=bias is not None, dtype=dtype)
    layer.load_qqq(qw, bias)
    return layer


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy().astype(np.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("n", "k", "gs"), [(128, 256, 128), (192, 384, 128), (256, 192, 192), (64, 128, 128)])
def test_torch_kernel_vs_float64_oracle(n: int, k: int, gs: int, dtype: torch.dtype) -> None:
    qw = random_weight(n, k, gs, seed=n + k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1)) * 0.1
    layer = layer_for(qw, dtype, bias)
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(2, 9, k, generator=g) * 3).to(dtype)
    x[0, 4] = 0  # an all-zero row: scale 0, output = bias
    y = layer(x)
    assert y.shape == (2, 9, n) and y.dtype == dtype
    name = str(dtype).removeprefix("torch.")
    w8 = ref.int8_weight(qw.codes.numpy(), qw.group_scales.numpy() if qw.grouped else None, gs)
    want = ref.forward(as_np(x.reshape(-1, k)), w8, qw.channel_scales.numpy(), name, as_np(layer.bias))
    got = as_np(y.reshape(-1, n))
    ulp = np.abs(want) * (2.0**-10 if dtype == torch.float16 else 2.0**-7)
    assert np.all(np.abs(got - want) <= ulp + 1e-30)
    assert np.mean(got == want) > 0.99
    np.testing.assert_array_equal(got[4], as_np(layer.bias.to(dtype)))
    fp = as_np(x.reshape(-1, k)) @ qw.dequantize(torch.float64).numpy().T + as_np(layer.bias.to(dtype))
    assert np.linalg.norm(got - fp) / np.linalg.norm(fp) < FP_TOL


def test_accuracy_against_float_weights_is_the_documented_bound() -> None:
    """The int8 activations cost about 0.8 % (relative Frobenius) against the float product with the same
    dequantized weight; the float weight's own 4-bit error is the quantizer's, not the kernel's."""
    qw = random_weight(512, 1024, 128, seed=5)
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    y = layer_for(qw, torch.bfloat16)(x).double()
    fp = x.double() @ qw.dequantize(torch.float64).t()
    err = float((y - fp).norm() / fp.norm())
    assert 1e-3 < err < FP_TOL


def test_selection_and_reasons() -> None:
    s = scheme(4096, 4096, 128)
    here = Target.here("cpu")
    choice = select(Problem(s, torch.bfloat16), here)
    assert choice.kernel is QQQTorchLinear
    assert any("device cpu" in r for r in QQQLinear.reasons(Problem(s, torch.bfloat16), here))
    odd = Problem(scheme(64, 64, -1), torch.float16)
    assert any("divisible by none of" in r for r in QQQTorchLinear.reasons(odd, here))
    assert any("float32 not supported" in r for r in QQQTorchLinear.reasons(Problem(s, torch.float32), here))
    assert select(Problem(s, torch.float16), here, BACKEND.QQQ_TORCH).kernel is QQQTorchLinear


def test_state_dict_is_the_checkpoint_and_mutation_re_prepares() -> None:
    qw = random_weight(128, 256, 128)
    layer = layer_for(qw, torch.float16, torch.zeros(128))
    assert sorted(layer.state_dict()) == ["B", "bias", "s_channel", "s_group"]
    x = torch.randn(3, 256).half()
    y = layer(x)
    with torch.no_grad():
        layer.s_channel.mul_(2)  # in place: same storage, new version
    assert torch.equal(layer(x), (y.float() * 2).half())
    assert torch.equal(layer.qqq_weight().codes, qw.codes)


def test_runtime_is_packed_not_dense() -> None:
    k = n = 1024
    layer = layer_for(random_weight(n, k, 128), torch.bfloat16)
    layer(torch.randn(5, k, dtype=torch.bfloat16))
    runtime = sum(t.numel() * t.element_size() for t in (layer._rt_words, layer._rt_sg, layer._rt_sc))
    assert runtime < 1.25 * k * n // 2
    assert layer._rt_words.dtype == torch.int32


def test_load_affine_per_channel_only_and_input_errors() -> None:
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    q = quantize_rtn(w, bits=4, group_size=-1, sym=True)
    layer = QQQTorchLinear(scheme(64, 128, -1), dtype=torch.float16)
    layer.load_affine(q)
    assert torch.equal(layer.dequantize(torch.float64), q.dequantize(torch.float64))
    assert torch.equal(layer.affine().codes, q.codes)
    grouped = QQQTorchLinear(scheme(64, 256, 128), dtype=torch.float16)
    with pytest.raises(ValueError, match="one group per row"):
        grouped.load_affine(quantize_rtn(torch.randn(64, 256), bits=4, group_size=128, sym=True))
    with pytest.raises(ValueError, match="dtype torch.float32 not supported"):
        layer(torch.randn(2, 128))
    with pytest.raises(ValueError, match="expected last dimension 128"):
        layer(torch.randn(2, 64).half())


@pytest.mark.parametrize("name", ["qqq_4bit_g128", "qqq_4bit_channel"])
def test_gptqmodel_checkpoint_loads_bit_exact(name: str) -> None:
    from safetensors.torch import load_file

    from qlinear.checkpoint import load_checkpoint

    root = FIXTURES / name
    ref_out = load_file(str(root / "reference" / "tool_outputs.safetensors"))
    layers = load_checkpoint(root, dtype=torch.float16)
    assert len(layers) == 7
    grouped = 0
    for mod, layer in layers.items():
        assert isinstance(layer, QQQTorchLinear), mod
        qw = layer.qqq_weight()
        grouped += qw.grouped
        assert torch.equal(qw.int8_weight(), ref_out[f"{mod}.w8"]), mod
        assert torch.equal(qw.channel_scales, ref_out[f"{mod}.s_channel"]), mod
        y = layer(ref_out[f"{mod}.x"])
        assert torch.equal(y, ref_out[f"{mod}.y"]), mod
        # GPTQModel's loader rounds s_channel to float16 (its y_loaded); qlinear keeps the checkpoint's float32
        assert not torch.equal(y, ref_out[f"{mod}.y_loaded"]), mod
    assert grouped == (1 if name.endswith("g128") else 0)  # only down_proj (K = 384) has more than one group


def test_from_pretrained_serves_qqq_layers() -> None:
    pytest.importorskip("transformers")
    from qlinear.hf_model import from_pretrained

    model = from_pretrained(FIXTURES / "qqq_4bit_g128", dtype=torch.float16)
    served = [m for m in model.modules() if isinstance(m, QQQTorchLinear)]
    assert len(served) == 7
    ids = torch.tensor([[5, 17, 42, 99]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, 4, 256) and torch.isfinite(logits).all()
