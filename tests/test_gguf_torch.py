"""GGUFTorchLinear against a float64 oracle: gguf-py's dequantize in float64, then the matmul.

Every quantized type qlinear decodes, float16 / bfloat16 / float32 activations, odd M, K that is not a
whole number of blocks, several tiles, bias; plus the declaration's runtime reasons and the lifecycle
(no dense state between forwards, state_dict round trip). Needs ``pip install --no-deps -r
requirements/nodeps-gguf.txt`` for the oracle.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qlinear.kernels.gguf_torch as gt
from qlinear.caps import Problem
from qlinear.kernels.gguf_torch import GGUFTorchLinear
from qlinear.layouts import gguf as G
from qlinear.select import select
from qlinear.spec import Scheme
from qlinear.target import Target

gguf = pytest.importorskip("gguf", reason="pip install --no-deps -r requirements/nodeps-gguf.txt")
QTYPES = sorted(GGUFTorchLinear.qtypes)


def blocks_for(qtype: G.GGMLType, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Realistic bytes: encoded Gaussian weights where qlinear encodes the type, else random codes with
    small finite float16 scales."""
    rng = np.random.default_rng(seed)
    info = G.TYPES[qtype]
    if info.encode is not None:
        return G.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    raw = rng.integers(0, 256, (n * info.blocks_per_row(k), info.type_size), dtype=np.uint8)
    raw[:, 0:2] = (rng.uniform(0.001, 0.02, raw.shape[0]).astype("<f2")).view(np.uint8).reshape(-1, 2)
    return raw.reshape(n, info.row_bytes(k))


