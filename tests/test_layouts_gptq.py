"""GPTQ continuous layout and the generic bit-stream packer, checked against formats.md and a numpy oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear.affine import quantize_rtn
from qlinear.enums import FORMAT
from qlinear.layouts import bitpack, gptq
from qlinear.spec import Scheme
from tests.oracle import gptq_numpy as oracle

WORD_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64]
FAST = settings(max_examples=30, deadline=None)


def s32(word: int) -> int:
    """A 32-bit pattern as the signed int32 torch stores."""
    return word - (1 << 32) if word >= 1 << 31 else word


def gptq_layouts():
    """(bits, pack dtype) pairs the continuous layout allows: 3-bit only in int32."""
    return st.sampled_from([(b, d) for b in gptq.CONTINUOUS_BITS for d in WORD_DTYPES
                            if b != 3 or d == torch.int32])


EXAMPLES = [
    (4, list(range(1, 9)), [0x87654321]),
    (4, list(range(8)), [0x76543210]),
    (8, [1, 2, 3, 4], [0x04030201]),
    (2, [k % 4 for k in range(16)], [0xE4E4E4E4]),
    (3, [k % 8 for k in range(32)], [0x88FAC688, 0xC688FAC6, 0xFAC688FA]),
]


@pytest.mark.parametrize(("bits", "codes", "words"), EXAMPLES)
def test_worked_examples(bits: int, codes: list[int], words: list[int]) -> None:
    col = torch.tensor(codes, dtype=torch.uint8)[:, None]
    qweight = gptq.pack_qweight(col, bits)
    assert qweight.dtype == torch.int32 and qweight.shape == (len(words), 1)
    assert qweight[:, 0].tolist() == [s32(w) for w in words]
    assert gptq.unpack_qweight(qweight, bits, len(codes))[:, 0].tolist() == codes
    # qzeros pack along N with the same rule (v2 stores the values as given)
    qzeros = gptq.pack_qzeros(torch.tensor([codes], dtype=torch.int32), bits)
    assert qzeros[0].tolist() == [s32(w) for w in words]


def test_signed_word_storage() -> None:
    word = gptq.pack_qweight(torch.arange(1, 9, dtype=torch.uint8)[:, None], 4)[0, 0].item()
    assert word < 0 and word == 0x87654321 - (1 << 32)


def test_v1_v2_symmetric_4bit() -> None:
    zeros = torch.full((1, 8), 8, dtype=torch.int32)
    v1 = gptq.pack_qzeros(zeros, 4, v1=True)
    v2 = gptq.pack_qzeros(zeros, 4)
    assert v1.tolist() == [[0x77777777]] and v2.tolist() == [[s32(0x88888888)]]
    assert torch.equal(gptq.zeros_v2_to_v1(v2, 4, 8), v1)
    assert torch.equal(gptq.zeros_v1_to_v2(v1, 4, 8), v2)
    assert torch.equal(gptq.unpack_qzeros(v1, 4, 8, v1=True), zeros)


def test_v1_rejects_zero_point_zero() -> None:
    v2 = torch.tensor([[0x76543210]], dtype=torch.int32)  # fields 0..7: the reference would write 0x654320FF
    with pytest.raises(ValueError, match=r"\(group 0, out column 0\).*checkpoint_format='gptq_v2'"):
        gptq.zeros_v2_to_v1(v2, 4, 8)
    zeros = torch.tensor([[3, 1], [2, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"zero point 0 at \(group 1, out column 1\)"):
        gptq.pack_qzeros(zeros, 8, v1=True)


@pytest.mark.parametrize("bits", gptq.CONTINUOUS_BITS)
def test_zero_point_maxq_edge(bits: int) -> None:
    maxq = (1 << bits) - 1
    zeros = torch.full((2, 32), maxq, dtype=torch.int32)
    v1 = gptq.pack_qzeros(zeros, bits, v1=True)  # stores maxq - 1, no wrap
    assert (oracle.unpack_qzeros(v1.numpy(), bits, 32, v1=False) == maxq - 1).all()
    assert torch.equal(gptq.unpack_qzeros(v1, bits, 32, v1=True), zeros)
    # A v1 word of all ones: 2/4/8 bits read it as GPTQModel does (the word plus one per field: field 0
    # wraps to 0 and carries, so every later field is maxq + 1 + 1 = 1 mod 2^b); 3 bits wrap each field
    # to 0. Either way the result holds a zero point of 0, which has no way back to v1.
    all_ones = torch.full_like(v1, -1)
    read = gptq.unpack_qzeros(all_ones, bits, 32, v1=True)
    assert torch.equal(read, torch.from_numpy(oracle.unpack_qzeros(all_ones.numpy(), bits, 32, v1=True)).int())
    if bits == 3:
        assert (read == 0).all()
    else:
        per_word = 32 // bits
        assert (read[:, ::per_word] == 0).all() and (read[:, 1:per_word] == 1).all()
    with pytest.raises(ValueError, match="no GPTQ v1 encoding"):
        gptq.zeros_v2_to_v1(gptq.zeros_v1_to_v2(all_ones, bits, 32), bits, 32)


def test_v1_reads_gptqmodel_borrow_exactly() -> None:
    """GPTQModel's v1 of v2 fields 0..7 is 0x654320FF (the borrow cascades); reading gives 0..7 back."""
    word = torch.tensor([[0x654320FF]], dtype=torch.int32)
    assert gptq.unpack_qzeros(word, 4, 8, v1=True).tolist() == [list(range(8))]


