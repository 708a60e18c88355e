"""EXL3 layout (``layouts/exl3.py``) against the plain-Python oracle (tests/oracle/exl3_oracle.py, written from the
format's facts) and against exllamav3 1.6.5's own pure-Python mul1 codebook (``ngram_codec.mul1_codebook``,
documented there as bit-exact with the CUDA ``decode_3inst<2>``); loaded by file path so the package's CUDA
extension is never imported. GPTQModel's decode is checked in tests/external/test_gptqmodel_exl3.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from qlinear.layouts import exl3
from qlinear.layouts.exl3 import Exl3LayoutError, Exl3Params
from tests.oracle import exl3_oracle

INSTALL = "pip install --no-deps -r requirements/nodeps-exl3.txt"


def random_trellis(kt: int, nt: int, bits: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << 15), 1 << 15, (kt, nt, 16 * bits), generator=g, dtype=torch.int32).to(torch.int16)


@pytest.mark.parametrize("cb", exl3.CODEBOOKS)
def test_codebook_table_matches_oracle(cb: str) -> None:
    table = exl3.codebook_table(cb)
    assert table.dtype == torch.float16 and table.shape == (65536,)
    for s in range(0, 65536, 7):  # every 7th state (the oracle is slow Python)
        assert table[s].item() == exl3_oracle.codebook(s, cb), s


def test_codebook_float32_steps_are_exact() -> None:
    """The docstring's claim: the float32 intermediate equals the float64 one for every state."""
    s = torch.arange(65536, dtype=torch.int64)
    x = ((s * 89226354 + 64248484) & 0xFFFFFFFF & 0x8FFF8FFF) ^ 0x3B603B60
    halves = [(v & 0xFFFF).to(torch.int32).to(torch.int16).view(torch.float16) for v in (x, x >> 16)]
    assert torch.equal((halves[0].float() + halves[1].float()).double(), halves[0].double() + halves[1].double())


def test_mul1_matches_exllamav3() -> None:
    spec = importlib.util.find_spec("exllamav3")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"exllamav3 is not installed: {INSTALL}")
    path = Path(spec.submodule_search_locations[0]) / "modules" / "quant" / "exl3_lib" / "ngram_codec.py"
    mod_spec = importlib.util.spec_from_file_location("exl3_ngram_codec", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    theirs = mod.mul1_codebook("cpu")
    assert torch.equal(exl3.codebook_table("mul1").view(torch.int16), theirs.view(torch.int16))
    assert exl3.MARKERS["mul1"] == mod.MUL1


def test_tile_position_is_the_fragment_order() -> None:
    """Transcribed from exllamav3's ``tensor_core_perm``: lane 0 holds positions 0, 16, 128, 144, 8, 24, 136, 152
    (row-major ``r * 16 + c``); lane 5 starts at row 2, column 1."""
    r, c = exl3.tile_position(torch.arange(256))
    flat = (r * 16 + c).tolist()
    assert flat[:8] == [0, 16, 128, 144, 8, 24, 136, 152]
    assert flat[40] == 2 * 16 + 1
    assert sorted(flat) == list(range(256))
    assert all(exl3_oracle.position(t) == (r[t].item(), c[t].item()) for t in range(256))
    assert torch.equal(exl3.stream_index().view(-1)[torch.tensor(flat)], torch.arange(256))


@pytest.mark.parametrize("bits", range(1, 9))
def test_states_match_oracle(bits: int) -> None:
    tr = random_trellis(2, 1, bits, seed=bits)
    ours = exl3.tile_states(tr, bits)
    for i in range(2):
        assert ours[i, 0].tolist() == exl3_oracle.states(tr[i, 0].tolist(), bits)


@pytest.mark.parametrize(("bits", "cb"), [(2, "3inst"), (4, "mcg"), (5, "mul1")])
def test_inner_and_dense_weight_match_oracle(bits: int, cb: str) -> None:
    k, n = 128, 256
    tr = random_trellis(k // 16, n // 16, bits, seed=10 + bits)
    g = torch.Generator().manual_seed(bits)
    suh, svh = (torch.randn(k, generator=g) * 0.03).half(), (torch.randn(n, generator=g) * 0.04).half()
    inner = exl3.inner_weight(tr, bits, exl3.codebook_table(cb))
    assert torch.equal(inner.double(), exl3_oracle.inner(tr, bits, cb))
    part = exl3.inner_weight(tr, bits, exl3.codebook_table(cb), 3, 9)
    assert torch.equal(part, inner[:, 48:144])
    tensors = {"trellis": tr, "suh": suh, "svh": svh}
    if cb != "3inst":
        tensors[cb] = exl3.marker_tensor(cb)
    w = exl3.dense_weight(tensors, Exl3Params(bits, cb))
    ref = exl3_oracle.weight(tr, bits, cb, suh, svh)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.double(), ref, rtol=1e-5, atol=1e-7)


def test_hadamard_and_signs() -> None:
    h = exl3.hadamard(dtype=torch.float64)
    assert torch.equal(h, exl3_oracle.hadamard())
    assert torch.equal(exl3.hadamard(), h.float())
    packed = torch.tensor([0, -1, 0x1234, -32768], dtype=torch.int16)
    assert torch.equal(exl3.unpack_signs(packed).double(), exl3_oracle.signs(packed))


def test_markers_are_the_producers_int32() -> None:
    assert exl3.marker_tensor("mcg").item() == 0xCBAC1FED - (1 << 32)
    assert exl3.marker_tensor("mul1").item() == 0x83DCD12D - (1 << 32)


def test_bad_input_is_named() -> None:
    with pytest.raises(Exl3LayoutError, match="bits"):
        Exl3Params(9)
    with pytest.raises(Exl3LayoutError, match="codebook"):
        Exl3Params(4, "2mad")
    assert exl3.shape_errors(192, 256) == ["in_features 192 is not a multiple of 128 (EXL3's Hadamard block)"]
    p = Exl3Params(2, "mcg")
    good = {"trellis": random_trellis(8, 8, 2, 0), "suh": torch.ones(128).half(), "svh": torch.ones(128).half(),
            "mcg": exl3.marker_tensor("mcg")}
    exl3.check_tensors(good, p, 128, 128)
    with pytest.raises(Exl3LayoutError, match=r"trellis: expected shape \[8, 8, 32\] dtype torch.int16"):
        exl3.check_tensors({**good, "trellis": good["trellis"].int()}, p, 128, 128)
    with pytest.raises(Exl3LayoutError, match="suh: scales must be finite"):
        exl3.check_tensors({**good, "suh": torch.full((128,), float("nan")).half()}, p, 128, 128)
    with pytest.raises(Exl3LayoutError, match="mcg: expected the int32 scalar marker 0xcbac1fed, found 0x5"):
        exl3.check_tensors({**good, "mcg": torch.tensor(5, dtype=torch.int32)}, p, 128, 128)
    with pytest.raises(Exl3LayoutError, match="svh: missing"):
        exl3.check_tensors({k: v for k, v in good.items() if k != "svh"}, p, 128, 128)