def oracle(qtype: G.GGMLType, raw: np.ndarray, k: int) -> torch.Tensor:
    """The weight as float64 from gguf-py (libgguf's ggml decode for Q1_0_G128; the spec layout for Q1_0)."""
    if qtype is G.GGMLType.Q1_0_G128:
        libgguf = pytest.importorskip("libgguf", reason="pip install --no-deps -r requirements/nodeps-gguf.txt")
        w = np.stack([libgguf.dequantize_rows(r, 41, n_per_row=raw.shape[1] // 18 * 128) for r in raw])
    elif qtype is G.GGMLType.Q1_0:
        d = raw.reshape(raw.shape[0], -1, 6)[:, :, :2].copy().view("<f2").astype(np.float64)
        bits = np.unpackbits(raw.reshape(raw.shape[0], -1, 6)[:, :, 2:], axis=-1, bitorder="little")
        w = np.where(bits == 1, d, -d).reshape(raw.shape[0], -1)
    else:
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype.value))
    return torch.from_numpy(np.asarray(w, dtype=np.float64).reshape(raw.shape[0], -1)[:, :k].copy())


def layer(qtype: G.GGMLType, n: int, k: int, bias: bool = False, seed: int = 0) -> tuple[GGUFTorchLinear, np.ndarray]:
    lay = GGUFTorchLinear(G.scheme_for(qtype, k, n), bias=bias)
    raw = blocks_for(qtype, n, k, seed)
    lay.load_blocks(raw, torch.randn(n) if bias else None)
    lay.prepare()
    return lay, raw


TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_matches_float64_oracle(qtype: G.GGMLType, dtype: torch.dtype) -> None:
    block = G.TYPES[qtype].block_size
    k = 2 * block
    lay, raw = layer(qtype, 40, k, bias=True, seed=qtype.value)
    x = torch.randn(7, k).to(dtype)
    y = lay(x)
    want = x.double() @ oracle(qtype, raw, k).t() + lay.bias.double()
    assert y.dtype == dtype and y.shape == (7, 40)
    scale = want.abs().max().item()
    torch.testing.assert_close(y.double(), want, rtol=TOL[dtype], atol=TOL[dtype] * scale)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q6_K", "Q1_0_G128"])
def test_k_not_a_whole_number_of_blocks(qtype: str) -> None:
    t = G.ggml_type(qtype)
    k = G.TYPES[t].block_size + 13
    lay = GGUFTorchLinear(G.scheme_for(t, k, 9), dtype=torch.float32)
    w = torch.randn(9, k)
    lay.load_float(w)
    assert lay.qweight.shape == (9, 2 * G.TYPES[t].type_size)
    want = oracle(t, lay.qweight.numpy(), k)
    x = torch.randn(3, 2, k)
    torch.testing.assert_close(lay(x).double(), (x.double() @ want.t()), rtol=2e-6, atol=1e-5)
    assert torch.equal(lay.dequantize(), want.float())


def test_tiles_give_the_same_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    lay, _ = layer(G.GGMLType.Q4_K, 50, 512)
    x = torch.randn(5, 512)
    whole = lay(x)
    monkeypatch.setattr(gt, "TILE_ELEMENTS", 512 * 7)  # 7 rows a tile: 8 tiles, the last one short
    assert lay.tile_rows() == 7
    torch.testing.assert_close(lay(x), whole, rtol=1e-6, atol=1e-5)  # BLAS may block a narrower N differently


def test_no_dense_state_between_forwards() -> None:
    lay, _ = layer(G.GGMLType.Q5_K, 64, 1024)
    before = {n: b.numel() for n, b in lay.named_buffers()}
    for _ in range(3):
        lay(torch.randn(2, 1024))
    assert {n: b.numel() for n, b in lay.named_buffers()} == before
    dense = [n for n, v in vars(lay).items() if isinstance(v, torch.Tensor) and v.numel() >= 64 * 1024]
    assert not dense


def test_state_dict_round_trip_and_grad() -> None:
    lay, _ = layer(G.GGMLType.Q8_0, 16, 64, bias=True)
    assert set(lay.state_dict()) == {"qweight", "bias"}
    other = GGUFTorchLinear(G.scheme_for("Q8_0", 64, 16), bias=True)
    other.load_state_dict(lay.state_dict())
    x = torch.randn(3, 64, requires_grad=True)
    assert torch.equal(other(x), lay(x))
    lay(x).sum().backward()
    torch.testing.assert_close(x.grad, lay.dequantize().sum(0).expand(3, 64))


def test_selection_and_runtime_reasons() -> None:
    cpu = Target.here("cpu")
    choice = select(Problem(G.scheme_for("IQ4_XS", 256, 8), torch.bfloat16), cpu)
    assert choice.kernel is GGUFTorchLinear
    bare = Scheme(bits=4, group_size=32, in_features=64, out_features=8, method="gguf", format="gguf")
    assert any("names no qtype" in r for r in GGUFTorchLinear.reasons(Problem(bare), cpu))
    f16 = GGUFTorchLinear.reasons(Problem(G.scheme_for("F16", 64, 8)), cpu)
    assert any("16-bit not supported" in r for r in f16) and any("qtype F16 not run" in r for r in f16)
    assert GGUFTorchLinear.reasons(Problem(G.scheme_for("Q2_K", 256, 8), torch.float16), cpu) == []
    assert {t.name for t in GGUFTorchLinear.qtypes} >= {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
                                                        "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "Q1_0"}


def test_construction_and_loading_errors() -> None:
    bare = Scheme(bits=4, group_size=32, in_features=64, out_features=8, method="gguf", format="gguf")
    with pytest.raises(ValueError, match="needs its GGML type"):
        GGUFTorchLinear(bare)
    lay = GGUFTorchLinear(bare, qtype="q4_0")
    assert lay.qtype is G.GGMLType.Q4_0 and "qtype=Q4_0" in repr(lay)
    with pytest.raises(ValueError, match=r"qweight \(Q4_0\): expected uint8 \[8, 36\] .* got uint8 \[8, 34\]"):
        lay.load_blocks(torch.zeros(8, 34, dtype=torch.uint8))
    with pytest.raises(ValueError, match="bias given but the layer was built without one"):
        lay.load_blocks(torch.zeros(8, 36, dtype=torch.uint8), torch.zeros(8))
    with pytest.raises(NotImplementedError, match="no integer-affine form"):
        lay.affine()
    with pytest.raises(ValueError, match="expected last dimension 64"):
        lay(torch.randn(2, 63))
    with pytest.raises(ValueError, match="dtype torch.float64 not supported"):
        lay(torch.randn(2, 64, dtype=torch.float64))
