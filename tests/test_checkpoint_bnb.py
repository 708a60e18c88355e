"""bitsandbytes checkpoints written by transformers + bitsandbytes themselves (tests/fixtures/bnb_*, made by
make_bnb_fixtures.py with bitsandbytes 0.50.2 / transformers 5.24): every module dequantizes bit for bit as
bitsandbytes does, whole models reproduce the tool's logits, inspect says how each module runs, a same-format copy
is byte for byte and conversions to other formats are refused with the reason."""

from __future__ import annotations

import filecmp
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qlinear.checkpoint import CheckpointError, convert_checkpoint, inspect_checkpoint, load_checkpoint, plan_checkpoint
from qlinear.convert import ConversionError

FIXTURES = Path(__file__).parent / "fixtures"
ALL = sorted(p.name for p in FIXTURES.glob("bnb_*") if p.is_dir())
TORCH = "bitsandbytes_torch"


def reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / name / "reference" / "tool_outputs.safetensors"))


def test_fixture_set_is_complete() -> None:
    assert ALL == ["bnb_fp4", "bnb_fp4_dq", "bnb_int8", "bnb_nf4", "bnb_nf4_dq", "bnb_nf4_dq_b128"]


@pytest.mark.parametrize("name", ALL)
def test_every_module_dequantizes_as_bitsandbytes_does(name: str) -> None:
    ref = reference(name)
    layers = load_checkpoint(FIXTURES / name, dtype=torch.float32, backend=TORCH)
    assert set(layers) == {k.removesuffix(".weight") for k in ref if k.endswith(".weight")}
    for module, layer in layers.items():
        want = ref[f"{module}.weight"]
        got = layer.dequantize(want.dtype)
        assert got.dtype == want.dtype and torch.equal(got, want), f"{name} {module}"


@pytest.mark.parametrize("name", ALL)
def test_layers_compute_the_dequantized_product(name: str) -> None:
    layers = load_checkpoint(FIXTURES / name, dtype=torch.float32, backend=TORCH)
    g = torch.Generator().manual_seed(0)
    for module, layer in layers.items():
        x = torch.randn(3, layer.in_features, generator=g)
        want = x.double() @ layer.dequantize(torch.float64).t()
        assert float((layer(x).double() - want).norm() / want.norm()) < 1e-6, f"{name} {module}"


def test_schemes_read_from_the_configs_and_blobs() -> None:
    def scheme(name: str, module: str = "model.layers.0.mlp.down_proj"):
        return plan_checkpoint(FIXTURES / name).modules[module].scheme

    s = scheme("bnb_nf4_dq")
    assert (s.bits, s.bnb_type, s.blocksize, s.double_quant, s.in_features, s.out_features) == (4, "nf4", 64, True,
                                                                                               320, 64)
    assert (scheme("bnb_fp4").bnb_type, scheme("bnb_fp4").double_quant) == ("fp4", False)
    assert scheme("bnb_nf4_dq_b128").blocksize == 128
    q = plan_checkpoint(FIXTURES / "bnb_int8").modules["model.layers.0.self_attn.q_proj"].scheme
    assert (q.bits, q.bnb_type, q.blocksize) == (8, "int8", None)
    plan = plan_checkpoint(FIXTURES / "bnb_int8")
    assert "model.layers.0.mlp.down_proj" not in plan.modules  # llm_int8_skip_modules: a plain bfloat16 weight
    assert "model.layers.0.mlp.down_proj.weight" in plan.other
    assert not any(".weight." in k or k.endswith(("SCB", "weight_format")) for k in plan.other)
    assert "lm_head.weight" in plan_checkpoint(FIXTURES / "bnb_nf4_dq").other  # the head stays float


def test_inspect_says_how_each_module_runs() -> None:
    rows = {r["module"]: r for r in inspect_checkpoint(FIXTURES / "bnb_int8", dtype=torch.bfloat16)["modules"]}
    q = rows["model.layers.0.self_attn.q_proj"]
    assert (q["format"], q["bits"], q["backend"]) == ("bitsandbytes", 8, TORCH)
    assert "passed over bitsandbytes (quantizes the activations to int8" in q["why"]
    row = inspect_checkpoint(FIXTURES / "bnb_nf4_dq_b128", dtype=torch.float32, backend=TORCH)["modules"][0]
    assert (row["format"], row["bits"], row["backend"], row["in_features"]) == ("bitsandbytes", 4, TORCH, 256)


