"""Real checkpoints made by GPTQModel 7.7.0 (tests/fixtures, see make_fixtures.py): load, inspect, convert, save.

The oracle is the tool itself: each fixture carries GPTQModel's own dequantized weights and forward
outputs; the float64 reference below is plain matrix algebra on those weights. Tensors are read
back with the ``safetensors`` package, never with qlinear's reader.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qlinear.checkpoint import load_checkpoint, plan_checkpoint
from qlinear.checkpoint import save as save_mod
from qlinear.checkpoint.inspect import inspect_checkpoint
from qlinear.checkpoint.save import convert_checkpoint, save_checkpoint
from qlinear.convert import ConversionError
from qlinear.kernels.base import QuantLinear

FIXTURES = Path(__file__).parent / "fixtures"
NAMES = ["gptq_4bit_g32", "gptq_v2_4bit_g32_asym_sharded", "gptq_4bit_g32_desc_act", "gptq_8bit_g32_asym",
         "gptq_4bit_g32_asym_zero0", "awq_gemm_4bit_g32", "autogptq_v1"]
ZERO0 = ["model.layers.0.mlp.up_proj", "model.layers.0.self_attn.q_proj"]  # rows with a true zero point of 0
EXPECT = {  # name -> (format, bits, sym, desc_act)
    "gptq_4bit_g32": ("gptq", 4, True, False), "gptq_v2_4bit_g32_asym_sharded": ("gptq_v2", 4, False, False),
    "gptq_4bit_g32_desc_act": ("gptq", 4, True, True), "gptq_8bit_g32_asym": ("gptq", 8, False, False),
    "awq_gemm_4bit_g32": ("gemm", 4, False, False), "autogptq_v1": ("gptq", 4, True, False),
    "gptq_4bit_g32_asym_zero0": ("gptq", 4, False, False),
}
pytestmark = pytest.mark.filterwarnings("ignore:.*word-wide borrow:UserWarning")


def tool_outputs(name: str) -> dict[str, dict[str, torch.Tensor]]:
    """GPTQModel's dequantized weight, input and forward output per module: {module: {weight, x, y}}."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in load_file(FIXTURES / name / "reference" / "tool_outputs.safetensors").items():
        module, _, leaf = key.rpartition(".")
        out.setdefault(module, {})[leaf] = t
    return out


def dequantized(layers: dict[str, QuantLinear]) -> dict[str, torch.Tensor]:
    return {n: layer.dequantize(torch.float32) for n, layer in layers.items()}


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_equals_the_tools_own(name: str) -> None:
    layers = load_checkpoint(FIXTURES / name)
    ref = tool_outputs(name)
    assert sorted(layers) == sorted(ref) and len(layers) == 14
    for module, layer in layers.items():
        w = layer.dequantize(torch.float32)
        # GPTQModel dequantizes in float16 (one rounding of s * (q - z)); ours is exact in float32.
        assert torch.equal(w.to(torch.float16), ref[module]["weight"]), module
        assert (w - ref[module]["weight"].float()).abs().max() <= 2.0**-11 * w.abs().max()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_forward_matches_float64_reference_and_the_tool(name: str, dtype: torch.dtype) -> None:
    layers = load_checkpoint(FIXTURES / name, dtype=dtype)
    for module, r in tool_outputs(name).items():
        x = r["x"].to(dtype)
        y64 = x.double() @ r["weight"].double().t()
        y = layers[module](x)
        assert y.dtype == dtype and y.shape == y64.shape
        tol = 1e-2 * float(y64.abs().max())  # bfloat16-compute CPU kernels (int4pack) round activations to 8 bits
        torch.testing.assert_close(y.double(), y64, rtol=0, atol=tol, msg=module)
        torch.testing.assert_close(y.double(), r["y"].double(), rtol=0, atol=tol, msg=module)


