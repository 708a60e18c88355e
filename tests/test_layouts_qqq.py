"""The QQQ layout (``layouts/qqq.py``) against formats.md 2.9: hand-worked words and scale orders, the independent
numpy oracle (``tests/oracle/qqq_numpy.py``), round trips, GPTQModel's packer arithmetic, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear.affine import AffineWeight
from qlinear.layouts import qqq
from qlinear.layouts.qqq import QQQWeight
from tests.oracle import qqq_numpy as ref


def random_weight(n: int, k: int, gs: int, seed: int = 0) -> QQQWeight:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-8, 8, (n, k), generator=g).to(torch.int8)
    group = (torch.rand(n, k // gs, generator=g) * 14 + 1).half() if gs < k else torch.empty(n, 0).half()
    return QQQWeight(codes, group, torch.rand(n, generator=g) * 1e-3 + 1e-5, gs)


def nibbles(word: int) -> list[int]:
    return [(word % (1 << 32) >> (4 * lane)) & 0xF for lane in range(8)]


# ---------------------------------------------------------------- formats.md 2.9 by hand
def test_first_words_by_hand() -> None:
    """code[k, n] = (k + 3 n) % 16 - 8 (distinct enough to tell positions apart). Word w = 4 i + t of B row 0 is
    lane i, tile t: rows 4 (i % 4) + 0..3 at column i // 4 then i // 4 + 8 of tile t, interleaved."""
    k, n = 16, 64
    kk, nn = torch.meshgrid(torch.arange(k), torch.arange(n), indexing="ij")
    codes = ((kk + 3 * nn) % 16 - 8).t().to(torch.int8).contiguous()  # [N, K]

    def code(r: int, c: int) -> int:
        return (r + 3 * c) % 16 - 8

    grouped = QQQWeight(codes, torch.ones(n, 2, dtype=torch.float16), torch.ones(n), 8)
    b = qqq.pack(grouped)["B"]
    # lane 0, tile 0: (0,0) (1,0) (2,0) (3,0) (0,8) (1,8) (2,8) (3,8) -> [0,2,4,6,1,3,5,7] -> stored code + 8
    assert nibbles(int(b[0, 0])) == [code(r, c) + 8 for r, c in ((0, 0), (2, 0), (0, 8), (2, 8), (1, 0), (3, 0),
                                                                   (1, 8), (3, 8))]
    # lane 0, tile 1: the same rows, columns 16 and 24
    assert nibbles(int(b[0, 1])) == [code(r, c) + 8 for r, c in ((0, 16), (2, 16), (0, 24), (2, 24), (1, 16),
                                                                   (3, 16), (1, 24), (3, 24))]
    # lane 5 (rows 4..7, column 1), tile 2 (columns 32..47): word 4 * 5 + 2
    assert nibbles(int(b[0, 22])) == [code(r, c) + 8 for r, c in ((4, 33), (6, 33), (4, 41), (6, 41), (5, 33),
                                                                    (7, 33), (5, 41), (7, 41))]
    channel = QQQWeight(codes, torch.empty(n, 0, dtype=torch.float16), torch.ones(n), k)
    b = qqq.pack(channel)["B"]
    # per-channel interleave [4,0,5,1,6,2,7,3]; nibbles are the codes' two's complement
    assert nibbles(int(b[0, 0])) == [code(r, c) & 15 for r, c in ((0, 8), (0, 0), (1, 8), (1, 0), (2, 8), (2, 0),
                                                                    (3, 8), (3, 0))]


