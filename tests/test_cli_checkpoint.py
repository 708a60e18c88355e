"""`qlinear inspect` and `qlinear convert` on the GPTQModel-made fixtures (tests/fixtures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from qlinear.checkpoint import load_checkpoint
from qlinear.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_table(capsys) -> None:
    code, out, err = run(capsys, "inspect", str(FIXTURES / "gptq_v2_4bit_g32_asym_sharded"))
    lines = out.splitlines()
    assert code == 0 and not err
    assert lines[0].endswith("14 quantized modules, 7 other tensors (config: quantize_config.json; files: "
                             "model-00001-of-00003.safetensors, model-00002-of-00003.safetensors, "
                             "model-00003-of-00003.safetensors)")
    assert lines[1] == "kernels chosen for float16 activations on cpu on linux"
    assert lines[2].split() == ["module", "format", "bits", "group", "flags", "[out,", "in]", "backend", "why"]
    down = next(x for x in lines if x.startswith("model.layers.0.mlp.down_proj "))
    assert down.split()[1:7] == ["gptq_v2", "4", "32", "asym", "[64,", "128]"]
    assert "highest AUTO priority" in down and len(lines) == 3 + 14


def test_inspect_json_names_the_kernel_load_builds(capsys) -> None:
    path = FIXTURES / "gptq_4bit_g32_desc_act"
    code, out, _ = run(capsys, "inspect", str(path), "--json", "--dtype", "bf16")
    report = json.loads(out)
    assert code == 0 and report["dtype"] == "bfloat16" and len(report["modules"]) == 14
    m = report["modules"][0]
    assert {k: m[k] for k in ("module", "format", "bits", "group_size", "desc_act", "in_features", "out_features")} \
        == {"module": "model.layers.0.mlp.down_proj", "format": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
            "in_features": 128, "out_features": 64}
    layers = load_checkpoint(path, dtype=torch.bfloat16)
    assert all(type(layers[r["module"]]).__name__ == r["kernel"] for r in report["modules"])


def test_inspect_with_a_backend_that_cannot_run(capsys) -> None:
    code, out, _ = run(capsys, "inspect", str(FIXTURES / "gptq_4bit_g32"), "--backend", "gptq_marlin")
    assert code == 1 and "none" in out.splitlines()[3] and "device cpu not supported (declares cuda)" in out


def test_inspect_errors(capsys, tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    code, _, err = run(capsys, "inspect", str(tmp_path))
    assert code == 2 and err.startswith("qlinear: error: ") and "header length field says 16 bytes" in err
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    code, _, err = run(capsys, "inspect", str(tmp_path))
    assert code == 2 and "pytorch_model.bin: refused" in err


def test_convert_round_trip(capsys, tmp_path: Path) -> None:
    src = FIXTURES / "awq_gemm_4bit_g32"
    code, out, _ = run(capsys, "convert", str(src), str(tmp_path / "v2"), "--format", "gptq_v2")
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'v2'} as gptq_v2 (every module re-read and compared: " \
                                        "lossless)"
    code, _, _ = run(capsys, "convert", str(tmp_path / "v2"), str(tmp_path / "gemm"), "--format", "gemm",
                     "--max-shard-size", "40KB")
    assert code == 0 and (tmp_path / "gemm" / "model.safetensors.index.json").is_file()
    a, b = load_file(src / "model.safetensors"), {}
    for f in sorted((tmp_path / "gemm").glob("*.safetensors")):
        b.update(load_file(f))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-exact back in AWQ GEMM
    q = json.loads((tmp_path / "gemm" / "quantize_config.json").read_text())
    assert q["meta"]["quantizer"] == ["gptqmodel:7.7.0", "qlinear:0.1.0"]


def test_convert_refusal_and_existing_destination(capsys, tmp_path: Path) -> None:
    src = str(FIXTURES / "gptq_4bit_g32_desc_act")
    code, out, err = run(capsys, "convert", src, str(tmp_path / "out"), "--format", "gemv")
    assert code == 2 and not out and "cannot write gemv: 14 of 14 quantized modules" in err
    assert err.count("act-order") == 14 and not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    code, _, err = run(capsys, "convert", src, str(tmp_path / "out"), "--format", "gptq_v2")
    assert code == 2 and "already exists; pass overwrite=True (--overwrite)" in err
    code, _, _ = run(capsys, "convert", src, str(tmp_path / "out"), "--format", "gptq_v2", "--overwrite")
    assert code == 0 and json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"][
        "checkpoint_format"] == "gptq_v2"


def test_entry_point_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "qlinear.cli", "inspect", str(FIXTURES / "autogptq_v1"), "--json"],
                         capture_output=True, text=True, check=True)
    assert len(json.loads(out.stdout)["modules"]) == 14
