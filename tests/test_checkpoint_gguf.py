"""``load_checkpoint`` and ``inspect`` on GGUF files written by gguf-py (the oracle is gguf-py's own dequantizer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="pip install --no-deps -r requirements/nodeps-gguf.txt")
from qlinear.checkpoint import CheckpointError, load_checkpoint  # noqa: E402
from qlinear.checkpoint.inspect import inspect_checkpoint  # noqa: E402

Q = gguf.GGMLQuantizationType


def write(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", rng.standard_normal((64, 256)).astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", rng.standard_normal(256).astype(np.float32))
    for name, shape, qtype in (("blk.0.attn_q", (48, 256), Q.Q4_0), ("blk.0.ffn_down", (40, 96), Q.Q8_0)):
        w.add_tensor(f"{name}.weight", gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), qtype),
                     raw_dtype=qtype)
    w.add_tensor("blk.0.attn_q.bias", rng.standard_normal(48).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_layers_decode_as_gguf_py_does(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf")
    layers = load_checkpoint(path)
    assert sorted(layers) == ["blk.0.attn_q", "blk.0.ffn_down"]  # float tensors are not quantized modules
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        name = t.name.removesuffix(".weight")
        if name in layers:
            ref = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).copy())
            assert torch.equal(layers[name].dequantize(torch.float32), ref), name
            x = torch.randn(3, ref.shape[1])
            y64 = x.double() @ ref.double().t()
            if name == "blk.0.attn_q":
                bias = next(b for b in reader.tensors if b.name == "blk.0.attn_q.bias")
                y64 += torch.from_numpy(bias.data.copy()).double()
            y = layers[name](x.half())
            torch.testing.assert_close(y.double(), y64, rtol=0, atol=1e-2 * float(y64.abs().max()))


def test_gguf_inspect_and_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "m.gguf")
    report = inspect_checkpoint(path)
    rows = {m["module"]: m for m in report["modules"]}
    assert rows["blk.0.attn_q"]["qtype"] == "Q4_0" and rows["blk.0.attn_q"]["bias"] is True
    assert rows["blk.0.ffn_down"]["qtype"] == "Q8_0" and rows["blk.0.ffn_down"]["backend"] == "gguf_torch"
    assert report["other_tensors"] == 2
    with pytest.raises(CheckpointError, match=r"^blk\.0\.attn_q: no kernel can run this layer"):
        load_checkpoint(path, backend="gguf_triton")