def test_scale_orders_by_hand() -> None:
    n, k = 64, 256
    ch = torch.arange(n, dtype=torch.float32)
    group = torch.arange(n, dtype=torch.float16)[:, None].repeat(1, 2)
    t = qqq.pack(QQQWeight(torch.zeros(n, k, dtype=torch.int8), group, ch, 128))
    assert t["s_channel"].shape == (1, n) and t["s_channel"].dtype == torch.float32
    assert t["s_channel"][0, :16].tolist() == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3, 10, 11, 18, 19, 26, 27]
    assert t["s_channel"][0, 32:40].tolist() == [32, 33, 40, 41, 48, 49, 56, 57]
    assert t["s_group"].shape == (2, n) and t["s_group"].dtype == torch.float16
    assert t["s_group"][1, :10].tolist() == [0, 8, 16, 24, 32, 40, 48, 56, 1, 9]
    t = qqq.pack(QQQWeight(torch.zeros(n, k, dtype=torch.int8), torch.empty(n, 0).half(), ch, k))
    assert t["s_group"].shape == (0,) and t["s_group"].dtype == torch.float16


def test_int8_weight_by_hand() -> None:
    """Grouped: clamp(round_half_even(c * s)); per-channel: 16 c."""
    codes = torch.tensor([[-8, -3, 1, 7]], dtype=torch.int8).repeat(64, 4)  # [64, 16]
    s = torch.tensor([[2.5, 20.0]], dtype=torch.float16).repeat(64, 1)
    w = QQQWeight(codes, s, torch.ones(64), 8).int8_weight()
    assert w[0, :8].tolist() == [-20, -8, 2, 18, -20, -8, 2, 18]  # -7.5 -> -8, 2.5 -> 2, 17.5 -> 18
    assert w[0, 8:16].tolist() == [-128, -60, 20, 127, -128, -60, 20, 127]
    w = QQQWeight(codes, torch.empty(64, 0).half(), torch.ones(64), 16).int8_weight()
    assert w[0, :4].tolist() == [-128, -48, 16, 112]


# ---------------------------------------------------------------- against the numpy oracle
@pytest.mark.parametrize(("n", "k", "gs"), [(64, 32, 16), (128, 256, 128), (192, 128, 128), (64, 48, 48)])
def test_pack_matches_oracle(n: int, k: int, gs: int) -> None:
    w = random_weight(n, k, gs, seed=n + k)
    t = qqq.pack(w)
    grouped = gs < k
    np.testing.assert_array_equal(t["B"].numpy(), ref.pack_b(w.codes.numpy(), grouped))
    np.testing.assert_array_equal(t["s_channel"].numpy(), ref.permute_channel_scales(w.channel_scales.numpy()))
    if grouped:
        np.testing.assert_array_equal(t["s_group"].numpy(), ref.permute_group_scales(w.group_scales.t().numpy()))
    np.testing.assert_array_equal(ref.unpack_b(t["B"].numpy(), grouped), w.codes.numpy())
    want = ref.int8_weight(w.codes.numpy(), w.group_scales.numpy() if grouped else None, gs)
    np.testing.assert_array_equal(w.int8_weight().numpy(), want)
    deq = w.dequantize(torch.float64).numpy()
    f32 = want.astype(np.float32) * w.channel_scales.numpy()[:, None]  # one float32 product per weight
    np.testing.assert_array_equal(deq, f32.astype(np.float64))


