"""Every checkpoint error names the file or module and the tensor, and says what was expected.

Broken checkpoints are made from the GPTQModel fixtures with the ``safetensors`` package (not
qlinear's writer), or by cutting bytes out of a real file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qlinear.checkpoint import CheckpointError, load_checkpoint, plan_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
UP = "model.layers.0.mlp.up_proj"


def broken(tmp_path: Path, name: str = "gptq_4bit_g32",
           tensors: Callable[[dict[str, torch.Tensor]], None] | None = None,
           config: Callable[[dict], None] | None = None) -> Path:
    """A copy of fixture ``name`` with its tensors and/or quantize_config.json edited in place."""
    out = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / name, out, ignore=shutil.ignore_patterns("reference"))
    if tensors is not None:
        t = load_file(out / "model.safetensors")
        tensors(t)
        save_file(t, out / "model.safetensors", metadata={"format": "pt"})
    if config is not None:
        q = json.loads((out / "quantize_config.json").read_text())
        config(q)
        (out / "quantize_config.json").write_text(json.dumps(q))
    return out


def error(path: Path, **kw: object) -> str:
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path, **kw)
    return str(err.value)


def test_missing_tensor(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, tensors=lambda t: t.pop(f"{UP}.qzeros")))
    assert f"{UP}.qzeros: missing (a gptq gptq module needs qweight, qzeros, scales, g_idx" in msg


def test_extra_tensor(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, tensors=lambda t: t.update({f"{UP}.weight": torch.zeros(128, 64)})))
    assert f"{UP}.weight: unexpected tensor in a quantized module" in msg


def test_every_bad_module_is_listed(tmp_path: Path) -> None:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t.pop(f"{UP}.g_idx")
        t.pop("model.layers.1.self_attn.v_proj.scales")

    msg = error(broken(tmp_path, tensors=edit))
    assert "2 quantized module(s) do not match the config" in msg
    assert f"{UP}.g_idx: missing" in msg and "model.layers.1.self_attn.v_proj.scales: missing" in msg


def test_bits_in_config_disagree_with_tensors(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, config=lambda q: q.update(bits=8)))
    assert (f"{UP}.qweight: found shape [8, 128] dtype torch.int32, but the config says shape [16, 128] dtype "
            "torch.int32 (gptq 8-bit group_size 32 pack_dtype int32 in_features 64 out_features 128, from "
            "quantize_config.json)") in msg


def test_dtype_mismatch(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, tensors=lambda t: t.update({f"{UP}.scales": t[f"{UP}.scales"].float()})))
    assert f"{UP}.scales: found shape [2, 128] dtype torch.float32, but the config says shape [2, 128] dtype " \
           "torch.float16" in msg
    msg = error(broken(tmp_path / "b", tensors=lambda t: t.update({f"{UP}.qweight": t[f"{UP}.qweight"].long()})))
    assert f"{UP}.qweight: found shape [8, 128] dtype torch.int64" in msg


def test_group_size_disagrees(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, config=lambda q: q.update(group_size=64)))
    assert f"{UP}.qzeros: found shape [2, 16]" in msg and "config says shape [1, 16]" in msg


def test_bias_that_does_not_fit(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, tensors=lambda t: t.update({f"{UP}.bias": torch.zeros(7)})))
    assert f"{UP}.bias: found shape [7] dtype torch.float32, expected a floating tensor of shape [128]" in msg
    msg = error(broken(tmp_path / "b", tensors=lambda t: t.update({f"{UP}.bias": torch.full((128,), 0.1)})))
    assert f"{UP}.bias: torch.float32 values are not exactly representable in torch.float16" in msg


def test_exact_bias_loads(tmp_path: Path) -> None:
    path = broken(tmp_path, tensors=lambda t: t.update({f"{UP}.bias": torch.full((128,), 0.25)}))
    layer = load_checkpoint(path)[UP]
    x = torch.zeros(1, 64, dtype=torch.float16)
    assert torch.equal(layer(x), torch.full((1, 128), 0.25, dtype=torch.float16))


def test_unknown_quant_method(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, config=lambda q: q.update(quant_method="fancyquant")))
    assert "quantize_config.json: unknown quant_method 'fancyquant'; qlinear knows gptq, awq" in msg


@pytest.mark.parametrize(("edit", "needle"), [
    ({"quant_method": "fp4"}, "unsupported format: quant_method 'fp4' checkpoints are not read yet"),
    ({"quant_method": "fp8"}, "quant_method fp8 without weight_scale_method/weight_scale_semantics (GPTQModel)"),
    ({"checkpoint_format": "qqq", "format": "qqq"}, "checkpoint_format 'qqq' is not a gptq format"),
    ({"checkpoint_format": "gemm", "format": "gemm"}, "checkpoint_format 'gemm' is not a gptq format"),
])
def test_unsupported_formats(tmp_path: Path, edit: dict, needle: str) -> None:
    assert needle in error(broken(tmp_path, config=lambda q: q.update(edit)))


def test_no_quantization_config(tmp_path: Path) -> None:
    path = broken(tmp_path)
    (path / "quantize_config.json").unlink()
    cfg = json.loads((path / "config.json").read_text())
    del cfg["quantization_config"]
    (path / "config.json").write_text(json.dumps(cfg))
    assert "no quantization config: neither quantize_config.json nor quant_config.json nor a quantization_config" \
        in error(path)


def test_dynamic_rules(tmp_path: Path) -> None:
    msg = error(broken(tmp_path, config=lambda q: q.update(dynamic={r"-:.*mlp\.up_proj": {}})))
    assert "model.layers.0.mlp.up_proj: holds quantized tensors but a '-:' dynamic rule" in msg
    msg = error(broken(tmp_path / "b", config=lambda q: q.update(dynamic={r"+:.*\.up_proj": {"bits": 8}})))
    assert f"{UP}.qweight: found shape [8, 128] dtype torch.int32, but the config says shape [16, 128]" in msg


def test_truncated_file(tmp_path: Path) -> None:
    path = broken(tmp_path)
    f = path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    assert "data_offsets" in (msg := error(path)) and "run past the end of the data" in msg and "truncated" in msg
    f.write_bytes(data[:200])
    assert f"{f}: corrupt safetensors header: the header length field says" in error(path)
    f.write_bytes(data[:5])
    assert "too short to hold the 8-byte header length" in error(path)


def test_bad_header_length(tmp_path: Path) -> None:
    path = broken(tmp_path)
    f = path / "model.safetensors"
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    f.write_bytes((n - 3).to_bytes(8, "little") + data[8:])
    assert f"{f}: corrupt safetensors header: the {n - 3}-byte header is not valid JSON" in error(path)
    f.write_bytes((1 << 40).to_bytes(8, "little") + data[8:])
    assert f"the header length field says {1 << 40} bytes" in error(path)


def test_header_entry_inconsistent(tmp_path: Path) -> None:
    path = broken(tmp_path)
    f = path / "model.safetensors"
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header[f"{UP}.scales"]["shape"] = [3, 128]
    text = json.dumps(header).encode()
    f.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])
    assert f"tensor '{UP}.scales': F16 shape [3, 128] needs 768 bytes but its data_offsets" in error(path)


def test_pickles_are_refused(tmp_path: Path) -> None:
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    (tmp_path / "config.json").write_text("{}")
    msg = error(tmp_path)
    assert "pytorch_model.bin: refused: .bin checkpoints are Python pickles" in msg and "arbitrary code" in msg
    (tmp_path / "x.pt").touch()
    assert "x.pt: refused: .pt checkpoints are Python pickles" in error(tmp_path / "x.pt")


def test_missing_shard_and_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    shutil.copytree(FIXTURES / "gptq_v2_4bit_g32_asym_sharded", path)
    (path / "model-00002-of-00003.safetensors").unlink()
    assert "shard model-00002-of-00003.safetensors is missing; it should hold" in error(path)
    assert "no such file or directory" in error(tmp_path / "nowhere")
    assert "no .safetensors files in this directory" in error(tmp_path / "ckpt" / "..")


def test_no_kernel_names_the_module() -> None:
    msg = error(FIXTURES / "gptq_4bit_g32", backend="gptq_swordfish")
    assert msg.startswith("model.layers.0.mlp.down_proj: no kernel can run this layer") and "not implemented" in msg


def test_gguf_cannot_be_converted(tmp_path: Path) -> None:
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match=r"m\.gguf: GGUF files load with load_checkpoint\(\) .* no conversion"):
        plan_checkpoint(tmp_path / "m.gguf")


def test_prepare_failure_names_the_module(tmp_path: Path) -> None:
    """All-zero g_idx is valid GPTQ (one group) but int4pack cannot group it; the error says which module."""
    path = broken(tmp_path, tensors=lambda t: t.update({f"{UP}.g_idx": torch.zeros(64, dtype=torch.int32)}))
    msg = error(path)
    assert msg.startswith(f"{UP}: TorchAtenLinear (gptq_torch_aten) cannot prepare this module: g_idx: group 0 holds")
    assert torch.equal(load_checkpoint(path, backend="gptq_torch")[UP].affine().g_idx, torch.zeros(64,
                                                                                                  dtype=torch.int32))


def test_plan_needs_no_tensor_data(tmp_path: Path) -> None:
    """inspect/plan read headers only: a data section of zeros plans the same (and loads as zeros)."""
    path = broken(tmp_path)
    f = path / "model.safetensors"
    data = f.read_bytes()
    start = 8 + int.from_bytes(data[:8], "little")
    f.write_bytes(data[:start] + bytes(len(data) - start))
    plan = plan_checkpoint(path)
    assert len(plan.modules) == 14 and plan.config.bits == 4
    assert not load_checkpoint(path, backend="gptq_torch")[UP].dequantize().any()