def test_cli_inspect(capsys: pytest.CaptureFixture[str]) -> None:
    from qlinear.cli import main

    assert main(["inspect", str(FIXTURES / "bnb_fp4_dq"), "--backend", TORCH]) == 0
    out = capsys.readouterr().out
    assert "7 quantized modules" in out and out.count(TORCH) >= 7


@pytest.mark.parametrize("name", ["bnb_nf4_dq", "bnb_int8", "bnb_fp4"])
def test_same_format_copy_is_byte_for_byte(name: str, tmp_path: Path) -> None:
    out = convert_checkpoint(FIXTURES / name, tmp_path / "copy", "bitsandbytes")
    assert filecmp.cmp(FIXTURES / name / "model.safetensors", out / "model.safetensors", shallow=False)
    assert json.loads((out / "config.json").read_text()) == json.loads((FIXTURES / name / "config.json").read_text())
    assert not (out / "quantize_config.json").exists()  # transformers keeps the config in config.json only


def test_saving_a_loaded_model_writes_a_bitsandbytes_checkpoint(tmp_path: Path) -> None:
    from qlinear.checkpoint.save import save_checkpoint
    from qlinear.hf_model import from_pretrained

    pytest.importorskip("transformers")
    model = from_pretrained(FIXTURES / "bnb_fp4_dq", dtype=torch.float32, backend=TORCH)
    out = save_checkpoint(model, tmp_path / "saved", "bitsandbytes")
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (quant["quant_method"], quant["load_in_4bit"], quant["bnb_4bit_quant_type"],
            quant["bnb_4bit_use_double_quant"]) == ("bitsandbytes", True, "fp4", True)
    original, again = load_file(str(FIXTURES / "bnb_fp4_dq" / "model.safetensors")), load_file(
        str(out / "model.safetensors"))
    assert set(again) - set(original) == {"lm_head.weight"}  # the model's tied head, written out by its state dict
    quantized = [k for k in original if ".weight." in k or k.endswith("_proj.weight")]
    assert quantized and all(torch.equal(original[k], again[k]) for k in quantized)


@pytest.mark.parametrize(("name", "to", "why"), [
    ("bnb_nf4", "gptq_v2", r"nf4 blocksize 64 codes index a 16-value look-up table .*\(non-affine\)"),
    ("bnb_fp4_dq", "gemm", "fp4 blocksize 64, double-quantized absmax codes index a 16-value look-up table"),
    ("bnb_nf4", "nvfp4-pack-quantized", "non-affine"),
    ("bnb_int8", "int-quantized", r"LLM.int8 values are \(q \* SCB\) \* float32\(1/127\), two float32 roundings"),
    ("gptq_4bit_g32", "bitsandbytes", "writing them there would mean quantizing again"),
])
def test_conversions_are_refused_with_the_reason(name: str, to: str, why: str, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=why):
        convert_checkpoint(FIXTURES / name, tmp_path / "out", to)
    assert list(tmp_path.iterdir()) == []


#: |logits - tool's logits| / |tool's logits|. float32 layers multiply exactly the weight bitsandbytes' own
#: matmul_4bit multiplies float32 activations by (``logits_dequant``: the same model in float32 on bitsandbytes'
#: float32 dequantization): measured 0 for every fixture; the bound allows summation order only. bitsandbytes' own
#: forward (``logits``) runs in the checkpoint's dtype (bfloat16 / float16 activations; 8-bit: LLM.int8 with int8
#: activations): measured 2.5e-3 .. 6.5e-3 from the exact logits.
@pytest.mark.parametrize("name", ALL)
def test_from_pretrained_matches_the_tools_logits(name: str) -> None:
    from qlinear.hf_model import from_pretrained, served_layers

    pytest.importorskip("transformers")
    ref = reference(name)
    model = from_pretrained(FIXTURES / name, dtype=torch.float32, backend=TORCH)
    assert set(served_layers(model)) == {k.removesuffix(".weight") for k in ref if k.endswith(".weight")}
    with torch.no_grad():
        logits = model(ref["input_ids"]).logits.float()
    exact = ref["logits_dequant"]
    assert float((logits - exact).norm() / exact.norm()) < 1e-5
    assert float((logits - ref["logits"]).norm() / ref["logits"].norm()) < 1e-2
    bf16 = from_pretrained(FIXTURES / name, dtype=torch.bfloat16, backend=TORCH)
    with torch.no_grad():
        low = bf16(ref["input_ids"]).logits.float()
    assert float((low - ref["logits"]).norm() / ref["logits"].norm()) < 2e-2


