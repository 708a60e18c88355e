"""GGML block codecs: decode bit-exact against gguf-py, encode byte-identical to ggml's quantizers, worked layouts.

Oracles: ``gguf.quants`` (decode of every type, encode of the legacy types), ``libgguf`` (ggml's reference C
quantizers, for the K-quants and Q1_0) and the byte layouts of specs/formats.md 2.14, re-derived here by a
parser that shares no code with ``src``. Install the oracles with
``pip install --no-deps -r requirements/nodeps-gguf.txt``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear.layouts import gguf as G
from qlinear.spec import ConfigError, Scheme

SKIP = "pip install --no-deps -r requirements/nodeps-gguf.txt"
QUANTIZED = [t for t, i in G.TYPES.items() if i.block_size > 1]
ENCODABLE = [t for t in QUANTIZED if G.TYPES[t].encode is not None]
LEGACY = [G.GGMLType.Q4_0, G.GGMLType.Q4_1, G.GGMLType.Q5_0, G.GGMLType.Q5_1, G.GGMLType.Q8_0]


def need(name: str):
    return pytest.importorskip(name, reason=SKIP)


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical, except that any NaN equals any NaN (payloads are not meaningful)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def weights(rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Gaussian rows at scales 1e-3..1e2, plus rows that hit the quantizers' corner cases."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype(np.float32) * np.logspace(-3, 2, rows, dtype=np.float32)[:, None]
    x[0] = 0
    x[1] = -0.0
    x[2] = 1.5
    x[3] = -2.5
    x[4] = 0
    x[4, 7] = 3.0
    x[5] = np.where(np.arange(k) % 2, 1.0, -1.0)
    x[6] = rng.integers(-8, 8, k).astype(np.float32)  # exact ties for the legacy rounding
    x[7] = np.abs(x[7])
    return x


# ------------------------------------------------------------------ the type table
def test_type_table_matches_gguf_py_sizes() -> None:
    gguf = need("gguf")
    for t, info in G.TYPES.items():
        if t is G.GGMLType.Q1_0:  # the reference's id 40 (32-value blocks); upstream 40 is NVFP4
            assert (info.block_size, info.type_size, info.bits) == (32, 6, 1)
            assert gguf.GGMLQuantizationType(40).name == "NVFP4"
            continue
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.value)] == (info.block_size, info.type_size), t
    assert gguf.GGMLQuantizationType(41).name == "Q1_0"  # upstream Q1_0 == the reference's Q1_0_g128 layout


def test_names_aliases_and_errors() -> None:
    assert G.ggml_type("q4_k_m") is G.GGMLType.Q4_K and G.ggml_type("Q1_0_G128") is G.GGMLType.Q1_0_G128
    assert G.ggml_type(14) is G.GGMLType.Q6_K and G.ggml_type(G.GGMLType.IQ4_XS) is G.GGMLType.IQ4_XS
    with pytest.raises(ValueError, match=r"unknown GGML type 'Q9_K'.*Q4_K \(12\)"):
        G.ggml_type("Q9_K")
    with pytest.raises(ValueError, match="unknown GGML type 99"):
        G.ggml_type(99)
    with pytest.raises(NotImplementedError, match="IQ4_XS.*encodable: .*Q4_K"):
        G.quantize(np.zeros((1, 256), np.float32), "IQ4_XS")
    with pytest.raises(ValueError, match="multiple of 144 bytes"):
        G.dequantize(torch.zeros(2, 100, dtype=torch.uint8), "Q4_K")
    with pytest.raises(ValueError, match="expected uint8"):
        G.dequantize(torch.zeros(2, 144, dtype=torch.int32), "Q4_K")


def test_scheme_carries_the_qtype() -> None:
    s = G.scheme_for("q4_k_m", in_features=4096, out_features=11008)
    assert (s.qtype, s.bits, s.format.value, s.method.value) == ("Q4_K", 4, "gguf", "gguf")
    with pytest.raises(ConfigError, match="Q6_K is a 6-bit GGUF block type"):
        Scheme(bits=4, group_size=256, in_features=256, out_features=8, method="gguf", format="gguf", qtype="Q6_K")
    with pytest.raises(ConfigError, match="method=gptq"):
        Scheme(bits=4, group_size=128, in_features=256, out_features=8, qtype="Q4_0")


# ------------------------------------------------------------------ decode: bit-exact against gguf-py
@pytest.mark.parametrize("qtype", [t for t in G.TYPES if t not in (G.GGMLType.Q1_0, G.GGMLType.Q1_0_G128)],
                         ids=lambda t: t.name)
def test_decode_matches_gguf_py_on_random_bytes(qtype: G.GGMLType) -> None:
    gguf = need("gguf")
    info = G.TYPES[qtype]
    raw = np.random.default_rng(qtype.value).integers(0, 256, (3, 40 * info.type_size), dtype=np.uint8)
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype.value))
    assert same_floats(G.dequantize(raw, qtype).numpy(), want)
    assert same_floats(G.dequantize(torch.from_numpy(raw)[:, :info.type_size * 7], qtype).numpy(),
                       want[:, :7 * info.block_size])


def test_q1_0_g128_decodes_like_upstream_q1_0() -> None:
    libgguf = need("libgguf")
    raw = np.random.default_rng(5).integers(0, 256, (2, 18 * 6), dtype=np.uint8)
    want = np.stack([libgguf.dequantize_rows(r, 41, n_per_row=6 * 128) for r in raw])
    assert same_floats(G.dequantize(raw, "Q1_0_G128").numpy(), want.reshape(2, -1))


# ------------------------------------------------------------------ encode: byte-identical
@pytest.mark.parametrize("qtype", LEGACY, ids=lambda t: t.name)
def test_legacy_encode_matches_gguf_py(qtype: G.GGMLType) -> None:
    gguf = need("gguf")
    x = np.delete(weights(16, 320), 1, axis=0)  # row 1 (all -0.0): see the next test
    assert np.array_equal(G.quantize(x, qtype), gguf.quants.quantize(x, gguf.GGMLQuantizationType(qtype.value)))


def test_negative_zero_block_follows_ggml_not_gguf_py() -> None:
    """ggml's Q4_0/Q5_0 start from ``max = 0`` and only replace it on ``|v| > amax``, so an all -0.0 block
    gets ``d = +0 / -8 = -0`` (f16 0x8000); gguf-py's argmax takes the -0.0 itself and writes +0."""
    gguf = need("gguf")
    x = np.full((1, 32), -0.0, np.float32)
    for qtype in ("Q4_0", "Q5_0"):
        assert G.quantize(x, qtype)[0, :2].tolist() == [0x00, 0x80]
        assert gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype])[0, :2].tolist() == [0x00, 0x00]


