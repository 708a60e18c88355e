"""gemm5's split last wave: which columns leave the grid (``qmm5.wave_tail``), and that the launcher hands the
second launch the right slices of the weight, scales, zeros, bias and output. The kernel itself needs an sm_90
GPU (``benchmarks/gpu_check.py`` runs ``gemm5@t2``); here the launches are recorded instead of run."""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

import pytest
import torch

from qlinear.kernels.triton.configs import Config


def _qmm5() -> ModuleType:
    """``qmm5``, imported when a test runs: Triton imported at collection, before the interpreter test modules set
    TRITON_INTERPRET, would decorate its own helpers for the compiler and break those modules' kernels."""
    pytest.importorskip("triton.experimental.gluon")
    from qlinear.kernels.triton import qmm5

    return qmm5


@pytest.mark.parametrize(("tiles_m", "tiles_n", "slots", "split", "expected"), [
    (4, 112, 132, 2, 13),  # 448 tiles: 3 waves of 132 hold 99 whole columns; 13 x 4 tiles x 2 = 104 CTAs fit
    (4, 112, 132, 3, 0),  # 13 x 4 x 3 = 156 CTAs: a wave and a bit, no gain
    (2, 224, 132, 2, 26),  # 448 tiles of 2 rows: 66 columns a wave, 3 waves = 198; 26 x 2 x 2 = 104
    (1, 224, 132, 2, 0),  # 1.7 waves: 92 tiles x 2 = 184 CTAs do not fit one wave
    (4, 33, 132, 2, 0),  # exactly one wave: nothing left over
    (4, 20, 132, 2, 0),  # under one wave: split-K's business, not the tail's
    (4, 112, 132, 1, 0),  # no split asked
])
def test_wave_tail_takes_whole_columns_that_fit_one_wave_split(tiles_m: int, tiles_n: int, slots: int,
                                                               split: int, expected: int) -> None:
    assert _qmm5().wave_tail(tiles_m, tiles_n, slots, split) == expected


def test_resident_counts_two_ctas_only_under_the_register_cap() -> None:
    qmm5 = _qmm5()
    p = SimpleNamespace(scales=torch.empty(1, dtype=torch.bfloat16), group=128, bits=4, offsets=None, supers=None)
    assert qmm5.resident(Config("gemm5", 64, 64, 128, 1, 4, 4, max_registers=128), 128, p) == 2
    assert qmm5.resident(Config("gemm5", 64, 64, 128, 1, 4, 4), 128, p) == 1
    # 4 stages of a 128x128-code x tile (32 KiB) and its words: two rings do not fit in 227 KiB
    assert qmm5.resident(Config("gemm5", 128, 64, 128, 1, 4, 4, max_registers=128), 128, p) == 1


def _layer(n: int, k: int, zeros: bool) -> object:
    from qlinear.kernels.triton.layout import build

    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=gen)
    scales = torch.rand(n, k // 128, generator=gen) + 0.5
    z = torch.randint(0, 16, (n, k // 128), generator=gen) if zeros else torch.full((n, k // 128), 8)
    return build(codes, scales, z.to(torch.int32), torch.arange(k) // 128, 4, torch.bfloat16)


@pytest.mark.parametrize("zeros", [False, True])
def test_tail_launch_gets_the_last_columns_of_every_tensor(monkeypatch: pytest.MonkeyPatch, zeros: bool) -> None:
    qmm5 = _qmm5()
    p = _layer(1000, 256, zeros)
    assert (p.zeros is not None) == zeros
    m = 1100
    x = torch.randn(m, 256, dtype=torch.bfloat16)
    y = torch.empty(m, 1000, dtype=torch.bfloat16)
    bias = torch.randn(1000, dtype=torch.bfloat16)
    lock = torch.zeros(4096, dtype=torch.int32)
    calls = []
    monkeypatch.setattr(qmm5, "gluon_inputs", lambda x2, p, cfg: (x2, x2.shape[1], cfg.block_k))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(qmm5, "_launch", lambda descs, p, cfg, m, n, split, b, lk, out: calls.append(
        (descs, n, split, b, out)))
    cfg = Config("gemm5", 64, 64, 64, 1, 4, 4, tail_split=2)  # 18 x 16 tiles, one CTA an SM: 2 columns left
    assert qmm5.qmm5(x, p, cfg, bias, lock, y) is y, "the whole output, not the tail's view"
    (main, n0, s0, b0, y0), (tail, n1, s1, b1, y1) = calls
    c0 = 14 * 64
    assert (n0, s0, n1, s1) == (c0, 1, 1000 - c0, 2)
    assert b0.data_ptr() == bias.data_ptr() and b1.data_ptr() == bias[c0:].data_ptr()
    assert y0.data_ptr() == y.data_ptr() and y1.data_ptr() == y[:, c0:].data_ptr() and y1.stride(0) == 1000
    assert main[0] is tail[0], "both launches read the same activations"
    for i, full in enumerate((p.qweight, p.scales, p.zeros if zeros else p.scales), start=1):
        assert main[i].base.data_ptr() == full.data_ptr()
        assert tail[i].base.data_ptr() == full[:, c0:].data_ptr(), f"descriptor {i} of the tail"
        assert list(tail[i].shape) == [full.shape[0], full.shape[1] - c0]
        assert tail[i].strides[0] == full.stride(0)

    calls.clear()
    qmm5.qmm5(x, p, Config("gemm5", 64, 64, 64, 1, 4, 4), bias, lock, y)  # no tail split asked: one launch
    assert [(n, split) for _, n, split, _, _ in calls] == [(1000, 1)]