@pytest.mark.parametrize(("n", "k", "gs"), [(64, 64, 16), (128, 384, 128), (256, 192, 192)])
def test_round_trip(n: int, k: int, gs: int) -> None:
    w = random_weight(n, k, gs, seed=7)
    back = qqq.unpack(qqq.pack(w))
    assert back.group_size == gs and back.grouped == (gs < k)
    for a, b in ((back.codes, w.codes), (back.group_scales, w.group_scales), (back.channel_scales, w.channel_scales)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    t = qqq.pack(w)
    assert all(torch.equal(qqq.pack(back)[name], t[name]) for name in t)


def test_unpack_per_channel_without_s_group() -> None:
    w = random_weight(64, 128, 128)
    t = qqq.pack(w)
    del t["s_group"]
    assert torch.equal(qqq.unpack(t).codes, w.codes)


# ---------------------------------------------------------------- GPTQModel's packer arithmetic (formats.md)
def test_from_fake_quantized_grouped() -> None:
    g = torch.Generator().manual_seed(3)
    n, k, gs = 64, 256, 128
    s = torch.rand(n, k // gs, generator=g) * 0.01 + 0.001
    q = torch.randint(0, 16, (n, k), generator=g)
    w = ((q - 8) * s.repeat_interleave(gs, 1)).half()
    extra = torch.rand(1, n, generator=g) * 0.001 + 1e-4
    qw = qqq.from_fake_quantized(w, s, extra, gs)
    want = np.clip(np.rint(w.float().numpy() / np.repeat(s.numpy(), gs, 1)) + 8, 0, 15) - 8
    np.testing.assert_array_equal(qw.codes.numpy(), want)
    np.testing.assert_array_equal(qw.group_scales.numpy(), (s / extra.t()).half().numpy())
    assert torch.equal(qw.channel_scales, extra[0])


def test_from_fake_quantized_per_channel_and_wrap_refused() -> None:
    n, k = 64, 64
    s = torch.full((n, 1), 0.5)
    w = torch.zeros(n, k)
    w[:, 0] = -3.5  # -7, -8 after rounding half to even
    w[:, 1] = 3.0
    qw = qqq.from_fake_quantized(w, s, None, -1)
    assert qw.codes[0, :2].tolist() == [-7, 6] and not qw.grouped
    assert torch.equal(qw.channel_scales, torch.full((n,), 0.5 / 16))
    w[0, 2] = 4.5  # code 9: GPTQModel would store nibble 9, read back as -7
    with pytest.raises(ValueError, match="reach -7..9"):
        qqq.from_fake_quantized(w, s, None, -1)


def test_affine_per_channel_round_trip_and_grouped_refused() -> None:
    w = random_weight(64, 128, 128)
    q = qqq.to_affine(w)
    assert torch.equal(q.dequantize(torch.float64), w.dequantize(torch.float64))
    back = qqq.from_affine(q)
    assert torch.equal(back.codes, w.codes) and torch.equal(back.channel_scales, w.channel_scales)
    with pytest.raises(ValueError, match="no exact AffineWeight form"):
        qqq.to_affine(random_weight(64, 256, 128))
    asym = AffineWeight(q.codes, q.scales, torch.full_like(q.zeros, 7), q.g_idx, 4, 128, False)
    with pytest.raises(ValueError, match="zero points of 8"):
        qqq.from_affine(asym)


# ---------------------------------------------------------------- errors name what was expected and found
def test_errors() -> None:
    w = random_weight(64, 128, 64)
    t = qqq.pack(w)
    with pytest.raises(ValueError, match=r"s_channel: expected torch.float32 shape \[1, 64\].*float16"):
        qqq.unpack({**t, "s_channel": t["s_channel"].half()})
    with pytest.raises(ValueError, match=r"s_group: expected float16 \[K/group_size, 64\]"):
        qqq.unpack({**t, "s_group": torch.zeros(3, 64, dtype=torch.float16)})
    with pytest.raises(ValueError, match="B: expected an int32"):
        qqq.unpack({**t, "B": t["B"].to(torch.int64)})
    with pytest.raises(ValueError, match="out_features 32 not a multiple of 64"):
        qqq.pack(random_weight(32, 128, 128))
    with pytest.raises(ValueError, match=r"codes: signed 4-bit codes must lie in -8..7, found -8..8"):
        QQQWeight(torch.tensor([[-8, 8]], dtype=torch.int8), torch.empty(1, 0).half(), torch.ones(1), 2)
    with pytest.raises(ValueError, match=r"group_scales: expected float16 shape \[1, 2\]"):
        QQQWeight(torch.zeros(1, 4, dtype=torch.int8), torch.ones(1, 2), torch.ones(1), 2)
    with pytest.raises(ValueError, match="s_extra: a grouped QQQ layer needs"):
        qqq.from_fake_quantized(torch.zeros(64, 256), torch.ones(64, 2), None, 128)
    assert qqq.kernel_tile_errors(128, 64) == [] and qqq.kernel_tile_errors(64, 64)
    assert qqq.layout_errors(72, 64, 72) == ["in_features 72 not a multiple of 16 (16x16 weight tiles)"]
