"""EXL3 checkpoints (``checkpoint/plan_exl3.py``): a directory in exllamav3's naming (``config.json`` with
``quantization_config = {quant_method: exl3, version, bits, head_bits}``; per module ``trellis``, ``suh``/``svh``
or ``su``/``sv``, an ``mcg``/``mul1`` marker, ``bias``; per-module widths, the head wider) loads into
``ExllamaV3TorchLinear`` layers whose forward is the directly built layer's; bad modules are refused naming the
tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qlinear.checkpoint import CheckpointError, load_checkpoint, plan_checkpoint
from qlinear.kernels.exl3 import ExllamaV3TorchLinear
from qlinear.layouts.exl3 import Exl3Params
from tests.test_exl3_kernels import random_tensors, scheme

QCFG = {"quant_method": "exl3", "version": "1.6.5", "bits": 3.25, "head_bits": 6}
MODULES = {"model.layers.0.mlp.down_proj": (256, 128, Exl3Params(3, "mcg")),
           "model.layers.0.self_attn.q_proj": (128, 128, Exl3Params(2, "3inst", packed_signs=True)),
           "model.layers.0.mlp.up_proj": (128, 256, Exl3Params(4, "mul1")),
           "lm_head": (128, 384, Exl3Params(6, "mcg"))}


def write(root: Path, modules: dict[str, dict[str, torch.Tensor]], qcfg: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"{m}.{leaf}": t for m, leaves in modules.items() for leaf, t in leaves.items()}
    tensors["model.embed_tokens.weight"] = torch.zeros(4, 128, dtype=torch.float16)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": qcfg or QCFG}))
    return root


def modules() -> dict[str, dict[str, torch.Tensor]]:
    out = {name: random_tensors(k, n, p, seed=i) for i, (name, (k, n, p)) in enumerate(MODULES.items())}
    out["model.layers.0.mlp.up_proj"]["bias"] = torch.randn(256).half()
    return out


def test_checkpoint_loads_and_runs(tmp_path: Path) -> None:
    mods = modules()
    root = write(tmp_path / "m", mods)
    plan = plan_checkpoint(root)
    assert set(plan.modules) == set(MODULES)
    assert set(plan.other) == {"model.embed_tokens.weight"}
    assert plan.modules["lm_head"].scheme.layout_params == Exl3Params(6, "mcg")
    layers = load_checkpoint(root, dtype=torch.float32)
    for name, (k, n, p) in MODULES.items():
        layer = layers[name]
        assert isinstance(layer, ExllamaV3TorchLinear) and layer.params == p and layer.scheme.bits == p.bits
        leaves = dict(mods[name])
        bias = leaves.pop("bias", None)
        direct = ExllamaV3TorchLinear(scheme(k, n, p), bias=bias is not None)
        direct.load_exl3(leaves, bias)
        x = torch.randn(3, k, generator=torch.Generator().manual_seed(k + n))
        assert torch.equal(layer(x), direct(x)), name


def test_bad_modules_are_named(tmp_path: Path) -> None:
    mods = modules()
    mods["model.layers.0.mlp.down_proj"]["svh"] = torch.ones(64).half()
    mods["model.layers.0.self_attn.q_proj"]["suh"] = torch.ones(128).half()
    mods["lm_head"]["trellis"] = torch.zeros(8, 24, 40, dtype=torch.int16)
    mods["model.layers.0.mlp.up_proj"]["mcg"] = torch.tensor(0, dtype=torch.int32)
    root = write(tmp_path / "bad", mods)
    with pytest.raises(CheckpointError) as err:
        plan_checkpoint(root)
    msg = str(err.value)
    assert "4 quantized module(s)" in msg
    assert "model.layers.0.mlp.down_proj.svh: found" in msg and "shape [128]" in msg
    assert "q_proj: mixes packed sign vectors (su/sv) with float16 scales (suh/svh)" in msg
    assert "lm_head.trellis: 2.5 bits per weight (a half-integer rate" in msg
    assert "up_proj: both codebook markers mcg and mul1 present" in msg


def test_bad_config_and_marker_value(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="EXL3 bits: expected a number in"):
        plan_checkpoint(write(tmp_path / "c", modules(), {"quant_method": "exl3", "bits": "4"}))
    mods = modules()
    mods["lm_head"]["mcg"] = torch.tensor(12, dtype=torch.int32)
    with pytest.raises(CheckpointError, match="lm_head.*mcg: expected the int32 scalar marker 0xcbac1fed"):
        load_checkpoint(write(tmp_path / "d", mods))