def test_v1_zero_points_of_0_read_as_gptqmodel_reads_them(tmp_path: Path) -> None:
    """GPTQModel writes z=0 in v1 by a word-wide subtract that borrows from the next field (0x...5F: field 0
    is F, field 1 one less than it should be); a per-field reader gets field 1 wrong, GPTQModel does not."""
    path = FIXTURES / "gptq_4bit_g32_asym_zero0"
    words = load_file(path / "model.safetensors")[f"{ZERO0[0]}.qzeros"]
    assert bool(((words & 0xF) == 0xF).any())
    layers = load_checkpoint(path, backend="gptq_torch")
    assert {m.scheme.format.value for m in layers.values()} == {"gptq"}  # buffers kept exactly as stored
    ref = tool_outputs("gptq_4bit_g32_asym_zero0")
    assert all(torch.equal(m.dequantize().half(), ref[n]["weight"]) for n, m in layers.items())
    with pytest.raises(ConversionError, match=r"2 of 14 quantized modules") as err:  # v1 cannot hold z=0 safely
        convert_checkpoint(path, tmp_path / "v1", "gptq")
    assert all(f"  {n}: " in str(err.value) for n in ZERO0) and "write checkpoint_format='gptq_v2'" in str(err.value)
    back = load_checkpoint(convert_checkpoint(path, tmp_path / "v2", "gptq_v2"))
    assert all(torch.equal(m.dequantize().half(), ref[n]["weight"]) for n, m in back.items())


