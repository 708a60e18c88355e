"""gemv_tc's x operands, in Triton's CPU interpreter: which activation pair each lane holds.

Both ways of loading them (each lane its own 4-byte pairs, or one coalesced tile dealt out by a reshape and
a permute) must give lane ``(w, g, t)``, column ``j`` of tensor ``i`` the pair at sorted K positions
``kbase + (t // HR) NF R + 2 (t % HR) + f R`` (+1), ``f = 4 i + j``, of row ``srow + g``: the field ``f`` of the
lane's word rows ``2 (t % HR)``, ``+1`` (``qmv_tc.py``). The expectation is computed here from that formula.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

from tests.triton_interp import interpreted

triton = pytest.importorskip("triton", reason="triton is not installed")
tl = triton.language

from qlinear.kernels.triton import qmv_tc_x  # noqa: E402  (after TRITON_INTERPRET)


@triton.jit
def _probe(X, OUT, M, KX, stride32, kbase, srow, ok, NF: tl.constexpr, R: tl.constexpr, WN: tl.constexpr,
           STAGE: tl.constexpr):
    L: tl.constexpr = 32 * WN
    HR: tl.constexpr = R // 2
    lane = tl.arange(0, L)[:, None]
    g = (lane % 32) // 4
    t = lane % 4
    koff = (t // HR) * (NF * R) + 2 * (t % HR)
    xm = srow + g
    xbase = xm * stride32 + koff // 2
    X32 = X.to(tl.pointer_type(tl.int32), bitcast=True)
    x0, x1, x2, x3 = qmv_tc_x.chunk_x(X32, xbase, koff, (xm < M) & ok, srow, M, stride32, ok, kbase, kbase, NF,
                                      R, WN, KX, False, STAGE)
    c = tl.arange(0, 4)[None, :]
    tl.store(OUT + lane * 16 + c, x0)
    tl.store(OUT + lane * 16 + 4 + c, x1)
    tl.store(OUT + lane * 16 + 8 + c, x2)
    tl.store(OUT + lane * 16 + 12 + c, x3)


def expected(x: np.ndarray, m: int, kx: int, kbase: int, srow: int, nf: int, r: int, wn: int) -> np.ndarray:
    """[32 wn, 16] int32: per lane, the four tensors' pairs (``x``: bfloat16 bits, two per int32)."""
    bits = x.astype(np.uint32)
    hr = r // 2
    out = np.zeros((32 * wn, 16), dtype=np.uint32)
    for lane in range(32 * wn):
        g, t = (lane % 32) // 4, lane % 4
        for i in range(4):
            for j in range(4):
                f = 4 * i + j if 4 * i + j < nf else j  # unused tensors repeat the first
                k = kbase + (t // hr) * nf * r + 2 * (t % hr) + f * r
                row = srow + g
                if row < m and k < kx:
                    out[lane, 4 * i + j] = bits[row, k] | bits[row, k + 1] << 16
    return out.view(np.int32)


@pytest.mark.parametrize(("nf", "r", "wn"), [(4, 4, 1), (8, 8, 2), (16, 8, 1), (8, 4, 2), (4, 2, 1)])
@pytest.mark.parametrize("stage", [False, True])
def test_each_lane_holds_its_fields_pairs(nf: int, r: int, wn: int, stage: bool) -> None:
    m, kx = 11, 4 * nf * 2 * 3  # three chunks; the last set of rows is partial
    x = torch.randn(m, kx, generator=torch.Generator().manual_seed(nf * r + wn)).to(torch.bfloat16)
    out = torch.zeros(32 * wn, 16, dtype=torch.int32)
    kbase, srow = 8 * nf, 8
    with interpreted(_probe):
        _probe[(1,)](x, out, m, kx, kx // 2, kbase, srow, True, NF=nf, R=r, WN=wn, STAGE=stage)
    want = expected(x.view(torch.int16).numpy().view(np.uint16), m, kx, kbase, srow, nf, r, wn)
    np.testing.assert_array_equal(out.numpy(), want)


def test_a_dead_step_loads_zeros() -> None:
    """Past the CTA's last step (prefetch) the staged tile is masked whole: the MMA then adds nothing."""
    x = torch.randn(8, 64).to(torch.bfloat16)
    out = torch.full((32, 16), 7, dtype=torch.int32)
    with interpreted(_probe):
        _probe[(1,)](x, out, 8, 64, 32, 0, 0, False, NF=8, R=8, WN=1, STAGE=True)
    assert int(out.abs().sum()) == 0
