"""quantize_rtn against the float64 numpy grid, AffineWeight validation, act-order g_idx."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear import AffineWeight, quantize_rtn
from tests.oracle.rtn_numpy import dequantize, rtn_group


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("group_size", [-1, 16, 32])
def test_rtn_matches_float64_grid(bits: int, sym: bool, group_size: int) -> None:
    torch.manual_seed(bits * 10 + group_size)
    w = torch.randn(24, 96) * 0.05
    q = quantize_rtn(w, bits=bits, group_size=group_size, sym=sym)
    gs = 96 if group_size == -1 else group_size
    ref = w.double().numpy()
    for g in range(96 // gs):
        s, z, c = rtn_group(ref[:, g * gs:(g + 1) * gs], bits, sym)
        np.testing.assert_allclose(q.scales[:, g].double().numpy(), s, rtol=1e-6)
        assert (q.zeros[:, g].numpy() == z).mean() > 0.99  # float32 vs float64 ties may flip a zero
        diff = np.abs(q.codes[:, g * gs:(g + 1) * gs].numpy().astype(int) - c)
        # float32 and float64 may round a value sitting on a .5 tie differently (sym grids put the
        # group's extreme exactly on one); everywhere else the codes must agree.
        t = ref[:, g * gs:(g + 1) * gs] / s[:, None]
        near_tie = np.abs(np.abs(t - np.floor(t)) - 0.5) < 1e-4
        assert diff.max() <= 1 and not np.any((diff > 0) & ~near_tie)
    # Error bound of round-to-nearest: at most half a step inside the grid's range.
    deq = dequantize(q.codes.numpy(), q.scales.double().numpy(), q.zeros.numpy(), q.g_idx.numpy())
    step = q.scales.double().numpy()[:, q.g_idx.numpy()]
    inside = np.abs(ref) < step * ((1 << bits) - 1) / 2 - step
    assert np.all(np.abs(deq - ref)[inside] <= step[inside] * 0.5 + 1e-7)
    np.testing.assert_allclose(q.dequantize(torch.float64).numpy(), deq, rtol=1e-6, atol=1e-9)


def test_rtn_desc_act_groups_in_processing_order() -> None:
    torch.manual_seed(0)
    w = torch.randn(8, 64)
    perm = torch.randperm(64)
    q = quantize_rtn(w, bits=4, group_size=16, sym=False, desc_act=True, perm=perm)
    invperm = torch.argsort(perm)
    assert torch.equal(q.g_idx, ((torch.arange(64) // 16)[invperm]).to(torch.int32))
    assert q.desc_act
    for g in range(4):
        cols = perm[g * 16:(g + 1) * 16]
        s, _, _ = rtn_group(w[:, cols].double().numpy(), 4, False)
        np.testing.assert_allclose(q.scales[:, g].double().numpy(), s, rtol=1e-6)


def test_rtn_all_zero_rows_and_plain_g_idx() -> None:
    q = quantize_rtn(torch.zeros(4, 32), bits=4, group_size=32, sym=False)
    assert torch.all(q.dequantize() == 0) and not q.desc_act


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(codes=d["codes"].to(torch.int32)), "codes: expected dtype torch.uint8"),
    (lambda d: d.update(codes=torch.full((4, 32), 16, dtype=torch.uint8)), r"codes: values must be in 0\.\.15"),
    (lambda d: d.update(scales=d["scales"].t()), r"scales: expected shape \[4, G\]"),
    (lambda d: d.update(zeros=d["zeros"][:, :1]), r"zeros: expected shape \[4, 2\]"),
    (lambda d: d.update(zeros=d["zeros"] + 16), r"zeros: true zero points must be in 0\.\.15"),
    (lambda d: d.update(g_idx=d["g_idx"][:10]), r"g_idx: expected shape \[32\]"),
    (lambda d: d.update(g_idx=d["g_idx"] + 1), r"g_idx: group ids must be in 0\.\.1 \(scales has 2 groups\)"),
    (lambda d: d["scales"].__setitem__((1, 1), float("nan")), r"scales: every scale must be finite; found nan"),
])
def test_affine_bad_inputs_name_tensor_expected_found(mutate, message: str) -> None:
    q = quantize_rtn(torch.randn(4, 32), bits=4, group_size=16, sym=False)
    fields = {"codes": q.codes, "scales": q.scales.clone(), "zeros": q.zeros, "g_idx": q.g_idx}
    mutate(fields)
    with pytest.raises(ValueError, match=message):
        AffineWeight(**fields, bits=4, group_size=16, sym=False)


def test_quantize_rtn_rejects_bad_weight() -> None:
    with pytest.raises(ValueError, match="weight: contains NaN"):
        quantize_rtn(torch.tensor([[float("nan"), 1.0]]), bits=4, group_size=-1)
    with pytest.raises(ValueError, match=r"weight: expected a 2-D"):
        quantize_rtn(torch.randn(3), bits=4)
    with pytest.raises(ValueError, match="perm: expected a permutation"):
        quantize_rtn(torch.randn(2, 8), bits=4, group_size=4, desc_act=True, perm=torch.zeros(8, dtype=torch.long))