@pytest.mark.parametrize("qtype", [t for t in ENCODABLE if t is not G.GGMLType.Q1_0], ids=lambda t: t.name)
def test_encode_matches_ggml_reference_quantizer(qtype: G.GGMLType) -> None:
    libgguf = need("libgguf")
    x = weights(24, 512, seed=qtype.value)
    mine = G.quantize(x, qtype)
    want = np.asarray(libgguf.quantize_rows(x, qtype.value)).reshape(mine.shape)
    bad = np.flatnonzero((mine != want).reshape(-1, G.TYPES[qtype].type_size).any(axis=1))
    assert bad.size == 0, f"{qtype.name}: {bad.size} blocks differ, first {bad[:5]}"


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(LEGACY), st.integers(1, 4), st.floats(1e-4, 1e3), st.integers(0, 2**31))
def test_legacy_encode_matches_gguf_py_property(qtype: G.GGMLType, blocks: int, scale: float, seed: int) -> None:
    gguf = need("gguf")
    x = (np.random.default_rng(seed).standard_normal((2, 32 * blocks)) * scale).astype(np.float32)
    assert np.array_equal(G.quantize(x, qtype), gguf.quants.quantize(x, gguf.GGMLQuantizationType(qtype.value)))


@pytest.mark.parametrize("qtype", ENCODABLE, ids=lambda t: t.name)
def test_round_trip_pads_k_and_stays_close(qtype: G.GGMLType) -> None:
    info = G.TYPES[qtype]
    x = np.random.default_rng(1).standard_normal((6, 300)).astype(np.float32)
    q = G.quantize(torch.from_numpy(x), qtype)
    assert q.shape == (6, info.row_bytes(300)) and q.dtype == np.uint8
    back = G.dequantize(q, qtype, k=300).numpy()
    err = np.sqrt(np.mean((back - x) ** 2))
    limit = {1: 0.8, 2: 0.45, 3: 0.25, 4: 0.15, 5: 0.08, 6: 0.04, 8: 0.01}[info.bits]
    assert back.shape == x.shape and err < limit, f"{qtype.name}: rms error {err:.3f}"


# ------------------------------------------------------------------ worked layouts (formats.md 2.14), parsed here
def f16(b: np.ndarray, at: int) -> float:
    return float(np.frombuffer(b[at:at + 2].tobytes(), "<f2")[0])