def test_plan_reads_structure_from_headers() -> None:
    plan = plan_checkpoint(FIXTURES / "gptq_v2_4bit_g32_asym_sharded")
    assert [f.name for f in plan.files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    k = plan.modules["model.layers.1.self_attn.k_proj"].scheme
    assert (k.in_features, k.out_features, k.group_size, k.sym, k.format.value) == (64, 32, 32, False, "gptq_v2")
    assert "model.embed_tokens.weight" in plan.other and "lm_head.weight" in plan.other
    auto = plan_checkpoint(FIXTURES / "autogptq_v1")
    assert auto.config_source == "quantize_config.json" and auto.files[0].name == "gptq_model-4bit-32g.safetensors"


def test_single_file_and_partial_directories(tmp_path: Path) -> None:
    single = load_checkpoint(FIXTURES / "gptq_4bit_g32" / "model.safetensors")
    assert len(single) == 14
    tensors = load_file(FIXTURES / "awq_gemm_4bit_g32" / "model.safetensors")
    part = {k: v for k, v in tensors.items() if k.startswith("model.layers.1.mlp.")}
    from safetensors.torch import save_file

    save_file(part, tmp_path / "model.safetensors")
    shutil.copy(FIXTURES / "awq_gemm_4bit_g32" / "config.json", tmp_path)
    layers = load_checkpoint(tmp_path)
    assert sorted(layers) == [f"model.layers.1.mlp.{p}" for p in ("down_proj", "gate_proj", "up_proj")]
    ref = tool_outputs("awq_gemm_4bit_g32")
    for n, layer in layers.items():
        assert torch.equal(layer.dequantize().to(torch.float16), ref[n]["weight"])


@pytest.mark.parametrize("name", NAMES)
def test_inspect_reports_every_module(name: str) -> None:
    report = inspect_checkpoint(FIXTURES / name)
    fmt, bits, sym, desc_act = EXPECT[name]
    mods = {m["module"]: m for m in report["modules"]}
    assert len(mods) == 14 and report["other_tensors"] == 7
    for m in mods.values():
        assert (m["format"], m["bits"], m["group_size"], m["sym"], m["desc_act"]) == (fmt, bits, 32, sym, desc_act)
        assert m["backend"] and m["kernel"] and m["why"].startswith("highest AUTO priority")
    assert (mods["model.layers.0.mlp.down_proj"]["out_features"], mods["model.layers.0.mlp.down_proj"]["in_features"]) \
        == (64, 128)
    layers = load_checkpoint(FIXTURES / name)
    assert {n: type(m).__name__ for n, m in layers.items()} == {n: m["kernel"] for n, m in mods.items()}


def test_convert_round_trip_is_lossless(tmp_path: Path) -> None:
    src = FIXTURES / "gptq_4bit_g32"
    original = dequantized(load_checkpoint(src))
    chain = [("gptq_v2", "v2"), ("gemm", "gemm"), ("gptq_v2", "v2b"), ("gptq", "v1")]
    prev = src
    for fmt, name in chain:
        dst = convert_checkpoint(prev, tmp_path / name, fmt)
        q = json.loads((dst / "quantize_config.json").read_text())
        assert q["checkpoint_format"] == fmt and q["quant_method"] == ("awq" if fmt == "gemm" else "gptq")
        assert json.loads((dst / "config.json").read_text())["quantization_config"] == q
        assert (dst / "tokenizer.json").is_file()
        back = dequantized(load_checkpoint(dst))
        assert all(torch.equal(original[n], back[n]) for n in original), fmt
        prev = dst
    a, b = load_file(src / "model.safetensors"), load_file(tmp_path / "v1" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-exact back in v1
    v2 = load_file(tmp_path / "v2" / "model.safetensors")
    z1, z2 = a["model.layers.0.mlp.up_proj.qzeros"], v2["model.layers.0.mlp.up_proj.qzeros"]
    assert bool((z1 == 0x77777777).all()) and bool((z2 == -0x77777778).all())  # sym 4-bit: v1 7s, v2 8s


def test_convert_refusal_lists_every_module_and_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConversionError) as err:
        convert_checkpoint(FIXTURES / "gptq_4bit_g32_desc_act", tmp_path / "out", "gemm")
    msg = str(err.value)
    assert "14 of 14 quantized modules" in msg and "nothing was written" in msg
    for module in tool_outputs("gptq_4bit_g32_desc_act"):
        assert f"  {module}: " in msg
    assert "act-order" in msg and not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_save_refusal_lists_only_the_modules_that_cannot(tmp_path: Path) -> None:
    plain = load_checkpoint(FIXTURES / "gptq_4bit_g32")
    act = load_checkpoint(FIXTURES / "gptq_4bit_g32_desc_act")
    mixed = {**{f"a.{n}": m for n, m in plain.items()}, "b.one": act["model.layers.0.mlp.up_proj"],
             "b.two": act["model.layers.1.self_attn.q_proj"]}
    with pytest.raises(ConversionError, match=r"2 of 16 quantized modules") as err:
        save_checkpoint(mixed, tmp_path / "out", "gemv")
    assert "  b.one: " in str(err.value) and "  b.two: " in str(err.value) and "a.model" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_save_mixed_schemes_writes_dynamic_rules(tmp_path: Path) -> None:
    four = load_checkpoint(FIXTURES / "gptq_4bit_g32")
    eight = load_checkpoint(FIXTURES / "gptq_8bit_g32_asym")
    layers = {**four, "model.layers.1.mlp.down_proj": eight["model.layers.1.mlp.down_proj"]}
    out = save_checkpoint(layers, tmp_path / "mixed", "gptq_v2", max_shard_size="20KB")
    q = json.loads((out / "quantize_config.json").read_text())
    assert (q["bits"], q["group_size"], q["sym"], q["desc_act"], q["pack_dtype"]) == (4, 32, True, False, "int32")
    assert q["dynamic"] == {r"+:^model\.layers\.1\.mlp\.down_proj$": {"bits": 8, "group_size": 32, "sym": False,
                                                                      "desc_act": False}}
    assert (out / "model.safetensors.index.json").is_file() and not (out / "config.json").exists()
    back = load_checkpoint(out)
    assert back["model.layers.1.mlp.down_proj"].scheme.bits == 8 and back["model.layers.0.mlp.up_proj"].scheme.bits == 4
    for n, layer in layers.items():
        assert torch.equal(layer.dequantize(), back[n].dequantize()), n


def test_save_a_model_keeps_its_other_tensors(tmp_path: Path) -> None:
    layers = load_checkpoint(FIXTURES / "awq_gemm_4bit_g32")
    model = torch.nn.Module()
    model.proj = layers["model.layers.0.mlp.up_proj"]
    model.head = torch.nn.Linear(4, 3)
    out = save_checkpoint(model, tmp_path / "m", "gemm", config={"model_type": "toy"})
    saved = load_file(out / "model.safetensors")
    assert sorted(saved) == ["head.bias", "head.weight", "proj.qweight", "proj.qzeros", "proj.scales"]
    assert torch.equal(saved["head.weight"], model.head.weight.detach())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "toy" and cfg["quantization_config"]["zero_point"] is True
    assert cfg["quantization_config"]["version"] == "gemm" and "sym" not in cfg["quantization_config"]
    assert torch.equal(load_checkpoint(out)["proj"].dequantize(), model.proj.dequantize())


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    layers = load_checkpoint(FIXTURES / "gptq_4bit_g32")
    dst = tmp_path / "out"
    with pytest.raises(FileExistsError):
        save_checkpoint(layers, tmp_path, "gptq")
    calls = []
    real = save_mod.write_file

    def failing(path: Path, tensors: dict, metadata: dict | None = None) -> int:
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full (forced)")
        return real(path, tensors, metadata)

    monkeypatch.setattr(save_mod, "write_file", failing)
    with pytest.raises(OSError, match="forced"):
        save_checkpoint(layers, dst, "gptq", max_shard_size="16KB")
    assert len(calls) == 2 and not dst.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(save_mod, "write_file", real)
    save_checkpoint(layers, dst, "gptq")
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    monkeypatch.setattr(save_mod, "write_file", failing)
    calls.clear()
    with pytest.raises(OSError, match="forced"):
        save_checkpoint(layers, dst, "gptq_v2", max_shard_size="16KB", overwrite=True)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before and os.listdir(tmp_path) == ["out"]
    monkeypatch.setattr(save_mod, "write_file", real)
    save_checkpoint(layers, dst, "gptq_v2", overwrite=True)
    assert json.loads((dst / "quantize_config.json").read_text())["checkpoint_format"] == "gptq_v2"
    assert os.listdir(tmp_path) == ["out"]


REF_PYTHON = Path(__file__).resolve().parents[1] / ".venv-ref" / "bin" / "python"
READ_BACK = """
import sys, torch
from gptqmodel import BACKEND, GPTQModel
from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
from safetensors.torch import save_file
m = GPTQModel.load(sys.argv[1], backend=BACKEND(sys.argv[3]), device="cpu", dtype=torch.float16)
def weight(mod):
    if sys.argv[3] == "awq_torch":
        return dequantize_gemm(mod.qweight, mod.qzeros, mod.scales, mod.bits, mod.group_size)
    return mod.dequantize_weight()
save_file({n: weight(mod).t().contiguous() for n, mod in m.model.named_modules() if hasattr(mod, "qweight")},
          sys.argv[2])
"""


@pytest.mark.external
@pytest.mark.slow
@pytest.mark.skipif(not REF_PYTHON.exists(), reason="GPTQModel reference venv (.venv-ref) not installed")
@pytest.mark.parametrize(("src", "fmt", "backend"), [("gptq_v2_4bit_g32_asym_sharded", "gptq", "gptq_torch"),
                                                     ("gptq_4bit_g32_asym_zero0", "gptq_v2", "gptq_torch"),
                                                     ("awq_gemm_4bit_g32", "gptq_v2", "gptq_torch"),
                                                     ("gptq_4bit_g32", "gemm", "awq_torch")])
def test_gptqmodel_reads_what_qlinear_writes(tmp_path: Path, src: str, fmt: str, backend: str) -> None:
    dst = convert_checkpoint(FIXTURES / src, tmp_path / "ckpt", fmt)
    env = {**os.environ, "GPTQMODEL_CPU_WORKERS": "2", "OMP_NUM_THREADS": "1"}
    subprocess.run([str(REF_PYTHON), "-c", READ_BACK, str(dst), str(tmp_path / "w.safetensors"), backend],
                   check=True, env=env, capture_output=True, timeout=300, cwd=tmp_path)  # its logs/ go there
    ref = tool_outputs(src)
    got = load_file(tmp_path / "w.safetensors")
    assert sorted(got) == sorted(ref)
    assert all(torch.equal(got[n], ref[n]["weight"]) for n in ref)
