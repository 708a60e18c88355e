"""mlx-lm checkpoints: a tiny Llama quantized and saved by mlx-lm 0.32.2 itself (``quantize_model``, ``save_model``,
``save_config``; mlx 0.32.4 on CPU), planned, loaded and run by qlinear, written back byte-stable and read again by
mlx-lm; plus config and tensor errors, each naming the module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from qlinear.checkpoint.load import load_checkpoint
from qlinear.checkpoint.plan import plan_checkpoint
from qlinear.checkpoint.safetensors_io import CheckpointError
from qlinear.checkpoint.save import convert_checkpoint, save_checkpoint
from qlinear.enums import FORMAT, METHOD
from qlinear.kernels.mlx_torch import MlxTorchLinear

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128,
         "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "vocab_size": 96,
         "tie_word_embeddings": False, "attention_bias": True}


def mlx_lm_utils() -> Any:
    from tests import mlx_support as mxs

    mxs.need_mlx()
    return pytest.importorskip("mlx_lm.utils", reason="mlx-lm is not installed: pip install --no-deps mlx-lm==0.32.2 "
                               "(requirements/nodeps-mlx.txt; it imports transformers)")


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlx-lm's own output, bfloat16: 4-bit group 32 by default, down_proj 8-bit group 64 (a per-module entry),
    attention projections with a bias, lm_head and the norms dense."""
    u = mlx_lm_utils()
    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(3)
    model = llama.Model(llama.ModelArgs.from_dict(LLAMA))
    model.set_dtype(mx.bfloat16)

    def predicate(path: str, module: Any) -> bool | dict[str, Any]:
        if path == "lm_head":
            return False
        if path.endswith("down_proj"):
            return {"group_size": 64, "bits": 8, "mode": "affine"}
        return True

    model, config = u.quantize_model(model, dict(LLAMA), 32, 4, quant_predicate=predicate)
    out = tmp_path_factory.mktemp("mlx") / "tiny-llama-4bit"
    u.save_model(out, model)
    u.save_config(config, out / "config.json")
    return out


def mlx_tensors(path: Path) -> dict[str, np.ndarray]:
    import mlx.core as mx

    return {k: np.asarray(v.view(mx.uint16) if v.dtype == mx.bfloat16 else v) for k, v in
            mx.load(str(path / "model.safetensors")).items()}


