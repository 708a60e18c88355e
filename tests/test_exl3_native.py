"""The native extra's EXL3 kernels (``qlinear_native._exl3``, used by ``ExllamaV3TorchLinear`` on CPU) against
``layouts.exl3.inner_weight`` (the torch decode, itself checked against exllamav3's CUDA arithmetic in
``test_exl3*.py``): the tile decode gives the same float32 values bit for bit, for every width and codebook, with the
values looked up or computed (every one of the 65536 states), tile ranges included; ``exl3_mv`` matches a float64
product of those values; the layer's output is unchanged. Skipped without the extra (``pip install ./native``)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from qlinear.kernels import exl3 as kexl3
from qlinear.layouts import exl3

pytestmark = pytest.mark.skipif(importlib.util.find_spec("qlinear_native") is None
                                or importlib.util.find_spec("qlinear_native._exl3") is None,
                                reason="the native extra is not installed: pip install ./native")


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("codebook", exl3.CODEBOOKS)
def test_tiles_equal_the_torch_decode(bits: int, codebook: str) -> None:
    gen = torch.Generator().manual_seed(bits)
    kt, nt = 3, 5
    trellis = torch.randint(-(1 << 15), 1 << 15, (kt, nt, 16 * bits), generator=gen, dtype=torch.int16)
    table = exl3.codebook_table(codebook)
    for t0, t1 in ((0, nt), (2, 4)):
        want = exl3.inner_weight(trellis, bits, table, t0, t1).float()
        out = torch.full((16 * kt, 16 * (t1 - t0) + 3), float("nan"))  # a wider row stride than the tiles
        for mode in (codebook, "table"):
            out = torch.full((16 * kt, 16 * (t1 - t0) + 3), float("nan"))  # a wider row stride than the tiles
            kexl3.native_decoder().exl3_decode(trellis.data_ptr(), kexl3.table32(codebook).data_ptr(),
                                               out.data_ptr(), kt, nt, bits, t0, t1, out.shape[1], 2, mode)
            assert torch.equal(out[:, :16 * (t1 - t0)], want)
            assert bool(out[:, 16 * (t1 - t0):].isnan().all())  # nothing written past the tiles


@pytest.mark.parametrize("codebook", exl3.CODEBOOKS)
def test_every_state_computed_as_the_table(codebook: str) -> None:
    """The computed values (3inst / mcg / mul1 arithmetic) equal the table's for all 65536 states: random 8-bit
    tiles whose states, read back through an identity table, are checked to cover every state."""
    kt, nt, bits = 64, 80, 8
    trellis = torch.randint(-(1 << 15), 1 << 15, (kt, nt, 16 * bits), generator=torch.Generator().manual_seed(11),
                            dtype=torch.int16)
    states = exl3.inner_weight(trellis, bits, torch.arange(1 << 16, dtype=torch.float32))
    assert torch.unique(states).numel() == 1 << 16  # every state occurs
    out = torch.empty(16 * kt, 16 * nt)
    kexl3.native_decoder().exl3_decode(trellis.data_ptr(), kexl3.table32(codebook).data_ptr(), out.data_ptr(), kt,
                                       nt, bits, 0, nt, 16 * nt, 2, codebook)
    assert torch.equal(out, exl3.codebook_table(codebook).float()[states.long()])


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16, 19])
def test_mv_matches_float64(bits: int, m: int) -> None:
    """``exl3_mv`` (decoded in registers, passes of up to 16 rows) against float64 ``x @ W`` of the torch decode."""
    gen = torch.Generator().manual_seed(bits * 100 + m)
    kt, nt = 24, 70  # 70 column tiles over 2 threads: blocks of 32 tiles and a short last block
    trellis = torch.randint(-(1 << 15), 1 << 15, (kt, nt, 16 * bits), generator=gen, dtype=torch.int16)
    w = exl3.inner_weight(trellis, bits, exl3.codebook_table("3inst")).double()
    x = torch.randn(m, 16 * kt, generator=gen)
    y = torch.full((m, 16 * nt), float("nan"))
    kexl3.native_decoder().exl3_mv(trellis.data_ptr(), kexl3.table32("3inst").data_ptr(), x.data_ptr(),
                                   y.data_ptr(), m, kt, nt, bits, 2, "3inst")
    want = x.double() @ w
    assert float((y.double() - want).abs().max() / want.abs().max()) < 1e-5


def test_layer_output_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    from qlinear.kernels.exl3 import ExllamaV3TorchLinear
    from qlinear.spec import Scheme

    gen = torch.Generator().manual_seed(0)
    k, n = 256, 384
    s = Scheme(bits=3, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
               pack_dtype=torch.int16, layout_params=exl3.Exl3Params(3, "3inst"))
    layer = ExllamaV3TorchLinear(s, bias=True, dtype=torch.bfloat16)
    layer.load_exl3({"trellis": torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 48), generator=gen,
                                              dtype=torch.int16),
                     "suh": (torch.randn(k, generator=gen) * 0.05).half(),
                     "svh": (torch.randn(n, generator=gen) * 0.05).half(),
                     "bias": torch.randn(n, generator=gen).half()})
    monkeypatch.setattr(kexl3, "TILE_ELEMENTS", k * 128)  # several tiles, the last one the same width
    x = torch.randn(20, k, generator=gen).bfloat16()  # above NATIVE_MV_ROWS: the decoded tiles
    few = x[:3]  # exl3_mv
    fast, fast_few = layer(x), layer(few)
    monkeypatch.setattr(kexl3, "native_decoder", lambda: None)
    assert torch.equal(fast, layer(x))  # the same float32 tiles, the same matmul
    torch.testing.assert_close(fast_few, layer(few), rtol=8e-3, atol=1e-2)  # float32 sums in another order


def test_bad_sizes_are_named() -> None:
    trellis = torch.zeros(1, 2, 32, dtype=torch.int16)
    out = torch.empty(16, 16)
    with pytest.raises(ValueError, match=r"nt0 < nt1 <= NT.*nt1=3"):
        kexl3.native_decoder().exl3_decode(trellis.data_ptr(), kexl3.table32("3inst").data_ptr(), out.data_ptr(),
                                           1, 2, 2, 0, 3, 16, 1, "3inst")
    with pytest.raises(ValueError, match=r"expected codebook '3inst', 'mcg', 'mul1' or 'table', got 'qtip'"):
        kexl3.native_decoder().exl3_decode(trellis.data_ptr(), kexl3.table32("3inst").data_ptr(), out.data_ptr(),
                                           1, 2, 2, 0, 2, 16, 1, "qtip")
    with pytest.raises(ValueError, match=r"exl3_mv: expected M, KT, NT >= 1.*M=0"):
        kexl3.native_decoder().exl3_mv(trellis.data_ptr(), kexl3.table32("3inst").data_ptr(), out.data_ptr(),
                                       out.data_ptr(), 0, 1, 2, 2, 1, "3inst")
