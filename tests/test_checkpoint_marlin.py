"""Marlin-format checkpoints (checkpoint/plan_marlin.py): the AutoGPTQ-made fixtures (tests/fixtures/marlin_*,
packed by AutoGPTQ 0.7.1's own ``MarlinQuantLinear.pack``; make_marlin_fixtures.py) decode to exactly the codes and
scales the packer was given, load as gptq_v2 layers, convert to GPTQ and back byte for byte, and every config
spelling of the format (AutoGPTQ 0.7, AutoGPTQ main, vLLM, GPTQModel's label on GPTQ tensors) is read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qlinear.checkpoint import CheckpointError, convert_checkpoint, inspect_checkpoint, load_checkpoint, plan_checkpoint
from qlinear.checkpoint.load import read_module
from qlinear.cli import main
from qlinear.convert import ConversionError, decode
from qlinear.enums import FORMAT, METHOD

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ("marlin_4bit_g128", "marlin_4bit_ch")
FILES = {"marlin_4bit_g128": "gptq_model-4bit-128g.safetensors", "marlin_4bit_ch": "gptq_model-4bit--1g.safetensors"}


def reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / name / "reference" / "autogptq_pack_inputs.safetensors")


def copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst, ignore=shutil.ignore_patterns("reference"))
    return dst


@pytest.mark.parametrize("name", NAMES)
def test_modules_decode_to_what_autogptq_packed(name: str) -> None:
    plan, ref = plan_checkpoint(FIXTURES / name), reference(name)
    assert set(plan.modules) == {k.rsplit(".", 1)[0] for k in ref if k.endswith(".codes")}
    assert set(plan.other) == {"model.norm.weight"} and not plan.unused
    for module, mp in plan.modules.items():
        tensors, scheme = read_module(mp)
        assert (scheme.method, scheme.format, scheme.bits, scheme.sym, scheme.desc_act) == \
               (METHOD.GPTQ, FORMAT.MARLIN, 4, True, False)
        q = decode(tensors, scheme)
        codes, scales = ref[f"{module}.codes"], ref[f"{module}.scales"]
        assert torch.equal(q.codes, codes) and torch.equal(q.scales, scales), module
        assert bool((q.zeros == 8).all())
        gs = q.in_features // scales.shape[1]
        weight = (scales.float().repeat_interleave(gs, dim=1) * (codes.float() - 8)).half()  # what pack() was given
        assert torch.equal(q.dequantize(torch.float16), weight), module


def test_schemes_read_from_the_configs() -> None:
    plan = plan_checkpoint(FIXTURES / "marlin_4bit_g128")
    shapes = {m: (s.scheme.in_features, s.scheme.out_features, s.scheme.num_groups, s.scheme.channelwise)
              for m, s in plan.modules.items()}
    assert shapes == {"model.layers.0.self_attn.q_proj": (256, 256, 2, False),
                      "model.layers.0.mlp.down_proj": (384, 256, 3, False),
                      "model.layers.0.mlp.up_proj": (128, 256, 1, True)}
    assert plan.config.checkpoint_format is FORMAT.MARLIN and plan.config.extra["is_marlin_format"] is True
    assert plan.modules["model.layers.0.self_attn.q_proj"].has_bias
    ch = plan_checkpoint(FIXTURES / "marlin_4bit_ch")
    assert all(mp.scheme.channelwise for mp in ch.modules.values()) and ch.quant_config["checkpoint_format"] == "marlin"


@pytest.mark.parametrize("name", NAMES)
def test_layers_compute_the_dequantized_product(name: str) -> None:
    layers = load_checkpoint(FIXTURES / name, dtype=torch.float32)
    tensors = load_file(FIXTURES / name / FILES[name])
    g = torch.Generator().manual_seed(0)
    for module, layer in layers.items():
        assert layer.scheme.format is FORMAT.GPTQ_V2 and "stored as marlin" in layer.choice.note
        w = layer.dequantize(torch.float64)
        x = torch.randn(3, layer.in_features, generator=g)
        want = x.double() @ w.t() + tensors.get(f"{module}.bias", torch.zeros(1)).double()
        got = layer(x).double()
        assert float((got - want).norm() / want.norm()) < 1e-5, module


@pytest.mark.parametrize("name", NAMES)
def test_gptq_and_back_is_byte_for_byte(name: str, tmp_path: Path) -> None:
    convert_checkpoint(FIXTURES / name, tmp_path / "v2", "gptq_v2")
    convert_checkpoint(tmp_path / "v2", tmp_path / "v1", "gptq")
    v1 = plan_checkpoint(tmp_path / "v1")
    assert {mp.scheme.format for mp in v1.modules.values()} == {FORMAT.GPTQ}
    for module, mp in plan_checkpoint(FIXTURES / name).modules.items():
        a, b = decode(*read_module(mp)), decode(*read_module(v1.modules[module]))
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales) and torch.equal(a.zeros, b.zeros)
    convert_checkpoint(tmp_path / "v1", tmp_path / "back", "marlin")
    src, back = load_file(FIXTURES / name / FILES[name]), load_file(tmp_path / "back" / "model.safetensors")
    assert src.keys() == back.keys() and all(torch.equal(src[k], back[k]) and src[k].dtype == back[k].dtype
                                             for k in src)
    q = json.loads((tmp_path / "back" / "quantize_config.json").read_text())
    assert (q["checkpoint_format"], q["is_marlin_format"], q["quant_method"], q["bits"], q["sym"], q["desc_act"]) == \
           ("marlin", True, "gptq", 4, True, False)


def test_same_format_copy_keeps_the_config_as_written(tmp_path: Path) -> None:
    convert_checkpoint(FIXTURES / "marlin_4bit_g128", tmp_path / "copy", "marlin")
    src = FIXTURES / "marlin_4bit_g128"
    assert (tmp_path / "copy" / "quantize_config.json").read_text() == \
           json.dumps(json.loads((src / "quantize_config.json").read_text()), indent=2) + "\n"
    a, b = load_file(src / FILES["marlin_4bit_g128"]), load_file(tmp_path / "copy" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_convert_and_inspect(capsys, tmp_path: Path) -> None:
    code = main(["convert", str(FIXTURES / "marlin_4bit_ch"), str(tmp_path / "v2"), "--format", "gptq_v2"])
    out, _ = capsys.readouterr()
    assert code == 0 and "lossless" in out
    rows = inspect_checkpoint(FIXTURES / "marlin_4bit_ch")["modules"]
    assert {(r["format"], r["runs_as"], r["group_size"]) for r in rows} == {("marlin", "gptq_v2", -1)}


@pytest.mark.parametrize("config", [
    {"quant_method": "marlin", "group_size": 128, "lm_head": False},  # vLLM's own spelling: bits implied
    {"bits": 4, "group_size": 128, "sym": True, "quant_method": "gptq", "checkpoint_format": "marlin"},
    {"bits": 4, "group_size": 128, "format": "marlin", "quant_method": "gptq"},
    {"bits": 4, "group_size": 128, "desc_act": True, "is_marlin_format": True},  # AutoGPTQ forces desc_act off
])
def test_config_spellings(config: dict, tmp_path: Path) -> None:
    root = copy("marlin_4bit_g128", tmp_path)
    (root / "quantize_config.json").unlink()
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": config}))
    plan = plan_checkpoint(root)
    assert {mp.scheme.format for mp in plan.modules.values()} == {FORMAT.MARLIN}
    assert not any(mp.scheme.desc_act for mp in plan.modules.values()) and len(plan.modules) == 3


def test_vllm_workspace_is_set_aside(tmp_path: Path) -> None:
    root = copy("marlin_4bit_ch", tmp_path)
    f = root / FILES["marlin_4bit_ch"]
    tensors = load_file(f)
    tensors["model.layers.0.self_attn.o_proj.workspace"] = torch.zeros(64, dtype=torch.int32)
    save_file(tensors, str(f))
    plan = plan_checkpoint(root)
    assert set(plan.unused) == {"model.layers.0.self_attn.o_proj.workspace"}
    assert "workspace" not in plan.modules["model.layers.0.self_attn.o_proj"].tensors
    assert len(load_checkpoint(root)) == 2
    convert_checkpoint(root, tmp_path / "v2", "gptq_v2")
    assert not any(k.endswith("workspace") for k in load_file(tmp_path / "v2" / "model.safetensors"))


def _broken(tmp_path: Path, config: dict | None = None, edit=None) -> str:
    root = copy("marlin_4bit_g128", tmp_path)
    if config is not None:
        cfg = json.loads((root / "quantize_config.json").read_text())
        (root / "quantize_config.json").write_text(json.dumps({**cfg, **config}))
    if edit is not None:
        f = root / FILES["marlin_4bit_g128"]
        tensors = load_file(f)
        edit(tensors)
        save_file(tensors, str(f))
    with pytest.raises(CheckpointError) as err:
        plan_checkpoint(root)
    return str(err.value)


def test_bad_checkpoints_name_module_and_tensor(tmp_path: Path) -> None:
    assert "symmetric only, but the config says sym=false" in _broken(tmp_path / "a", {"sym": False})
    assert "4-bit codes with a fixed bias of 8" in _broken(tmp_path / "b", {"bits": 8})
    assert "cannot be both" in _broken(tmp_path / "c", {"checkpoint_format": "gptq"})
    down_s = torch.ones(2, 256).half()
    msg = _broken(tmp_path / "d", edit=lambda t: t.update({"model.layers.0.mlp.down_proj.s": down_s}))
    assert "model.layers.0.mlp.down_proj.s: found shape [2, 256] dtype torch.float16, but the config says shape " \
           "[3, 256]" in msg
    msg = _broken(tmp_path / "e", edit=lambda t: t.update({
        "model.layers.0.mlp.up_proj.B": t["model.layers.0.mlp.up_proj.B"].to(torch.int64),
        "model.layers.0.mlp.up_proj.qzeros": torch.zeros(1, 32, dtype=torch.int32)}))
    assert "up_proj.B: found shape [8, 512] dtype torch.int64" in msg and "up_proj.qzeros: unexpected tensor" in msg
    msg = _broken(tmp_path / "f", edit=lambda t: t.update({"model.layers.0.mlp.up_proj.B": torch.zeros(8, 100,
                                                                                                      dtype=torch.int32)}))
    assert "out_features 50 (from B)" in msg and "multiple of 64" in msg


@pytest.mark.parametrize(("name", "layout"), [("gptq_4bit_g32", FORMAT.GPTQ), ("awq_gemm_4bit_g32", FORMAT.GEMM)])
def test_gptqmodel_marlin_label_on_gptq_and_awq_tensors(name: str, layout: FORMAT, tmp_path: Path) -> None:
    """GPTQModel 7.7 reads ``format: marlin`` with its GPTQ-layout holder (qweight, qzeros v1, scales, g_idx) or,
    for ``quant_method: awq``, its AWQ Marlin holder over the gemm tensors."""
    src = FIXTURES / name
    root = tmp_path / "labelled"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("reference"))
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"] = {**cfg["quantization_config"], "format": "marlin", "checkpoint_format": "marlin"}
    (root / "config.json").write_text(json.dumps(cfg))
    for extra in ("quantize_config.json", "quant_config.json"):
        if (root / extra).exists():
            q = json.loads((root / extra).read_text())
            (root / extra).write_text(json.dumps({**q, "format": "marlin", "checkpoint_format": "marlin"}))
    plan, orig = plan_checkpoint(root), plan_checkpoint(src)
    assert plan.config.checkpoint_format is FORMAT.MARLIN and set(plan.modules) == set(orig.modules)
    for module, mp in plan.modules.items():
        assert mp.scheme == orig.modules[module].scheme and mp.scheme.format is layout
    assert len(load_checkpoint(root)) == len(orig.modules)


def test_what_marlin_cannot_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConversionError) as err:
        convert_checkpoint(FIXTURES / "gptq_4bit_g32_desc_act", tmp_path / "m", "marlin")
    assert "act-order" in str(err.value) and "in_features % 128" in str(err.value) and not (tmp_path / "m").exists()
    with pytest.raises(ConversionError, match=r"symmetric \(every zero point 8, none stored\); found \d+ at"):
        convert_checkpoint(FIXTURES / "gptq_v2_4bit_g32_asym_sharded", tmp_path / "m", "marlin")
