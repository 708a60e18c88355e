"""``ExllamaV3TorchLinear`` against a float64 product with the oracle's weight (tests/oracle/exl3_oracle.py): float32
arithmetic on the exact float16 inner weight, so within float32 rounding (rtol 1e-5 before the output cast) for
every codebook, sign storage, bias and input dtype; no dense weight kept; selection; bad input named."""

from __future__ import annotations

import gc

import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels.exl3 import ExllamaV3Linear, ExllamaV3TorchLinear
from qlinear.layouts import exl3
from qlinear.layouts.exl3 import Exl3LayoutError, Exl3Params
from qlinear.select import select
from qlinear.spec import Scheme
from qlinear.target import Target
from tests.oracle import exl3_oracle


def scheme(k: int, n: int, params: Exl3Params) -> Scheme:
    return Scheme(bits=params.bits, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
                  pack_dtype=torch.int16, layout_params=params)


def random_tensors(k: int, n: int, params: Exl3Params, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = {"trellis": torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * params.bits), generator=g,
                                  dtype=torch.int32).to(torch.int16)}
    su, sv = params.scale_names
    if params.packed_signs:
        t[su] = torch.randint(-(1 << 15), 1 << 15, (k // 16,), generator=g, dtype=torch.int32).to(torch.int16)
        t[sv] = torch.randint(-(1 << 15), 1 << 15, (n // 16,), generator=g, dtype=torch.int32).to(torch.int16)
    else:
        t[su] = (torch.randn(k, generator=g) * 0.05).half()
        t[sv] = (torch.randn(n, generator=g) * 0.05).half()
    if params.codebook in exl3.MARKERS:
        t[params.codebook] = exl3.marker_tensor(params.codebook)
    return t


def layer_for(k: int, n: int, params: Exl3Params, seed: int, bias: bool = False) -> ExllamaV3TorchLinear:
    t = random_tensors(k, n, params, seed)
    if bias:
        t["bias"] = torch.randn(n, generator=torch.Generator().manual_seed(seed)).half()
    layer = ExllamaV3TorchLinear(scheme(k, n, params), bias=bias)
    layer.load_state_dict(t, strict=True)
    return layer


def reference(layer: ExllamaV3TorchLinear, x: torch.Tensor) -> torch.Tensor:
    p = layer.params
    t = layer.tensors()
    su, sv = (exl3_oracle.signs(t[s]) for s in p.scale_names) if p.packed_signs else (t["suh"], t["svh"])
    w = exl3_oracle.weight(t["trellis"], p.bits, p.codebook, su, sv)
    y = x.double().reshape(-1, layer.in_features) @ w
    if layer.bias is not None:
        y += layer.bias.double()
    return y.reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize(("bits", "cb", "signs", "bias"), [(4, "3inst", False, True), (2, "mcg", True, False),
                                                             (3, "mul1", False, False), (1, "mcg", False, True),
                                                             (8, "3inst", True, True)])
def test_forward_matches_float64(bits: int, cb: str, signs: bool, bias: bool) -> None:
    layer = layer_for(128, 256, Exl3Params(bits, cb, signs), seed=bits, bias=bias)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(1))
    y = layer(x)
    ref = reference(layer, x)
    assert y.shape == (2, 3, 256) and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    w_ref = exl3_oracle.weight(layer.trellis, bits, cb, *exl3.scale_vectors(layer.tensors(), layer.params))
    torch.testing.assert_close(layer.dequantize().t().double(), w_ref, rtol=1e-5, atol=1e-6 * w_ref.abs().max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_round_once(dtype: torch.dtype) -> None:
    layer = layer_for(256, 128, Exl3Params(4, "mul1"), seed=3, bias=True)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(2)).to(dtype)
    y = layer(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y, reference(layer, x).to(dtype), rtol=1e-2, atol=1e-2)


def test_column_tiles_and_no_dense_weight_kept(monkeypatch) -> None:
    monkeypatch.setattr("qlinear.kernels.exl3.TILE_ELEMENTS", 128 * 256)  # 256 input rows: one 128-column tile
    layer = layer_for(256, 512, Exl3Params(3, "3inst"), seed=5)
    assert layer.tile_cols() == 128
    x = torch.randn(20, 256, generator=torch.Generator().manual_seed(0))  # above NATIVE_MV_ROWS: the tile path
    torch.testing.assert_close(layer(x).double(), reference(layer, x), rtol=1e-5, atol=1e-5)
    for _ in range(3):
        layer(x)
    gc.collect()
    big = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.is_floating_point()
           and t.numel() >= 256 * 512]
    assert big == []
    assert {name for name, _ in layer.named_buffers()} == {"trellis", "suh", "svh", "_rt_table", "_rt_had",
                                                           "_rt_suh", "_rt_svh"}


def test_selection() -> None:
    s = scheme(256, 256, Exl3Params(4))
    assert select(Problem(s), Target.fake_cpu()).kernel is ExllamaV3TorchLinear
    gpu = Target.fake_cuda((9, 0), modules={"triton": True})
    assert select(Problem(s), gpu).kernel is ExllamaV3Linear
    odd = scheme(192, 256, Exl3Params(4))
    reasons = ExllamaV3TorchLinear.reasons(Problem(odd), Target.fake_cpu())
    assert any("192" in r for r in reasons)
    assert ExllamaV3TorchLinear.reasons(Problem(Scheme(bits=4, group_size=-1, in_features=256, out_features=256,
                                                        method="exl3", format="exl3", pack_dtype=torch.int16)),
                                        Target.fake_cpu()) == ["an EXL3 layer needs its Exl3Params "
                                                               "(Scheme.layout_params)"]


def test_bad_input_is_named() -> None:
    layer = layer_for(128, 128, Exl3Params(2, "mcg"), seed=0)
    with pytest.raises(ValueError, match="expected last dimension 128"):
        layer(torch.randn(2, 64))
    with pytest.raises(ValueError, match="dtype torch.int32 not supported"):
        layer(torch.ones(2, 128, dtype=torch.int32))
    layer.mcg.fill_(7)
    with pytest.raises(Exl3LayoutError, match="mcg: expected the int32 scalar marker"):
        layer(torch.randn(2, 128))
    layer = layer_for(128, 128, Exl3Params(2), seed=0)
    with torch.no_grad():
        layer.svh[3] = float("nan")
    with pytest.raises(Exl3LayoutError, match="svh: scales must be finite"):
        layer(torch.randn(2, 128))
    with pytest.raises(ValueError, match="not integer-affine"):
        layer.affine()
    with pytest.raises(Exl3LayoutError, match="trellis: expected shape"):
        layer.load_exl3({**layer.tensors(), "trellis": torch.zeros(8, 8, 16, dtype=torch.int16)})