def parse_block(qtype: str, b: np.ndarray) -> np.ndarray:
    """Values of one block, straight from the formats.md table (float64, for the test only)."""
    if qtype == "Q4_0":
        q = [b[2 + j] & 15 for j in range(16)] + [b[2 + j] >> 4 for j in range(16)]
        return f16(b, 0) * (np.array(q, float) - 8)
    if qtype == "Q8_0":
        return f16(b, 0) * b[2:34].view(np.int8).astype(float)
    if qtype in ("Q1_0", "Q1_0_G128"):
        n = (len(b) - 2) * 8
        bits = [(b[2 + i // 8] >> (i % 8)) & 1 for i in range(n)]
        return np.where(np.array(bits) == 1, f16(b, 0), -f16(b, 0))
    if qtype in ("Q4_K", "Q5_K"):
        s = b[4:16].astype(int)
        sc = [s[j] & 63 for j in range(4)] + [(s[8 + j] & 15) | ((s[j] >> 6) << 4) for j in range(4)]
        mn = [s[4 + j] & 63 for j in range(4)] + [(s[8 + j] >> 4) | ((s[4 + j] >> 6) << 4) for j in range(4)]
        qs = b[48:176] if qtype == "Q5_K" else b[16:144]
        out = []
        for sub in range(8):
            chunk, high = divmod(sub, 2)
            q = np.array([(qs[32 * chunk + i] >> (4 * high)) & 15 for i in range(32)], float)
            if qtype == "Q5_K":
                q += 16 * np.array([(b[16 + i] >> sub) & 1 for i in range(32)])
            out.append(f16(b, 0) * sc[sub] * q - f16(b, 2) * mn[sub])
        return np.concatenate(out)
    if qtype == "Q6_K":
        ql, qh, scales = b[0:128].astype(int), b[128:192].astype(int), b[192:208].view(np.int8)
        rows = np.zeros((8, 32), int)
        for h in range(2):
            for i in range(32):
                rows[4 * h + 0, i] = (ql[64 * h + i] & 15) | (((qh[32 * h + i] >> 0) & 3) << 4)
                rows[4 * h + 1, i] = (ql[64 * h + 32 + i] & 15) | (((qh[32 * h + i] >> 2) & 3) << 4)
                rows[4 * h + 2, i] = (ql[64 * h + i] >> 4) | (((qh[32 * h + i] >> 4) & 3) << 4)
                rows[4 * h + 3, i] = (ql[64 * h + 32 + i] >> 4) | (((qh[32 * h + i] >> 6) & 3) << 4)
        codes = rows.reshape(256) - 32
        return f16(b, 208) * np.repeat(scales.astype(float), 16) * codes
    raise AssertionError(qtype)


WORKED = ["Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q1_0", "Q1_0_G128"]


@pytest.mark.parametrize("qtype", WORKED)
def test_encoder_bytes_follow_the_documented_layout(qtype: str) -> None:
    info = G.type_info(qtype)
    x = weights(8, 2 * info.block_size, seed=3)
    q = G.quantize(x, qtype)
    decoded = G.dequantize(q, qtype).numpy()
    for r in range(q.shape[0]):
        for blk in range(2):
            b = q[r, blk * info.type_size:(blk + 1) * info.type_size]
            want = parse_block(qtype, b)
            got = decoded[r, blk * info.block_size:(blk + 1) * info.block_size]
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


def test_worked_q4_k_block_by_hand() -> None:
    """A Q4_K block assembled from the formats.md bullets: 6-bit sc/mn with high bits, nibble chunks."""
    sc, mn = [1, 17, 33, 63, 5, 21, 40, 62], [0, 3, 16, 31, 48, 63, 7, 9]
    scales = [(sc[j] & 63) | ((sc[4 + j] >> 4) << 6) for j in range(4)]
    scales += [(mn[j] & 63) | ((mn[4 + j] >> 4) << 6) for j in range(4)]
    scales += [(sc[4 + j] & 15) | ((mn[4 + j] & 15) << 4) for j in range(4)]
    vals = np.array([[(s * 7 + i) % 16 for i in range(32)] for s in range(8)])
    qs = [vals[2 * c, i] | (vals[2 * c + 1, i] << 4) for c in range(4) for i in range(32)]
    block = np.concatenate([np.array([0.25, 0.125], "<f2").view(np.uint8), scales, qs]).astype(np.uint8)
    want = np.concatenate([0.25 * sc[s] * vals[s] - 0.125 * mn[s] for s in range(8)])
    assert np.array_equal(G.dequantize(block[None], "Q4_K").numpy()[0], want.astype(np.float32))


def test_worked_q1_0_sign_bits() -> None:
    block = np.array([0x00, 0x3C, 0b0000_0101, 0, 0, 0x80], np.uint8)  # d = 1.0; bits 0, 2 and 31 set
    want = -np.ones(32, np.float32)
    want[[0, 2, 31]] = 1
    assert np.array_equal(G.dequantize(block[None], "Q1_0").numpy()[0], want)
    x = np.where(np.arange(128) % 3 == 0, 2.0, -1.0).astype(np.float32)[None]
    q = G.quantize(x, "Q1_0_G128")
    assert q.shape == (1, 18) and f16(q[0], 0) == pytest.approx(np.abs(x).mean(), rel=1e-3)
    assert np.array_equal(G.dequantize(q, "Q1_0_G128").numpy()[0] > 0, x[0] > 0)