def test_plan_reads_mlx_lm_config_and_overrides(fixture_dir: Path) -> None:
    plan = plan_checkpoint(fixture_dir)
    assert plan.config_source == "config.json quantization"
    assert plan.config.method is METHOD.MLX and (plan.config.bits, plan.config.group_size) == (4, 32)
    assert "quantization" not in plan.model_config and "quantization_config" not in plan.model_config
    assert sorted(plan.modules) == sorted(
        ["model.embed_tokens"] + [f"model.layers.0.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj",
                                                                  "self_attn.v_proj", "self_attn.o_proj",
                                                                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")])
    down = plan.modules["model.layers.0.mlp.down_proj"].scheme
    assert (down.bits, down.group_size, down.in_features, down.out_features) == (8, 64, 128, 64)
    assert down.format is FORMAT.MLX and not down.sym
    assert "lm_head.weight" in plan.other


def test_loaded_layers_are_mlx_modules_bit_for_bit(fixture_dir: Path) -> None:
    """Each layer's weight equals mx.dequantize of mlx-lm's loaded module; its forward matches mlx-lm's own
    quantized matmul (a different summation order) closely, and the float64 product of that weight exactly
    enough."""
    u = mlx_lm_utils()
    import mlx.core as mx

    from tests import mlx_support as mxs

    model, _ = u.load_model(fixture_dir)
    modules = dict(model.named_modules())
    layers = load_checkpoint(fixture_dir, dtype=torch.float32)
    assert all(isinstance(layer, MlxTorchLinear) for layer in layers.values())
    for name, layer in layers.items():
        m = modules[name]
        w_mx = mxs.to_torch(mx.dequantize(m.weight, m.scales, m.biases, m.group_size, m.bits))
        w = layer.mlx_weight().dequantize()
        assert w.dtype == w_mx.dtype == torch.bfloat16 and torch.equal(w, w_mx), name
        if name.endswith("embed_tokens"):
            continue
        assert (layer.bias is not None) == ("self_attn" in name) == ("bias" in m)
        bias = 0.0 if layer.bias is None else mxs.to_torch(m.bias).double()
        xi = torch.randn(4, layer.in_features)
        assert torch.allclose(layer(xi).double(), xi.double() @ w_mx.double().t() + bias, rtol=1e-5, atol=1e-5)
        y_mx = mxs.to_torch(m(mxs.to_mlx(xi.bfloat16())).astype(mx.float32))
        assert torch.allclose(layer(xi.bfloat16()).float(), y_mx, rtol=3e-2, atol=3e-2)


def test_convert_to_mlx_is_byte_stable_and_mlx_lm_reads_it(fixture_dir: Path, tmp_path: Path) -> None:
    u = mlx_lm_utils()
    import mlx.core as mx

    first, second = tmp_path / "a", tmp_path / "b"
    convert_checkpoint(fixture_dir, first, "mlx")
    convert_checkpoint(first, second, "mlx")
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()
    assert (first / "config.json").read_text() == (second / "config.json").read_text()
    original, written = mlx_tensors(fixture_dir), mlx_tensors(first)
    assert sorted(original) == sorted(written)
    for k, v in original.items():
        assert v.dtype == written[k].dtype and v.tobytes() == written[k].tobytes(), k
    config = json.loads((first / "config.json").read_text())
    source = json.loads((fixture_dir / "config.json").read_text())
    assert config["quantization"] == config["quantization_config"] == source["quantization"]
    a, _ = u.load_model(fixture_dir)
    b, _ = u.load_model(first)
    tokens = mx.array([[1, 5, 9, 42]])
    assert np.array_equal(np.asarray(a(tokens).astype(mx.float32)), np.asarray(b(tokens).astype(mx.float32)))


def test_save_layers_writes_an_mlx_checkpoint(fixture_dir: Path, tmp_path: Path) -> None:
    layers = load_checkpoint(fixture_dir)
    out = save_checkpoint(layers, tmp_path / "saved", "mlx", config=LLAMA)
    assert not (out / "quantize_config.json").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 4, "mode": "affine",
                                      "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8, "mode": "affine"}}
    plan = plan_checkpoint(out)
    assert {n: (m.scheme.bits, m.scheme.group_size) for n, m in plan.modules.items()} == {
        n: (layer.scheme.bits, layer.scheme.group_size) for n, layer in layers.items()}
    written, original = mlx_tensors(out), mlx_tensors(fixture_dir)
    assert all(written[k].tobytes() == original[k].tobytes() for k in written)


def test_transformers_model_matches_mlx_lm_logits(fixture_dir: Path) -> None:
    """``hf_model.from_pretrained`` on mlx-lm's directory: linear layers served by MlxTorchLinear, the quantized
    embedding dequantized as mx.dequantize gives it; float32 logits vs mlx-lm's own float16 model."""
    u = mlx_lm_utils()
    pytest.importorskip("transformers", reason="transformers is not installed (requirements/nodeps-hf.txt)")
    import mlx.core as mx

    from qlinear.hf_model import from_pretrained, served_layers

    model = from_pretrained(fixture_dir, dtype=torch.float32)
    assert len(served_layers(model)) == 7
    tokens = [[1, 5, 9, 42]]
    with torch.no_grad():
        ours = model(torch.tensor(tokens)).logits.numpy()
    theirs = np.asarray(u.load_model(fixture_dir)[0](mx.array(tokens)).astype(mx.float32))
    assert np.abs(ours - theirs).max() < 2e-2 * np.abs(theirs).max()


# ---------------------------------------------------------------- errors
def rewrite(src: Path, dst: Path, quantization: dict[str, Any] | None = None,
            tensors: dict[str, torch.Tensor | None] | None = None) -> Path:
    from qlinear.checkpoint.plan import find_tensors
    from qlinear.checkpoint.safetensors_io import read_tensor, write_file

    shutil.copytree(src, dst)
    (dst / "model.safetensors.index.json").unlink()
    if quantization is not None:
        config = json.loads((dst / "config.json").read_text())
        config["quantization"] = config["quantization_config"] = quantization
        (dst / "config.json").write_text(json.dumps(config))
    if tensors:
        _, _, infos = find_tensors(dst)
        state = {k: read_tensor(v) for k, v in infos.items()}
        for k, v in tensors.items():
            if v is None:
                del state[k]
            else:
                state[k] = v
        write_file(dst / "model.safetensors", state)
    return dst


@pytest.mark.parametrize(("quantization", "tensors", "message"), [
    ({"group_size": 32, "bits": 4, "mode": "mxfp4"}, None, "mode 'mxfp4': qlinear reads MLX's affine"),
    ({"group_size": 16, "bits": 4}, None, "group_size: MLX affine quantization uses 32, 64, 128; got 16"),
    ({"group_size": 32, "bits": 4, "model.layers.0.self_attn.q_proj": False}, None,
     "model.layers.0.self_attn.q_proj: .* says this module stays dense"),
    ({"group_size": 32, "bits": 4, "lm_head": {"bits": 4}}, None,
     "lm_head: .* quantizes this module .* but the checkpoint stores no scales"),
    (None, {"model.layers.0.self_attn.k_proj.biases": None}, r"model.layers.0.self_attn.k_proj.biases: missing"),
    (None, {"model.layers.0.self_attn.k_proj.scales": torch.zeros(32, 2)},
     r"model.layers.0.self_attn.k_proj.biases: found shape \[32, 2\] dtype torch.bfloat16, expected the scales' dtype"),
    (None, {"model.layers.0.self_attn.v_proj.weight": torch.zeros(32, 8, dtype=torch.int32)},
     r"model.layers.0.self_attn.v_proj.weight: found shape \[32, 8\] dtype torch.int32"),
])
def test_bad_checkpoints_are_named(fixture_dir: Path, tmp_path: Path, quantization: dict[str, Any] | None,
                                   tensors: dict[str, torch.Tensor | None] | None, message: str) -> None:
    bad = rewrite(fixture_dir, tmp_path / "bad", quantization, tensors)
    with pytest.raises(CheckpointError, match=message):
        plan_checkpoint(bad)