@FAST
@given(bits=st.sampled_from([2, 4, 8]), dtype=st.sampled_from(WORD_DTYPES), groups=st.integers(1, 3),
       n_words=st.integers(1, 3), seed=st.integers(0, 999))
def test_v1_matches_reference_whole_word_without_zero(bits: int, dtype: torch.dtype, groups: int, n_words: int,
                                                      seed: int) -> None:
    """Without z = 0 our per-field v1 words equal the reference's whole-word subtraction (2/4/8 bits)."""
    w = torch.iinfo(dtype).bits
    n = n_words * w // bits
    zeros = torch.randint(1, 1 << bits, (groups, n), generator=torch.Generator().manual_seed(seed))
    v2 = gptq.pack_qzeros(zeros, bits, dtype)
    const = sum(1 << (bits * j) for j in range(w // bits))
    reference = [[oracle.to_signed((int(x) - const) % (1 << w), w) for x in row] for row in v2.tolist()]
    assert gptq.zeros_v2_to_v1(v2, bits, n).tolist() == reference


@FAST
@given(bits=st.integers(1, 8), dtype=st.sampled_from(WORD_DTYPES), length=st.integers(0, 70),
       other=st.integers(1, 3), dim=st.sampled_from([0, 1, -1]), data=st.data())
def test_bitstream_matches_oracle(bits: int, dtype: torch.dtype, length: int, other: int, dim: int, data) -> None:
    w = torch.iinfo(dtype).bits
    values = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=length * other, max_size=length * other))
    codes = torch.tensor(values, dtype=torch.uint8).reshape(length, other)
    if dim != 0:
        codes = codes.t().contiguous()
    words = bitpack.pack_bits(codes, bits, dtype, dim=dim)
    assert words.dtype == dtype and words.shape[dim] == -(-length * bits // w)
    lines = codes.t() if dim == 0 else codes
    word_lines = words.t() if dim == 0 else words
    for line, wline in zip(lines, word_lines):
        expected = [oracle.to_signed(x, w) for x in oracle.stream_pack(line.tolist(), bits, w)]
        assert wline.tolist() == expected
        assert oracle.stream_unpack(wline.numpy(), bits, length) == line.tolist()
    assert torch.equal(bitpack.unpack_bits(words, bits, length, dim=dim), codes)


@FAST
@given(bits=st.integers(1, 8), dtype=st.sampled_from(WORD_DTYPES), n_words=st.integers(1, 9), seed=st.integers(0, 999))
def test_unpack_random_words_matches_oracle(bits: int, dtype: torch.dtype, n_words: int, seed: int) -> None:
    info = torch.iinfo(dtype)
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(info.min, info.max, (n_words, 2), dtype=dtype, generator=gen)
    words[0, 0] = info.min  # the sign bit alone must not leak into fields
    count = n_words * info.bits // bits
    ours = bitpack.unpack_bits(words, bits, count)
    for c in range(2):
        assert ours[:, c].tolist() == oracle.stream_unpack(words[:, c].numpy(), bits, count)


@FAST
@given(layout=gptq_layouts(), k=st.integers(1, 100), n=st.integers(1, 40), seed=st.integers(0, 999))
def test_qweight_qzeros_round_trip(layout, k: int, n: int, seed: int) -> None:
    bits, dtype = layout
    w = torch.iinfo(dtype).bits
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (k, n), dtype=torch.uint8, generator=gen)
    qweight = gptq.pack_qweight(codes, bits, dtype)
    assert qweight.shape == (-(-k * bits // w), n) and qweight.dtype == dtype
    assert torch.equal(gptq.unpack_qweight(qweight, bits, k), codes)
    assert (oracle.unpack_qweight(qweight.numpy(), bits, k) == codes.numpy()).all()
    zeros = torch.randint(1, 1 << bits, (3, n), dtype=torch.int32, generator=gen)
    for v1 in (False, True):
        qzeros = gptq.pack_qzeros(zeros, bits, dtype, v1=v1)
        assert qzeros.shape == (3, -(-n * bits // w))
        assert torch.equal(gptq.unpack_qzeros(qzeros, bits, n, v1=v1), zeros)
        assert (oracle.unpack_qzeros(qzeros.numpy(), bits, n, v1=v1) == zeros.numpy()).all()
    v2 = gptq.pack_qzeros(zeros, bits, dtype)
    v1_words = gptq.zeros_v2_to_v1(v2, bits, n)
    assert torch.equal(v1_words, gptq.pack_qzeros(zeros, bits, dtype, v1=True))
    assert torch.equal(gptq.zeros_v1_to_v2(v1_words, bits, n), v2)


CHECKPOINT_CASES = [(fmt, b, d, gs, act) for fmt in (FORMAT.GPTQ, FORMAT.GPTQ_V2) for b in gptq.CONTINUOUS_BITS
                    for d in (torch.int32, torch.int64) if b != 3 or d == torch.int32
                    for gs, act in ((16, False), (32, True), (-1, False))]


@pytest.mark.parametrize(("fmt", "bits", "dtype", "group_size", "desc_act"), CHECKPOINT_CASES)
def test_checkpoint_round_trip_and_oracle_dequant(fmt, bits, dtype, group_size, desc_act) -> None:
    k, n = 48, 12
    weight = torch.randn(n, k, generator=torch.Generator().manual_seed(bits))
    q = quantize_rtn(weight, bits=bits, group_size=group_size, sym=fmt is FORMAT.GPTQ, desc_act=desc_act)
    tensors = gptq.to_checkpoint(q, fmt, dtype)
    scheme = Scheme(bits=bits, group_size=group_size, in_features=k, out_features=n, sym=q.sym, desc_act=desc_act,
                    format=fmt, pack_dtype=dtype)
    for name, (shape, dt) in gptq.checkpoint_shapes(scheme).items():
        assert tuple(tensors[name].shape) == shape and tensors[name].dtype == dt, name
    back = gptq.from_checkpoint(tensors, scheme)
    assert torch.equal(back.codes, q.codes) and torch.equal(back.zeros, q.zeros)
    assert torch.equal(back.g_idx, q.g_idx) and torch.equal(back.scales, q.scales.half())
    expected = oracle.dequantize_checkpoint({m: t.numpy() for m, t in tensors.items()}, bits, k, n, fmt.value)
    np.testing.assert_allclose(back.dequantize(torch.float64).numpy(), expected, rtol=1e-6, atol=1e-6)


def _scheme(**kw) -> Scheme:
    base = dict(bits=4, group_size=16, in_features=64, out_features=16, sym=False, format=FORMAT.GPTQ_V2)
    return Scheme(**{**base, **kw})


def _tensors() -> dict[str, torch.Tensor]:
    q = quantize_rtn(torch.randn(16, 64, generator=torch.Generator().manual_seed(0)), bits=4, group_size=16, sym=False)
    return gptq.to_checkpoint(q, FORMAT.GPTQ_V2)


@pytest.mark.parametrize(("name", "value", "match"), [
    ("qweight", torch.zeros(7, 16, dtype=torch.int32), r"qweight: expected shape \[8, 16\].*got shape \[7, 16\]"),
    ("qweight", torch.zeros(8, 16, dtype=torch.int64), r"qweight: expected .*dtype torch.int32.*dtype torch.int64"),
    ("qzeros", torch.zeros(4, 3, dtype=torch.int32), r"qzeros: expected shape \[4, 2\]"),
    ("scales", torch.zeros(4, 16, dtype=torch.int32),
     r"scales: expected shape \[4, 16\] dtype torch.float16 or torch.bfloat16"),
    ("g_idx", torch.zeros(64, dtype=torch.int64), r"g_idx: expected shape \[64\] dtype torch.int32"),
    ("g_idx", torch.full((64,), 4, dtype=torch.int32), r"g_idx: group ids must be in 0..3; found 4..4"),
])
def test_from_checkpoint_rejects_bad_tensors(name: str, value: torch.Tensor, match: str) -> None:
    tensors = {**_tensors(), name: value}
    with pytest.raises(ValueError, match=match):
        gptq.from_checkpoint(tensors, _scheme())


def test_from_checkpoint_missing_tensor_and_wrong_format() -> None:
    tensors = _tensors()
    del tensors["qzeros"]
    with pytest.raises(ValueError, match=r"qzeros: missing .*expected shape \[4, 2\]"):
        gptq.from_checkpoint(tensors, _scheme())
    with pytest.raises(ValueError, match="fmt: expected one of gptq, gptq_v2, gptq_p, got 'marlin'"):
        gptq.to_checkpoint(quantize_rtn(torch.randn(4, 32)), FORMAT.MARLIN)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: bitpack.pack_bits(torch.tensor([0, 16], dtype=torch.uint8), 4, torch.int32),
     r"codes: values must be in 0..15 for 4 bits; found 16 at index \(1,\)"),
    (lambda: bitpack.pack_bits(torch.tensor([-1, 2]), 4, torch.int32), r"codes: values must be in 0..15.*found -1"),
    (lambda: bitpack.pack_bits(torch.zeros(4), 4, torch.int32), r"codes: expected an integer dtype.*torch.float32"),
    (lambda: bitpack.pack_bits(torch.zeros(4, dtype=torch.uint8), 4, torch.uint8), r"pack_dtype: expected one of"),
    (lambda: bitpack.pack_bits(torch.zeros(4, dtype=torch.uint8), 9, torch.int32), r"bits: expected .* 1..8"),
    (lambda: bitpack.unpack_bits(torch.zeros(2, dtype=torch.int32), 3, 32),
     r"words: 32 codes of 3 bits need 3 torch.int32 words along dim 0, found 2"),
    (lambda: bitpack.unpack_bits(torch.zeros(2, dtype=torch.float32), 4, 8), r"words: expected one of torch.int8"),
    (lambda: gptq.pack_qweight(torch.zeros(32, 4, dtype=torch.uint8), 3, torch.int64),
     r"pack_dtype: 3-bit GPTQ is packed in torch.int32 words only, got torch.int64"),
    (lambda: gptq.pack_qweight(torch.zeros(32, 4, dtype=torch.uint8), 5), r"bits: continuous GPTQ .* got 5.*gptq_p"),
    (lambda: gptq.pack_qweight(torch.zeros(32, dtype=torch.uint8), 4), r"codes: expected a 2-D .* got shape \(32,\)"),
    (lambda: gptq.unpack_qweight(torch.zeros(3, 4, dtype=torch.int32), 4, 32),
     r"qweight: expected shape \[4, 4\], got \[3, 4\]"),
    (lambda: gptq.unpack_qzeros(torch.zeros(2, 1, dtype=torch.int32), 4, 16), r"qzeros: expected shape \[2, 2\]"),
    (lambda: gptq.pack_qzeros(torch.full((1, 8), 16), 4), r"zeros: true zero points must be in 0..15.*16..16"),
    (lambda: gptq.pack_qzeros(torch.zeros(1, 8), 4), r"zeros: expected an integer dtype.*torch.float32"),
])
def test_bad_inputs(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()


def test_scales_overflowing_float16_rejected() -> None:
    q = quantize_rtn(torch.randn(4, 32) * 1e7, bits=4, group_size=-1)
    with pytest.raises(ValueError, match=r"scales: .* not finite as torch.float16"):
        gptq.to_checkpoint(q, FORMAT.GPTQ_V2)


@pytest.mark.slow
@pytest.mark.parametrize("bits", [3, 4])
def test_full_size_matrix_round_trip(bits: int) -> None:
    codes = torch.randint(0, 1 << bits, (14336, 4096), dtype=torch.uint8)
    assert torch.equal(gptq.unpack_qweight(gptq.pack_qweight(codes, bits), bits, 14336), codes)
