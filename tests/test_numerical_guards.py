"""Numerical guards, as documented in docs/reliability.md.

- Non-finite scales in a checkpoint (NaN, +-Inf) are refused when the module is loaded, naming the tensor; a zero
  scale is a valid (pruned) group and contributes zeros.
- Subnormal inputs are multiplied as IEEE numbers (no flush to zero): outputs match a float64 product.
- float16 layers with a long reduction (K = 28672, activations with outlier channels as LLM hidden states have)
  accumulate in float32: no overflow or precision collapse inside the sum; an output beyond float16's range
  rounds to +-inf exactly as ``F.linear`` in float16 does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from qlinear import QuantLinear, create_layer, quantize_rtn
from qlinear.checkpoint import load_checkpoint
from qlinear.checkpoint.safetensors_io import CheckpointError, read_header, read_tensor, write_file

CORPUS = Path(__file__).parent / "fuzz" / "corpus" / "checkpoint"
#: One-module producer checkpoints and the scale tensor of each.
SCALES = {"gptq_4bit_g32": "scales", "awq_gemm_4bit_g32": "scales", "ct_w4a16_g32": "weight_scale",
          "bnb_nf4": "weight.absmax", "qqq_4bit_g128": "s_group", "ct_nvfp4": "weight_global_scale",
          "ct_fp8_block": "weight_scale"}


def with_scale(tmp_path: Path, fixture: str, value: float) -> Path:
    d = tmp_path / fixture
    shutil.copytree(CORPUS / fixture, d)
    tensors = {k: read_tensor(v) for k, v in read_header(d / "model.safetensors")[0].items()}
    name = next(k for k in tensors if k.endswith("." + SCALES[fixture]))
    t = tensors[name].clone()
    t.view(-1)[0] = value
    tensors[name] = t
    write_file(d / "model.safetensors", tensors)
    return d


@pytest.mark.parametrize("fixture", sorted(SCALES))
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_scales_are_refused_at_load(tmp_path: Path, fixture: str, value: float) -> None:
    with pytest.raises(CheckpointError, match=r"finite"):
        load_checkpoint(with_scale(tmp_path, fixture, value))


def test_zero_scale_is_a_pruned_group(tmp_path: Path) -> None:
    layer = next(iter(load_checkpoint(with_scale(tmp_path, "gptq_4bit_g32", 0.0)).values()))
    w = layer.dequantize(torch.float64)
    assert torch.all(w[0, :32] == 0) and torch.count_nonzero(w[1:]) > 0
    x = torch.randn(3, layer.in_features, dtype=torch.float16)
    ref = x.double() @ w.T
    assert (layer(x).double() - ref).abs().max() / ref.abs().max() < BOUND[type(layer).__name__]


def layer_of(backend: str, k: int, n: int, bits: int = 4, fmt: str = "gptq_v2") -> QuantLinear:
    g = torch.Generator().manual_seed(k + bits)
    q = quantize_rtn(torch.randn(n, k, generator=g) * 0.02, bits=bits, group_size=128, sym=False)
    return create_layer(q, format=fmt, backend=backend, dtype=torch.float16)


CPU_BACKENDS = (("gptq_torch", 4, "gptq_v2"), ("gptq_torch_aten", 4, "gptq_v2"), ("gptq_torch_fused", 4, "gptq_v2"),
                ("gptq_torch_int8", 8, "gptq_v2"), ("awq_torch", 4, "gemm"), ("auto", 4, "gptq_v2"))
#: Largest error relative to the largest output, per kernel (docs/reliability.md). The exact kernels multiply the
#: float16 operands with a float32 sum (as dense float16 ``F.linear`` does: 3.9e-4 measured at K = 28672); torch's
#: int4pack and int8pack CPU operators take bfloat16 operands (scales and activations), which costs about one
#: bfloat16 rounding per group or value (3.6e-3 and up to 4.6e-3 measured).
BOUND = {"TorchLinear": 1e-3, "AwqTorchLinear": 1e-3, "TorchAtenLinear": 6e-3, "TorchFusedLinear": 6e-3,
         "TorchInt8Linear": 6e-3}


@pytest.mark.parametrize(("backend", "bits", "fmt"), CPU_BACKENDS, ids=[b for b, _, _ in CPU_BACKENDS])
def test_subnormal_inputs_are_not_flushed(backend: str, bits: int, fmt: str) -> None:
    torch.set_num_threads(1)
    layer = layer_of(backend, 512, 64, bits, fmt)
    w = layer.dequantize(torch.float64)
    g = torch.Generator().manual_seed(0)
    x16 = ((torch.rand(4, 512, generator=g) * 2 - 1) * 6e-5).half()  # float16 subnormals (below 6.1e-5)
    assert (x16.abs() < 6.1e-5).all() and (x16 != 0).sum() > 1500
    y = layer(x16).double()
    ref = x16.double() @ w.T
    # the outputs are float16 subnormals too (steps of 2^-24): never flushed, within the kernel's bound plus a step
    assert (ref.abs() < 6.1e-5).all() and (y != 0).sum() >= (ref.abs() > 2**-23).sum()
    err = (y - ref).abs().max() / ref.abs().max()
    assert err < BOUND[type(layer).__name__] + 2**-24 / float(ref.abs().max()), f"{err:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "bits", "fmt"), CPU_BACKENDS, ids=[b for b, _, _ in CPU_BACKENDS])
def test_long_float16_reduction(backend: str, bits: int, fmt: str) -> None:
    torch.set_num_threads(1)
    k, n = 28672, 64
    layer = layer_of(backend, k, n, bits, fmt)
    w = layer.dequantize(torch.float64)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, k, generator=g)
    x[:, ::997] = 60.0  # outlier channels, as in LLM hidden states
    x16 = x.half()
    ref = x16.double() @ w.T
    y = layer(x16)
    assert torch.isfinite(y).all()
    err = (y.double() - ref).abs().max() / ref.abs().max()
    assert err < BOUND[type(layer).__name__], f"relative error {err:.2e}: the sum lost precision"
    # inputs aligned with row 0's signs: that output is about 200 * sum|w| > 65504, the others stay in range
    big = (200 * torch.sign(w[0]).float()).half().expand(2, k)
    dense = F.linear(big.float(), w.float()).half()  # a float32 sum rounded once to float16
    out = layer(big)
    assert torch.isinf(dense[:, 0]).all() and torch.isfinite(dense[:, 1:]).all()
    assert torch.equal(out.isinf(), dense.isinf()) and (out[:, 0] > 0).all()
    assert not torch.isnan(out).any()
