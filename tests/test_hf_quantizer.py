"""qlinear as a transformers quantizer (``qlinear.hf_quantizer``) with the pinned transformers 5.24:
``AutoModelForCausalLM.from_pretrained(path, quantization_config=QlinearConfig(...))`` on the producers' own tiny
llama checkpoints (tests/fixtures: GPTQModel 7.7.0 GPTQ / AWQ, llm-compressor 0.14 compressed-tensors,
bitsandbytes 0.50.2 through transformers) serves every quantized module with a qlinear layer, gives exactly the
logits of ``qlinear.hf_model.from_pretrained`` and matches the producers' stored outputs (their dequantized
weights, their logits) and a float64 model built from the producers' weights."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

FIXTURES = Path(__file__).parent / "fixtures"
INSTALL = "pip install 'qlinear[hf]' && pip install --no-deps -r requirements/nodeps-hf.txt"
IDS = torch.tensor([[1, 17, 42, 99, 3, 120, 7, 64]])  # the smallest fixture vocabulary has 128 ids
#: GPTQModel 7.7.0's (act-order, 8-bit, sharded v2 and AWQ gemm among them) and AutoAWQ 0.2.9's gemv (a layout
#: no CPU kernel runs: re-encoded at load) checkpoints; each reference holds the tool's own dequantized weight of
#: every module.
GPTQMODEL = ["gptq_4bit_g32", "gptq_4bit_g32_desc_act", "gptq_8bit_g32_asym", "gptq_v2_4bit_g32_asym_sharded",
             "awq_gemm_4bit_g32", "autoawq_gemv_4bit_g64"]
#: Checkpoints whose reference holds the producer's dequantized weights and its logits on ``input_ids``.
WITH_LOGITS = ["ct_w4a16_g32", "ct_fp8_dynamic", "bnb_nf4", "bnb_int8"]


@pytest.fixture(scope="module")
def tf():
    transformers = pytest.importorskip("transformers", reason=f"needs transformers: {INSTALL}")
    from qlinear import hf_quantizer

    hf_quantizer.register()
    return transformers


def reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / name / "reference" / "tool_outputs.safetensors"))


def producer_weights(name: str) -> dict[str, torch.Tensor]:
    """module -> the producer's dequantized weight, for every quantized module of the fixture."""
    return {k.removesuffix(".weight"): v for k, v in reference(name).items() if k.endswith(".weight")}


def load(tf, name: str, **config) -> nn.Module:
    from qlinear.hf_quantizer import QlinearConfig

    return tf.AutoModelForCausalLM.from_pretrained(str(FIXTURES / name), quantization_config=QlinearConfig(**config))


