"""Element codecs (FP8 E4M3/E5M2, FP4 E2M1, E8M0) against the float64 oracle and torch's own float8 casts."""

from __future__ import annotations

import math

import pytest
import torch

from qlinear.blockfloat import FloatWeight
from qlinear.floats import Element, decode, e8m0_decode, encode, pack_nibbles, unpack_nibbles
from tests.oracle import float_numpy as ref


@pytest.mark.parametrize(("element", "kind"), [(Element.E4M3, "e4m3"), (Element.E5M2, "e5m2")])
def test_every_fp8_code_decodes_as_the_definition_says(element: Element, kind: str) -> None:
    got = decode(torch.arange(256, dtype=torch.uint8), element, torch.float64).tolist()
    want = [ref.fp8_value(c, kind) for c in range(256)]
    for c, (g, w) in enumerate(zip(got, want)):
        assert (math.isnan(g) and math.isnan(w)) or g == w, f"code 0x{c:02x}: {g} != {w}"


def test_every_fp4_code_and_e8m0() -> None:
    got = decode(torch.arange(16, dtype=torch.uint8), Element.E2M1, torch.float64).tolist()
    assert got == [ref.fp4_value(c) for c in range(16)]
    assert got[:8] == [0, 0.5, 1, 1.5, 2, 3, 4, 6] and got[8] == 0.0 and math.copysign(1, got[8]) == -1
    e = torch.tensor([0, 1, 126, 127, 128, 254], dtype=torch.uint8)
    assert e8m0_decode(e, torch.float64).tolist() == [ref.e8m0_value(int(c)) for c in e]
    with pytest.raises(ValueError, match=r"E8M0 exponent 255 \(NaN\)"):
        e8m0_decode(torch.tensor([3, 255], dtype=torch.uint8))


@pytest.mark.parametrize("element", [Element.E4M3, Element.E5M2])
def test_encode_rounds_like_torchs_float8_cast(element: Element) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50_000, generator=g, dtype=torch.float64) * torch.exp(torch.randn(50_000, generator=g,
                                                                                       dtype=torch.float64) * 5)
    x = torch.cat([x, torch.tensor([0.0, -0.0, 2.0 ** -10, -(2.0 ** -9) * 1.5, element.max, -element.max])])
    x = x.clamp(-element.max, element.max)
    assert torch.equal(encode(x, element), x.to(element.torch_dtype).view(torch.uint8))


def test_encode_saturates_keeps_negative_zero_and_refuses_nan() -> None:
    codes = encode(torch.tensor([1e6, -1e6, -0.0, -1e-30]), Element.E4M3)
    assert codes.tolist() == [0x7E, 0xFE, 0x80, 0x80]
    with pytest.raises(ValueError, match="NaN has no code"):
        encode(torch.tensor([1.0, float("nan")]), Element.E4M3)


def test_fp4_ties_round_to_even_like_compressed_tensors() -> None:
    # compressed-tensors' cast_to_fp4 boundaries: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.01, 7.0, -0.26, -0.1])
    values = decode(encode(x, Element.E2M1), Element.E2M1).tolist()
    assert values == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.5, -0.0]


def test_nibbles_low_is_the_even_column() -> None:
    codes = torch.tensor([[1, 2, 3, 15], [8, 0, 7, 9]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0xF3], [0x08, 0x97]]
    assert torch.equal(unpack_nibbles(packed), codes)
    with pytest.raises(ValueError, match="K even"):
        pack_nibbles(torch.zeros(2, 3, dtype=torch.uint8))


def _fw(**kw: object) -> FloatWeight:
    base: dict[str, object] = dict(codes=torch.zeros(4, 8, dtype=torch.uint8), element="e4m3",
                                   scales=torch.ones(4, 1), block=(1, 8))
    base.update(kw)
    return FloatWeight(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kw", "needle"), [
    ({"scales": torch.ones(4, 2)}, r"scales: expected shape \[4, 1\] for a \[4, 8\] weight in blocks of \(1, 8\)"),
    ({"scales": torch.tensor([[1.0], [float("nan")], [1.0], [1.0]])}, r"must be finite; found nan at block \[1, 0\]"),
    ({"scales": torch.tensor([[1.0], [0.0], [1.0], [1.0]]), "rule": "divide"}, "finite and non-zero"),
    ({"codes": torch.full((4, 8), 0x7F, dtype=torch.uint8)}, r"code 0x7f at \[out=0, in=0\] is not a finite"),
    ({"codes": torch.zeros(4, 8, dtype=torch.int8)}, "codes: expected torch.uint8"),
    ({"element": "fp6"}, "unknown float element format 'fp6'"),
    ({"scales": torch.ones(4, 1, dtype=torch.int32)}, "scales: expected one of"),
])
def test_bad_float_weights_are_named(kw: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        _fw(**kw)
