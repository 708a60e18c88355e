"""GPTQ planar layout (gptq_p), checked against formats.md 2.4 and the numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear.affine import quantize_rtn
from qlinear.enums import FORMAT
from qlinear.layouts import gptq, planar
from qlinear.spec import Scheme
from tests.oracle import gptq_numpy as oracle

FAST = settings(max_examples=30, deadline=None)


def s32(word: int) -> int:
    return word - (1 << 32) if word >= 1 << 31 else word


def test_worked_example_3bit() -> None:
    codes = (torch.arange(32) % 8).to(torch.uint8)[:, None]
    words = planar.planar_pack_rows(codes, 3)
    assert words.dtype == torch.int32 and words.shape == (3, 1)
    assert words[:, 0].tolist() == [s32(0xE4E4E4E4), s32(0xE4E4E4E4), s32(0xF0F0F0F0)]
    assert torch.equal(planar.planar_unpack_rows(words, 3, 32), codes)
    # the continuous 3-bit words differ (formats.md 2.2)
    assert gptq.pack_qweight(codes, 3)[:, 0].tolist() == [s32(0x88FAC688), s32(0xC688FAC6), s32(0xFAC688FA)]


def test_worked_examples_shared_with_continuous() -> None:
    col = torch.tensor([k % 4 for k in range(32)], dtype=torch.uint8)[:, None]
    assert planar.planar_pack_rows(col, 2)[:, 0].tolist() == [s32(0xE4E4E4E4)] * 2
    col = torch.tensor([(k % 8) + 1 for k in range(32)], dtype=torch.uint8)[:, None]
    assert planar.planar_pack_rows(col, 4)[:, 0].tolist() == [s32(0x87654321)] * 4
    col = torch.tensor([(k % 4) + 1 for k in range(32)], dtype=torch.uint8)[:, None]
    assert planar.planar_pack_rows(col, 8)[:, 0].tolist() == [0x04030201] * 8


@FAST
@given(bits=st.sampled_from([2, 4, 8]), blocks=st.integers(1, 3), n=st.integers(1, 5), seed=st.integers(0, 999))
def test_2_4_8_bits_equal_continuous(bits: int, blocks: int, n: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (32 * blocks, n), dtype=torch.uint8, generator=gen)
    assert torch.equal(planar.planar_pack_rows(codes, bits), gptq.pack_qweight(codes, bits))
    assert torch.equal(planar.planar_pack_cols(codes.t(), bits), gptq.pack_qzeros(codes.t(), bits))


@FAST
@given(bits=st.integers(2, 8), blocks=st.integers(1, 3), other=st.integers(1, 5), seed=st.integers(0, 999))
def test_round_trip_and_oracle(bits: int, blocks: int, other: int, seed: int) -> None:
    k = 32 * blocks
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (k, other), dtype=torch.uint8, generator=gen)
    rows = planar.planar_pack_rows(codes, bits)
    assert rows.shape == (k * bits // 32, other) and rows.dtype == torch.int32
    assert torch.equal(planar.planar_unpack_rows(rows, bits, k), codes)
    assert torch.equal(planar.planar_unpack_rows(rows, bits), codes)  # count inferred, as the reference does
    assert (oracle.planar_unpack_qweight(rows.numpy(), bits, k) == codes.numpy()).all()
    cols = planar.planar_pack_cols(codes.t(), bits)
    assert torch.equal(cols, rows.t())
    assert torch.equal(planar.planar_unpack_cols(cols, bits, k), codes.t())
    assert (oracle.planar_unpack_qzeros(cols.numpy(), bits, k) == codes.t().numpy()).all()


@FAST
@given(bits=st.integers(2, 8), blocks=st.integers(1, 3), seed=st.integers(0, 999))
def test_unpack_random_words_matches_oracle(bits: int, blocks: int, seed: int) -> None:
    words = torch.randint(-(2**31), 2**31 - 1, (blocks * bits, 3), dtype=torch.int32,
                          generator=torch.Generator().manual_seed(seed))
    words[0, 0] = -(2**31)
    ours = planar.planar_unpack_rows(words, bits, 32 * blocks)
    assert (ours.numpy() == oracle.planar_unpack_qweight(words.numpy(), bits, 32 * blocks)).all()


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize(("group_size", "desc_act"), [(32, False), (32, True), (-1, False)])
def test_checkpoint_round_trip(bits: int, group_size: int, desc_act: bool) -> None:
    k, n = 64, 32
    q = quantize_rtn(torch.randn(n, k, generator=torch.Generator().manual_seed(bits)), bits=bits,
                     group_size=group_size, sym=False, desc_act=desc_act)
    q.zeros[0, 0] = 0  # zero point 0 is fine: planar zeros are always v2
    tensors = gptq.to_checkpoint(q, FORMAT.GPTQ_P)
    scheme = Scheme(bits=bits, group_size=group_size, in_features=k, out_features=n, sym=False,
                    desc_act=desc_act, format=FORMAT.GPTQ_P)
    back = gptq.from_checkpoint(tensors, scheme)
    assert torch.equal(back.codes, q.codes) and torch.equal(back.zeros, q.zeros)
    assert torch.equal(back.scales, q.scales.half()) and torch.equal(back.g_idx, q.g_idx)
    expected = oracle.dequantize_checkpoint({m: t.numpy() for m, t in tensors.items()}, bits, k, n, "gptq_p")
    np.testing.assert_allclose(back.dequantize(torch.float64).numpy(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: planar.planar_pack_rows(torch.zeros(48, 4, dtype=torch.uint8), 3),
     r"values: planar packing needs the packed dimension \(rows\) to be a multiple of 32, got 48"),
    (lambda: planar.planar_pack_cols(torch.zeros(4, 40, dtype=torch.uint8), 5),
     r"packed dimension \(columns\) to be a multiple of 32, got 40"),
    (lambda: planar.planar_pack_rows(torch.full((32, 1), 8, dtype=torch.uint8), 3),
     r"values: codes must be in 0..7 for 3 bits; found 8..8"),
    (lambda: planar.planar_pack_rows(torch.zeros(32, 1), 3), r"values: expected an integer dtype.*torch.float32"),
    (lambda: planar.planar_pack_rows(torch.zeros(32, 1, dtype=torch.uint8), 3, pack_dtype=torch.int64),
     r"pack_dtype: planar gptq_p is packed in torch.int32 words only, got torch.int64"),
    (lambda: planar.planar_pack_rows(torch.zeros(32, 1, dtype=torch.uint8), 9), r"bits: planar gptq_p holds 2..8"),
    (lambda: planar.planar_unpack_rows(torch.zeros(5, 1, dtype=torch.int64), 5),
     r"packed: planar gptq_p words must be torch.int32, got torch.int64"),
    (lambda: planar.planar_unpack_rows(torch.zeros(7, 1, dtype=torch.int32), 5),
     r"packed: planar 5-bit words come in blocks of 5 along the rows; got 7"),
    (lambda: planar.planar_unpack_rows(torch.zeros(5, 1, dtype=torch.int32), 5, 64),
     r"packed: 64 5-bit codes need 10 int32 words along the rows, found 5"),
    (lambda: planar.planar_unpack_cols(torch.zeros(1, 6, dtype=torch.int32), 6, 40),
     r"columns: planar packing needs a multiple of 32 codes, got 40"),
    (lambda: planar.planar_unpack_rows(torch.zeros(6, dtype=torch.int32), 6), r"packed: expected a 2-D tensor"),
])
def test_bad_inputs(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_checkpoint_needs_multiple_of_32_and_int32() -> None:
    q = quantize_rtn(torch.randn(32, 48), bits=5, group_size=16, sym=False)
    with pytest.raises(ValueError, match=r"\(rows\) to be a multiple of 32, got 48"):
        gptq.to_checkpoint(q, FORMAT.GPTQ_P)
    q = quantize_rtn(torch.randn(32, 64), bits=4, group_size=16, sym=False)
    with pytest.raises(ValueError, match="pack_dtype: planar gptq_p is packed in torch.int32 words only"):
        gptq.to_checkpoint(q, FORMAT.GPTQ_P, torch.int64)