def logits(model: nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def float64_model(model: nn.Module, weights: dict[str, torch.Tensor]) -> nn.Module:
    """``model`` with every qlinear layer replaced by an ``nn.Linear`` holding the producer's weight, in float64:
    the reference product, independent of the kernels (and of qlinear's decoding)."""
    import copy

    from qlinear.hf_model import served_layers
    from qlinear.model import set_submodule

    dense = copy.deepcopy(model)
    for name, layer in served_layers(dense).items():
        lin = nn.Linear(layer.in_features, layer.out_features, bias=False)
        lin.weight = nn.Parameter(weights[name].double(), requires_grad=False)
        set_submodule(dense, name, lin)
    return dense.double()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("name", GPTQMODEL + WITH_LOGITS)
def test_layers_are_qlinear_and_logits_equal_hf_model(tf, name: str) -> None:
    from qlinear.checkpoint.plan import plan_checkpoint
    from qlinear.hf_model import from_pretrained, served_layers
    from qlinear.hf_quantizer import QlinearConfig, QlinearHfQuantizer

    model = load(tf, name, dtype=torch.float32)
    assert set(served_layers(model)) == set(plan_checkpoint(FIXTURES / name).modules)
    assert not [n for n, m in model.named_modules() if type(m).__name__ == "_Pending"]
    assert isinstance(model.hf_quantizer, QlinearHfQuantizer) and model.is_quantized
    stored = json.loads((FIXTURES / name / "config.json").read_text())["quantization_config"]
    assert isinstance(model.config.quantization_config, QlinearConfig)
    assert model.config.quantization_config.checkpoint_config == stored  # the checkpoint's own, kept
    assert torch.equal(logits(model), logits(from_pretrained(FIXTURES / name, dtype=torch.float32)))


@pytest.mark.parametrize("name", GPTQMODEL)
def test_gptq_awq_checkpoints_match_the_tools_weights_and_a_float64_model(tf, name: str) -> None:
    from qlinear.hf_model import served_layers

    model = load(tf, name, dtype=torch.float32)
    weights = {m: r for m, r in producer_weights(name).items()}
    for module, layer in served_layers(model).items():
        # the tools dequantize in float16 (one rounding of s * (q - z)); the layer's own decoding is exact
        assert torch.equal(layer.dequantize(torch.float32).to(torch.float16), weights[module]), module
    # float16-rounded producer weights against the exact ones: measured 1.8e-4 .. 2.9e-4
    assert rel(logits(model), logits(float64_model(model, weights), IDS)) < 1e-3


@pytest.mark.parametrize("name", WITH_LOGITS)
def test_producer_logits(tf, name: str) -> None:
    ref = reference(name)
    exact = load(tf, name, dtype=torch.float32)
    if name.startswith("bnb"):  # bitsandbytes' float32 product of its own dequantized weights
        assert rel(logits(exact, ref["input_ids"]), ref["logits_dequant"]) < 1e-5
    if name == "ct_w4a16_g32":  # weight-only: a float64 model on compressed-tensors' own weights, which it
        dense = float64_model(exact, producer_weights(name))  # rounds to bfloat16 (measured 1.8e-3)
        assert rel(logits(exact, ref["input_ids"]), logits(dense, ref["input_ids"])) < 5e-3
    # the tool's own forward in the checkpoint's dtype (compressed-tensors: bfloat16 with its activation
    # quantization; bitsandbytes: its float16/bfloat16 kernels, LLM.int8 with int8 activations), against ours in
    # bfloat16: summation order and rounding only, measured 3.8e-3 .. 7.1e-3
    low = load(tf, name, dtype=torch.bfloat16)
    assert rel(logits(low, ref["input_ids"]).float(), ref["logits"]) < 2e-2


def test_a_method_transformers_does_not_know(tf) -> None:
    """QQQ: config.json says quant_method "qqq", which transformers has no quantizer for."""
    from qlinear.hf_model import from_pretrained, served_layers

    model = load(tf, "qqq_4bit_g128", dtype=torch.float16)
    assert {type(m).__name__ for m in served_layers(model).values()} == {"QQQTorchLinear"}
    assert len(served_layers(model)) == 7
    assert torch.equal(logits(model), logits(from_pretrained(FIXTURES / "qqq_4bit_g128", dtype=torch.float16)))


def test_unknown_backend_names_the_known_ones() -> None:
    pytest.importorskip("transformers", reason=f"needs transformers: {INSTALL}")
    from qlinear.hf_quantizer import QlinearConfig

    with pytest.raises(ValueError, match=r"unknown BACKEND 'nope'; expected one of: auto, gptq_torch"):
        QlinearConfig(backend="nope")
    config = QlinearConfig(backend="gptq_torch", dtype="bf16", device="cpu")
    assert (config.backend, config.dtype, config.device, config.torch_dtype) == (
        "gptq_torch", "bfloat16", "cpu", torch.bfloat16)
    json.dumps(config.to_dict())  # transformers writes it into config.json, and reads it back:
    assert QlinearConfig.from_dict(config.to_dict()).to_dict() == config.to_dict()
    with pytest.raises(TypeError):
        QlinearConfig(dtyp="bf16")  # a misspelt option is not swallowed


def test_a_layer_no_kernel_runs_gives_the_selector_table_before_loading(tf) -> None:
    from qlinear.checkpoint.safetensors_io import CheckpointError

    with pytest.raises(CheckpointError, match=r"no kernel can run this layer") as err:
        load(tf, "gptq_4bit_g32", backend="awq_torch", dtype=torch.float32)
    text = str(err.value)
    assert "chosen: none" in text and "AwqTorchLinear" in text
    assert "_process_model_before_weight_loading" in "".join(_frames(err.value))  # refused before any read
    with pytest.raises(CheckpointError, match=r"activation dtype float32 not supported"):
        load(tf, "qqq_4bit_g128", dtype=torch.float32)


def _frames(err: BaseException) -> list[str]:
    import traceback

    return [f.name for f in traceback.extract_tb(err.__traceback__)]


def test_where_the_layers_go() -> None:
    pytest.importorskip("transformers", reason=f"needs transformers: {INSTALL}")
    from qlinear.hf_quantizer import _layer_device

    assert _layer_device(None, None) == torch.device("cpu")
    assert _layer_device("cuda:1", {"": "cpu"}) == torch.device("cuda", 1)  # QlinearConfig.device wins
    assert _layer_device(None, {"": 0}) == torch.device("cuda", 0)
    for spread in ({"model.embed_tokens": "cpu", "model.layers": 0}, "auto", {"": "disk"}):
        with pytest.raises(ValueError, match=r"qlinear layers go on one device"):
            _layer_device(None, spread)


REGISTRATION = """
import os
os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoModelForCausalLM
from transformers.quantizers import auto
before = auto.AutoHfQuantizer.__dict__["merge_quantization_configs"]
from qlinear import hf_quantizer
assert not hf_quantizer.registered() and "qlinear" not in auto.AUTO_QUANTIZER_MAPPING  # importing does nothing
try:
    AutoModelForCausalLM.from_pretrained(PATH, quantization_config=hf_quantizer.QlinearConfig())
except ValueError as err:
    assert "GPTQConfig" in str(err), err  # transformers itself refuses another config class
else:
    raise AssertionError("loaded without register()")
hf_quantizer.register(); hf_quantizer.register()  # idempotent
assert auto.AUTO_QUANTIZATION_CONFIG_MAPPING["qlinear"] is hf_quantizer.QlinearConfig
hf_quantizer.unregister()
assert "qlinear" not in auto.AUTO_QUANTIZER_MAPPING and "qlinear" not in auto.AUTO_QUANTIZATION_CONFIG_MAPPING
assert auto.AutoHfQuantizer.__dict__["merge_quantization_configs"] is before
print("ok")
"""


def test_registration_is_explicit_idempotent_and_reversible() -> None:
    pytest.importorskip("transformers", reason=f"needs transformers: {INSTALL}")
    script = REGISTRATION.replace("PATH", repr(str(FIXTURES / "gptq_4bit_g32")))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