def _copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def _edit(path: Path, **changes: torch.Tensor | None) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    for key, value in changes.items():
        if value is None:
            del tensors[key]
        else:
            tensors[key] = value
    save_file(tensors, str(path / "model.safetensors"))


def test_bad_checkpoints_name_module_and_tensor(tmp_path: Path) -> None:
    path = _copy("bnb_nf4_dq", tmp_path)
    up, gate = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.gate_proj.weight"
    tensors = load_file(str(path / "model.safetensors"))
    _edit(path, **{f"{up}.absmax": tensors[f"{up}.absmax"][:-1].clone(), f"{gate}.nested_quant_map": None})
    with pytest.raises(CheckpointError) as err:
        plan_checkpoint(path)
    msg = str(err.value)
    assert f"{up}.absmax: found shape [319]" in msg and "the config says shape [320] dtype torch.uint8" in msg
    assert f"{gate}.nested_quant_map: missing" in msg
    path = _copy("bnb_nf4", tmp_path / "b")
    blob = "model.layers.0.self_attn.q_proj.weight.quant_state.bitsandbytes__nf4"
    _edit(path, **{blob: torch.tensor(list(b'{"quant_type": "nf4"'), dtype=torch.uint8)})
    with pytest.raises(CheckpointError, match=rf"{blob}: not a JSON object"):
        plan_checkpoint(path)


def test_configs_that_disagree_with_the_tensors(tmp_path: Path) -> None:
    def with_config(name: str, sub: str, **quant: object) -> Path:
        path = _copy(name, tmp_path / sub)
        cfg = json.loads((path / "config.json").read_text())
        cfg["quantization_config"].update(quant)
        (path / "config.json").write_text(json.dumps(cfg))
        return path

    with pytest.raises(CheckpointError, match=r"q_proj.weight.quant_state.bitsandbytes__nf4: nf4 blocksize 64, "
                                              r"double-quantized .* says bnb_4bit_quant_type 'nf4', "
                                              r"bnb_4bit_use_double_quant False"):
        plan_checkpoint(with_config("bnb_nf4_dq", "a", bnb_4bit_use_double_quant=False))
    with pytest.raises(CheckpointError, match="holds a 4-bit .quant_state. bitsandbytes module, but the config says "
                                              "load_in_8bit"):
        plan_checkpoint(with_config("bnb_nf4", "b", load_in_4bit=False, load_in_8bit=True))
    with pytest.raises(CheckpointError, match="up_proj: holds bitsandbytes tensors but llm_int8_skip_modules entry "
                                              "'mlp.up_proj'"):
        plan_checkpoint(with_config("bnb_int8", "c", llm_int8_skip_modules=["mlp.up_proj"]))
    with pytest.raises(CheckpointError, match="bnb_4bit_quant_storage 'bfloat16'"):
        plan_checkpoint(with_config("bnb_fp4", "d", bnb_4bit_quant_storage="bfloat16"))


def test_nan_absmax_and_tiled_int8_are_refused_at_load(tmp_path: Path) -> None:
    path = _copy("bnb_fp4", tmp_path)
    key = "model.layers.0.self_attn.k_proj.weight.absmax"
    absmax = load_file(str(path / "model.safetensors"))[key].clone()
    absmax[4] = float("nan")
    _edit(path, **{key: absmax})
    with pytest.raises(CheckpointError, match=r"k_proj: .*absmax: every block absmax must be finite; found nan at "
                                              r"index 4"):
        load_checkpoint(path, backend=TORCH)
    path = _copy("bnb_int8", tmp_path / "b")
    _edit(path, **{"model.layers.0.mlp.up_proj.weight_format": torch.tensor(1, dtype=torch.uint8)})
    with pytest.raises(CheckpointError, match="up_proj: .*weight_format: 1 .* only 0, row-major, is read"):
        load_checkpoint(path, backend=TORCH)
