"""VPTQ checkpoints (config.json ``quant_method: vptq`` with ``config_for_layers`` / ``shared_layer_config``, tensors
in VPTQ's naming) plan and load into ``VPTQLinear`` layers that decode to the float64 oracle's weight; the planner's
refusals name the module, the tensor and the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qlinear.checkpoint.load import load_checkpoint
from qlinear.checkpoint.plan import plan_checkpoint
from qlinear.checkpoint.safetensors_io import CheckpointError
from qlinear.kernels.vptq import VPTQLinear
from qlinear.layouts import vptq
from tests import vptq_cases
from tests.oracle import vptq_numpy

LAYERS = {  # module -> make_case kwargs
    "model.layers.0.self_attn.q_proj": dict(k=64, n=48, v=8, c=256, r=16, perm=True, norm=True, bias=True),
    "model.layers.0.mlp.down_proj": dict(k=80, n=18, v=6, c=64, os=16, vo=4, co=16, seed=3),
}


def entry(meta: dict, bias: bool) -> dict:
    """The VQuantLinear arguments VPTQ writes for a layer."""
    return {"bias": bias, "enable_norm": meta["norm"], "enable_perm": meta["perm"], "group_num": meta["G"],
            "group_size": meta["gs"], "in_features": meta["K"], "indices_as_float": False, "is_indice_packed": True,
            "num_centroids": [meta["Co"], meta["C"]], "num_res_centroids": [-1, meta["R"]],
            "out_features": meta["N"], "outlier_size": meta["os"], "vector_lens": [meta["vo"], meta["v"]],
            "vector_quant_dim": "out"}


def write(root: Path, shared: bool = False, edit=None) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    tensors, config, cases = {"model.embed_tokens.weight": torch.randn(8, 4).half()}, {}, {}
    for name, kw in LAYERS.items():
        meta, t = vptq_cases.make_case(name, **kw)
        packed = vptq.pack_indices(t["idx"], t.get("res"), vptq_cases.params(meta))
        state = vptq_cases.checkpoint_tensors(meta, t, packed) | ({"bias": t["bias"]} if "bias" in t else {})
        tensors.update({f"{name}.{leaf}": v.contiguous() for leaf, v in state.items()})
        key = name.rpartition(".")[2] if shared else name
        config[key] = entry(meta, "bias" in t)
        cases[name] = (meta, t, packed)
    qc = {"quant_method": "vptq", ("shared_layer_config" if shared else "config_for_layers"): config}
    cfg = {"model_type": "llama", "quantization_config": qc}
    if edit is not None:
        edit(tensors, qc)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(cfg))
    return cases


@pytest.mark.parametrize("shared", [False, True])
def test_checkpoint_loads_and_decodes(tmp_path: Path, shared: bool) -> None:
    cases = write(tmp_path, shared)
    plan = plan_checkpoint(tmp_path)
    assert set(plan.modules) == set(LAYERS) and set(plan.other) == {"model.embed_tokens.weight"}
    layers = load_checkpoint(tmp_path, dtype=torch.float16)
    for name, (meta, t, packed) in cases.items():
        layer = layers[name]
        assert isinstance(layer, VPTQLinear)
        ref = vptq_numpy.dequantize(meta, {k: v.double().numpy() for k, v in t.items()}, packed.numpy())
        assert torch.equal(layer.dequantize().double(), torch.from_numpy(ref)), name
        y = layer(t["x"])
        want = t["x"].double() @ torch.from_numpy(ref).half().double().t()
        if "bias" in t:
            want += t["bias"].double()
        assert (y.double() - want).abs().max() / want.abs().max() < 2e-3


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t, q: t.pop("model.layers.0.mlp.down_proj.outlier_indices"),
     "model.layers.0.mlp.down_proj.outlier_indices: missing"),
    (lambda t, q: t.update({"model.layers.0.self_attn.q_proj.perm":
                            t["model.layers.0.self_attn.q_proj.perm"].long()}),
     "model.layers.0.self_attn.q_proj.perm: found shape [64] dtype torch.int64, but the config says shape [64] "
     "dtype torch.int16"),
    (lambda t, q: q["config_for_layers"]["model.layers.0.mlp.down_proj"].update(is_indice_packed=False),
     "is_indice_packed false"),
    (lambda t, q: q["config_for_layers"]["model.layers.0.mlp.down_proj"].update(group_size=32),
     "cover fewer than in_features 80"),
    (lambda t, q: q["config_for_layers"]["model.layers.0.mlp.down_proj"].update(fancy=1),
     "unknown VQuantLinear argument(s) fancy"),
    (lambda t, q: q["config_for_layers"].pop("model.layers.0.mlp.down_proj"),
     "model.layers.0.mlp.down_proj.indices: a VPTQ module the config does not describe"),
    (lambda t, q: t.pop("model.layers.0.self_attn.q_proj.bias"),
     "model.layers.0.self_attn.q_proj.bias: missing (the config says bias true)"),
    (lambda t, q: (q.pop("config_for_layers"), q.update(vector_lens=[-1, 8])),
     "GPTQModel's VPTQ config: it records no layer shapes"),
])
def test_plan_errors(tmp_path: Path, edit, needle: str) -> None:
    write(tmp_path, edit=edit)
    with pytest.raises(CheckpointError) as err:
        plan_checkpoint(tmp_path)
    assert needle in str(err.value)


def test_tiny_llama_served_from_a_vptq_directory(tmp_path: Path) -> None:
    """Every linear of a one-layer Llama as VPTQ (``shared_layer_config``, VPTQ's naming) served by
    ``hf_model.from_pretrained``: logits equal those of the dense model holding the oracle's weights."""
    tf = pytest.importorskip("transformers", reason="transformers is not installed: pip install 'qlinear[hf]'")
    from qlinear.hf_model import from_pretrained

    cfg = tf.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=40, tie_word_embeddings=False)
    torch.manual_seed(0)
    dense = tf.LlamaForCausalLM(cfg).eval()
    tensors = {k: v.half().contiguous() for k, v in dense.state_dict().items()}
    shared = {}
    for i, (name, mod) in enumerate(m for m in dense.named_modules() if m[0].startswith("model.layers.")
                                    and isinstance(m[1], torch.nn.Linear)):
        meta, t = vptq_cases.make_case(name, k=mod.in_features, n=mod.out_features, v=4, c=32, r=4, perm=True,
                                       norm=True, seed=i)
        packed = vptq.pack_indices(t["idx"], t.get("res"), vptq_cases.params(meta))
        del tensors[f"{name}.weight"]
        tensors.update({f"{name}.{leaf}": v.contiguous()
                        for leaf, v in vptq_cases.checkpoint_tensors(meta, t, packed).items()})
        shared[name.rpartition(".")[2]] = entry(meta, False)
        w = vptq_numpy.dequantize(meta, {k: v.double().numpy() for k, v in t.items()}, packed.numpy())
        mod.weight.data = torch.from_numpy(w).float()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = cfg.to_dict() | {"quantization_config": {"quant_method": "vptq", "shared_layer_config": shared}}
    (tmp_path / "config.json").write_text(json.dumps(config, default=str))
    served = from_pretrained(tmp_path, dtype=torch.float32)
    for name, p in dense.named_parameters():  # the unquantized tensors went through float16 in the checkpoint
        if not name.startswith("model.layers.0.self_attn.") and not name.startswith("model.layers.0.mlp."):
            p.data = p.data.half().float()
    ids = torch.tensor([[1, 5, 9, 3, 22]])
    with torch.inference_mode():
        a, b = served(ids).logits, dense(ids).logits
    assert (a - b).abs().max() / b.abs().max() < 1e-5
