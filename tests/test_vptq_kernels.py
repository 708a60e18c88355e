"""The VPTQ Torch kernel (``VPTQLinear``) against a float64 product with the oracle's weight
(tests/oracle/vptq_numpy.py), over several row tiles; buffers named as the checkpoints name them; no dense weight
kept; the selector's answers; input and content errors. Producer bit-exactness: tests/external/test_vptq_producers.py.
"""

from __future__ import annotations

import pytest
import torch

from qlinear.caps import Problem
from qlinear.enums import BACKEND
from qlinear.kernels import vptq as kv
from qlinear.kernels.vptq import VPTQCudaLinear, VPTQLinear
from qlinear.layouts import vptq
from qlinear.select import select
from qlinear.target import Target
from tests import vptq_cases
from tests.oracle import vptq_numpy


def build(kw: dict, dtype: torch.dtype = torch.float16, aux: torch.dtype = torch.int16):
    meta, t = vptq_cases.make_case("c", **kw)
    packed = vptq.pack_indices(t["idx"], t.get("res"), vptq_cases.params(meta, aux))
    layer = VPTQLinear(vptq_cases.scheme(meta, aux), bias="bias" in t, dtype=dtype)
    state = vptq_cases.checkpoint_tensors(meta, t, packed, aux) | ({"bias": t["bias"]} if "bias" in t else {})
    layer.load_state_dict(state, strict=True)
    return meta, t, packed, layer


CASES = [
    dict(k=96, n=40, v=8, c=64, r=16, gs=32, perm=True, norm=True, bias=True, m=5),
    dict(k=80, n=18, v=6, c=8, os=16, vo=4, co=16, norm=True, perm=True, seed=3, dtype=torch.bfloat16),
    dict(k=70, n=12, v=4, c=4, gs=32, norm=True, norm_dim=1, seed=4, bias=True),
]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_forward_matches_float64(monkeypatch, kw: dict, x_dtype: torch.dtype) -> None:
    monkeypatch.setattr(kv, "TILE_ELEMENTS", 1)  # one vector of rows per tile: many tiles
    meta, t, packed, layer = build(kw, x_dtype)
    assert layer.tile_rows() < meta["N"]
    w = vptq_numpy.dequantize(meta, {k: v.double().numpy() for k, v in t.items()}, packed.numpy())
    w = torch.from_numpy(w).to(x_dtype).double()  # the weight rounded to the activation dtype, as the producers
    x = t["x"].to(x_dtype)
    ref = x.double() @ w.t() + (t["bias"].to(x_dtype).double() if "bias" in t else 0)
    y = layer(x.view(1, *x.shape))
    assert y.dtype == x_dtype and y.shape == (1, x.shape[0], meta["N"])
    eps = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-6}[x_dtype]
    err = (y[0].double() - ref).abs().max() / ref.abs().max()
    assert err < eps, err


def test_state_dict_is_the_checkpoint_layout_and_no_dense_weight_is_kept() -> None:
    meta, t, _, layer = build(CASES[1])
    assert set(layer.state_dict()) == {"indices", "centroids.weight", "outlier_centroids.weight", "outlier_indices",
                                       "perm", "weight_scale", "weight_bias"}
    layer(t["x"].half())
    sizes = [b.numel() for b in layer.buffers() if b is not None]
    assert max(sizes) < meta["N"] * meta["K"]


def test_gptqmodel_int32_aux_tensors() -> None:
    kw = dict(k=80, n=18, v=6, c=8, os=16, vo=4, co=16, perm=True, seed=3)
    *_, a = build(kw)
    *_, b = build(kw, aux=torch.int32)
    assert b.perm.dtype == torch.int32 and torch.equal(a.dequantize(), b.dequantize())


def test_selection() -> None:
    meta, _ = vptq_cases.make_case("c", **CASES[0])
    s = vptq_cases.scheme(meta)
    assert select(Problem(s, torch.float16), Target.fake_cpu()).kernel is VPTQLinear  # VPTQCpuLinear: native extra
    cuda = Target.fake_cuda((9, 0), modules={"triton": True})
    assert select(Problem(s, torch.bfloat16), cuda).kernel is VPTQCudaLinear
    assert select(Problem(s, torch.bfloat16), cuda, BACKEND.VPTQ_TORCH).kernel is VPTQLinear
    meta1, _ = vptq_cases.make_case("c", **CASES[2])  # GPTQModel's per-output norm: the Torch kernel only
    assert select(Problem(vptq_cases.scheme(meta1), torch.float16), cuda).kernel is VPTQLinear
    no_triton = Target.fake_cuda((9, 0), modules={})
    assert any("triton" in r for r in VPTQCudaLinear.reasons(Problem(s, torch.float16), no_triton))


def test_input_and_content_errors() -> None:
    _, t, _, layer = build(CASES[0])
    with pytest.raises(ValueError, match="expected last dimension 96"):
        layer(torch.zeros(2, 95, dtype=torch.float16))
    with pytest.raises(ValueError, match="dtype torch.int32 not supported"):
        layer(torch.zeros(2, 96, dtype=torch.int32))
    with torch.no_grad():
        layer.perm[0] = layer.perm[1]
    with pytest.raises(vptq.VptqLayoutError, match="perm: expected a permutation"):
        layer(t["x"])
    with torch.no_grad():
        layer.perm.copy_(torch.arange(96, dtype=torch.int16))
        layer.centroids.weight[0, 5] = float("inf")
    with pytest.raises(vptq.VptqLayoutError, match="centroids.weight: holds NaN or infinite"):
        layer(t["x"])


def test_load_vptq_validates_then_fills() -> None:
    meta, t, packed, layer = build(CASES[0])
    fresh = VPTQLinear(layer.scheme, bias=True, dtype=torch.float16)
    tensors = vptq_cases.checkpoint_tensors(meta, t, packed)
    fresh.load_vptq(tensors, t["bias"])
    assert torch.equal(fresh(t["x"]), layer(t["x"]))
    with pytest.raises(vptq.VptqLayoutError, match="res_centroids.weight: expected shape"):
        fresh.load_vptq(tensors | {"res_centroids.weight": t["rcentroids"][:, 1:]})
    with pytest.raises(ValueError, match="bias: expected shape"):
        fresh.load_vptq(tensors, t["bias"][1:])
