"""Marlin's tile layout (layouts/marlin.py, layouts/marlin_weight.py): formats.md 2.8's bit positions on codes placed
by hand, and agreement with the independent numpy oracle (tests/oracle/marlin_numpy.py, the legacy procedure)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear import AffineWeight, Scheme
from qlinear.layouts import marlin as m
from qlinear.layouts import marlin_weight as mw
from tests.oracle import marlin_numpy as oracle


def word(v: int) -> int:
    """A 32-bit pattern as the signed int32 value torch stores."""
    return v - (1 << 32) if v >= 1 << 31 else v


def placed(k: int, n: int, where: dict[tuple[int, int], int]) -> torch.Tensor:
    codes = torch.zeros(k, n, dtype=torch.uint8)
    for (r, c), v in where.items():
        codes[r, c] = v
    return codes


# ------------------------------------------------------------------ worked bit positions (formats.md 2.8)
def test_4bit_nibbles_of_a_tile_word() -> None:
    where = {(0, 0): 1, (8, 0): 2, (0, 8): 3, (8, 8): 4, (1, 0): 5, (9, 0): 6, (1, 8): 7, (9, 8): 8,  # lane 0, j 0
             (2, 33): 9, (11, 41): 15,  # lane 5, sub-tile 2: r = 2, c = 16*2 + 1 -> word 4*5 + 2 = 22
             (16, 64): 10}  # tile (k_tile 1, n_tile 1) starts at word (1*2 + 1) * 128 = 384 = [1, 128]
    q = m.pack_weight(placed(32, 128, where), 4)
    assert q.shape == (2, 256) and q.dtype == torch.int32
    assert q[0, 0].item() == word(0x87654321)
    assert q[0, 22].item() == word(0xF0000009)
    assert q[1, 128].item() == 0xA
    assert int((q != 0).sum()) == 3


def test_8bit_bytes_of_tile_words() -> None:
    where = {(0, 0): 0x11, (8, 0): 0x22, (1, 0): 0x33, (9, 0): 0x44,  # word 0: column c
             (0, 8): 0x55, (8, 8): 0x66, (1, 8): 0x77, (9, 8): 0x88,  # word 1: column c + 8
             (2, 48): 1, (11, 56): 2}  # lane 1, sub-tile 3: r = 2, c = 48 -> words 8*1 + 2*3 = 14 and 15
    q = m.pack_weight(placed(16, 64, where), 8)
    assert q.shape == (1, 256)
    assert q[0, :2].tolist() == [0x44332211, word(0x88776655)]
    assert q[0, 14:16].tolist() == [1, 0x02000000]
    assert int((q != 0).sum()) == 4


def test_gptq_word_of_the_spec_repacks_to_four_lanes() -> None:
    """formats.md 2.2: GPTQ column 0 holding codes 1..8 for k = 0..7 is 0x87654321. Rows r and r+1 share a lane
    (nibbles 0 and 4), so the eight codes land in lanes 0..3 (words 0, 4, 8, 12) of Marlin."""
    qweight = torch.zeros(2, 64, dtype=torch.int32)
    qweight[0, 0] = word(0x87654321)
    q = m.gptq_to_marlin(qweight, 4)
    assert q[0, [0, 4, 8, 12]].tolist() == [0x00020001, 0x00040003, 0x00060005, 0x00080007]
    assert int((q != 0).sum()) == 4
    assert torch.equal(m.marlin_to_gptq(q, 4, 16, 64), qweight)


def test_awq_word_of_the_spec_repacks_to_eight_lanes() -> None:
    """formats.md 2.5: AWQ word 0x75316420 holds codes 0..7 in columns 0..7. Column c is lane 4c (word 16c)."""
    qweight = torch.zeros(16, 8, dtype=torch.int32)
    qweight[0, 0] = word(0x75316420)
    q = m.awq_to_marlin(qweight, 4)
    assert q[0, ::16].tolist() == list(range(8)) and int((q != 0).sum()) == 7
    assert torch.equal(m.marlin_to_awq(q, 4, 16, 64), qweight)


def test_act_order_gathers_rows_through_perm() -> None:
    codes = placed(16, 64, {(k, 0): k for k in range(16)})
    g_sorted, perm = m.sort_g_idx(torch.arange(16, dtype=torch.int32) % 2)
    assert perm.tolist() == [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15]
    assert g_sorted.tolist() == [0] * 8 + [1] * 8 and g_sorted.dtype == perm.dtype == torch.int32
    q = m.pack_weight(codes, 4, perm)  # tiled row k is source row perm[k]: rows 0, 8, 1, 9 -> sources 0, 1, 2, 3
    assert q[0, 0].item() == 0x00320010
    assert torch.equal(m.unpack_weight(q, 4, 16, 64, perm), codes)


def test_scale_permutations_of_the_spec() -> None:
    grouped = m.permute_scales(torch.arange(128.0).reshape(2, 64))
    assert grouped[0, :16].tolist() == [0, 8, 16, 24, 32, 40, 48, 56, 1, 9, 17, 25, 33, 41, 49, 57]
    assert grouped[1, :8].tolist() == [64, 72, 80, 88, 96, 104, 112, 120]
    single = m.permute_scales(torch.arange(64.0)[None])
    assert single[0, :32].tolist() == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27,
                                       4, 5, 12, 13, 20, 21, 28, 29, 6, 7, 14, 15, 22, 23, 30, 31]
    assert single[0, 32:40].tolist() == [32, 33, 40, 41, 48, 49, 56, 57]
    assert torch.equal(m.permute_bias(torch.arange(64.0)), single[0])
    assert torch.equal(m.unpermute_bias(m.permute_bias(torch.arange(128.0))), torch.arange(128.0))


def test_zero_points_of_the_spec() -> None:
    z4 = (torch.arange(64, dtype=torch.int32) // 4)[None]  # 64-rule: old 0,8,..,56; interleave: 0,16,32,48,8,...
    assert m.pack_zeros(z4, 4)[0, 0].item() == word(0xEA62C840)
    z8 = torch.arange(64, dtype=torch.int32)[None]
    assert m.pack_zeros(z8, 8)[0, :2].tolist() == [0x18081000, 0x38283020]
    awq = torch.zeros(1, 8, dtype=torch.int32)
    awq[0, 0] = word(0x75316420)  # AWQ zeros 0..7 in columns 0..7 (formats.md 2.5)
    assert torch.equal(m.unpack_zeros(m.awq_to_marlin_zeros(awq, 4), 4)[0, :8], torch.arange(8, dtype=torch.int32))
    assert torch.equal(m.marlin_to_awq_zeros(m.awq_to_marlin_zeros(awq, 4), 4), awq)


# ------------------------------------------------------------------ the independent legacy procedure
SHAPES = [(16, 64), (48, 192), (64, 128)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_weights_agree_with_the_legacy_procedure(bits: int, k: int, n: int) -> None:
    g = torch.Generator().manual_seed(k * n + bits)
    codes = torch.randint(0, 1 << bits, (k, n), generator=g, dtype=torch.uint8)
    perm = torch.randperm(k, generator=g)
    assert np.array_equal(m.pack_weight(codes, bits).numpy(), oracle.marlin_weight(codes.numpy(), bits))
    assert np.array_equal(m.pack_weight(codes, bits, perm).numpy(),
                          oracle.marlin_weight(codes.numpy(), bits, perm.tolist()))
    words = torch.randint(-2**31, 2**31, (k * bits // 32, n), generator=g, dtype=torch.int64).to(torch.int32)
    want = oracle.marlin_weight(oracle.gptq_codes(words.numpy(), bits), bits, perm.tolist())
    assert np.array_equal(m.gptq_to_marlin(words, bits, perm).numpy(), want)
    awq = torch.randint(-2**31, 2**31, (k, n * bits // 32), generator=g, dtype=torch.int64).to(torch.int32)
    assert np.array_equal(m.awq_to_marlin(awq, bits).numpy(), oracle.marlin_weight(oracle.awq_values(awq.numpy(),
                                                                                                      bits), bits))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("groups", [1, 3])
def test_scales_zeros_bias_agree_with_the_spec_tables(bits: int, groups: int) -> None:
    g = torch.Generator().manual_seed(groups * 10 + bits)
    s = torch.rand(groups, 192, generator=g).half()
    assert np.array_equal(m.permute_scales(s).numpy(), oracle.marlin_scales(s.numpy()))
    z = torch.randint(0, 1 << bits, (groups, 192), generator=g, dtype=torch.int32)
    assert np.array_equal(m.pack_zeros(z, bits).numpy(), oracle.marlin_zeros(z.numpy(), bits))
    b = torch.randn(192, generator=g)
    assert np.array_equal(m.permute_bias(b).numpy(), oracle.marlin_bias(b.numpy()))


# ------------------------------------------------------------------ round trips
def affine(n: int, k: int, gs: int, bits: int, sym: bool, act_order: bool = False, seed: int = 0) -> AffineWeight:
    g = torch.Generator().manual_seed(seed)
    groups, maxq = -(-k // gs), (1 << bits) - 1
    zeros = torch.full((n, groups), 1 << (bits - 1), dtype=torch.int32) if sym else \
        torch.randint(0, maxq + 1, (n, groups), generator=g, dtype=torch.int32)
    g_idx = torch.arange(k, dtype=torch.int32) // gs
    if act_order:
        g_idx = g_idx[torch.randperm(k, generator=g)]
    return AffineWeight(codes=torch.randint(0, maxq + 1, (n, k), generator=g, dtype=torch.uint8),
                        scales=(torch.rand(n, groups, generator=g) * 0.05 + 1e-3).half(), zeros=zeros, g_idx=g_idx,
                        bits=bits, group_size=gs, sym=sym)


def same(a: AffineWeight, b: AffineWeight) -> bool:
    return (torch.equal(a.codes, b.codes) and torch.equal(a.zeros.int(), b.zeros.int())
            and torch.equal(a.scales, b.scales) and torch.equal(a.g_idx.int(), b.g_idx.int())
            and (a.bits, a.group_size, a.sym) == (b.bits, b.group_size, b.sym))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("gs", "sym", "act"), [(32, True, False), (128, True, False), (32, False, False),
                                                (32, True, True), (64, False, True), (128, False, False)])
def test_kernel_tensors_round_trip(bits: int, gs: int, sym: bool, act: bool) -> None:
    q = affine(192, 128, gs, bits, sym, act, seed=gs + bits)
    t = mw.to_marlin(q)
    assert ("qzeros" in t) == (not sym) and ("perm" in t) == ("g_idx" in t) == act
    assert t["qweight"].shape == (8, 192 * 16 * bits // 32) and t["scales"].shape == (-(-128 // gs), 192)
    if act:
        assert bool((t["g_idx"][1:] >= t["g_idx"][:-1]).all())
        codes = q.codes.t().numpy()
        assert np.array_equal(t["qweight"].numpy(), oracle.marlin_weight(codes, bits, t["perm"].tolist()))
    back = mw.from_marlin(t, bits, 128, 192, gs)
    assert same(q, back)
    want = oracle.dequantize(q.codes.t().numpy(), q.scales.t().numpy(), q.zeros.t().numpy(), q.g_idx.tolist())
    assert np.array_equal(back.dequantize(torch.float64).t().numpy(), want)


def test_legacy_checkpoint_round_trip_and_refusals() -> None:
    for gs in (128, 256):
        q = affine(256, 256, gs, 4, sym=True, seed=gs)
        t = mw.to_checkpoint(q)
        assert set(t) == {"B", "s"} and t["B"].shape == (16, 512) and t["s"].dtype == torch.float16
        scheme = Scheme(bits=4, group_size=gs, in_features=256, out_features=256, format="marlin")
        assert same(q, mw.from_checkpoint(t, scheme))
    bad = affine(64, 96, 32, 8, sym=False, act_order=True)
    with pytest.raises(ValueError) as err:
        mw.to_checkpoint(bad)
    msg = str(err.value)
    for part in ("bits: Marlin checkpoints hold 4-bit codes, got 8-bit", "act-order", "in_features % 128",
                 "group size 128 or -1"):
        assert part in msg, part
    asym = affine(256, 128, 128, 4, sym=False, seed=3)
    with pytest.raises(ValueError, match=r"symmetric \(every zero point 8, none stored\); found \d+ at"):
        mw.to_checkpoint(asym)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("call", "message"), [
    (lambda: m.pack_weight(torch.zeros(8, 64, dtype=torch.uint8), 4), "K a positive multiple of 16, got 8"),
    (lambda: m.pack_weight(torch.zeros(16, 96, dtype=torch.uint8), 4), "N a positive multiple of 64, got 96"),
    (lambda: m.pack_weight(torch.zeros(16, 64, dtype=torch.uint8), 3), "4 or 8 bits, got 3"),
    (lambda: m.pack_weight(torch.zeros(16, 64), 4), "expected an integer dtype"),
    (lambda: m.pack_weight(torch.full((16, 64), 16, dtype=torch.uint8), 4), "values must be in 0..15"),
    (lambda: m.pack_weight(torch.zeros(16, 64, dtype=torch.uint8), 4, torch.zeros(16, dtype=torch.long)),
     "permutation of 0..15"),
    (lambda: m.pack_weight(torch.zeros(16, 64, dtype=torch.uint8), 4, torch.arange(8)), "expected 16 entries"),
    (lambda: m.unpack_weight(torch.zeros(1, 128, dtype=torch.int64), 4, 16, 64), "expected dtype torch.int32"),
    (lambda: m.unpack_weight(torch.zeros(1, 64, dtype=torch.int32), 4, 16, 64), "expected shape [1, 128]"),
    (lambda: m.gptq_to_marlin(torch.zeros(2, 64, dtype=torch.int16), 4), "expected GPTQ int32 words"),
    (lambda: m.awq_to_marlin(torch.zeros(16, 4), 8), "expected AWQ int32 words"),
    (lambda: m.permute_scales(torch.ones(2, 32)), "N a multiple of 64, got [2, 32]"),
    (lambda: m.permute_scales(torch.ones(2, 64, dtype=torch.int32)), "expected a floating dtype"),
    (lambda: m.permute_scales(torch.ones(64)), "expected a 2-D tensor"),
    (lambda: m.pack_zeros(torch.ones(1, 64), 4), "expected an integer dtype"),
    (lambda: m.sort_g_idx(torch.ones(8)), "g_idx: expected an integer dtype"),
    (lambda: mw.from_marlin({"qweight": torch.zeros(1, 128, dtype=torch.int32), "scales": torch.ones(1, 64),
                             "perm": torch.arange(16)}, 4, 16, 64, -1), "act-order needs both"),
    (lambda: mw.from_marlin({"qweight": torch.zeros(1, 128, dtype=torch.int32), "scales": torch.ones(2, 64)},
                            4, 16, 64, -1), "scales: expected shape [1, 64]"),
])
def test_bad_input_names_what_was_expected(call, message: str) -> None:
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)
