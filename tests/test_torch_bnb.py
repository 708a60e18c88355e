"""``BitsAndBytesTorchLinear`` against the float64 numpy oracle (tests/oracle/bnb_numpy.py): NF4 / FP4 (plain and
double-quantized, blocks straddling rows, odd code counts) and LLM.int8, float32 / bfloat16 / float16 activations,
bias; its buffers are the checkpoint's tensors under their own names; no dense weight survives a forward."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
import torch

from qlinear.bnb_build import create_bnb_layer
from qlinear.bnb_weight import BnbInt8Weight
from qlinear.caps import Problem
from qlinear.kernels.torch_bnb import BitsAndBytesTorchLinear
from qlinear.kernels.triton_bnb import BitsAndBytesTritonLinear
from qlinear.layouts import bnb
from qlinear.select import NoKernelError, explain
from qlinear.target import Target
from tests.oracle import bnb_numpy as ref
from tests.test_bnb_layout import make, oracle_absmax

#: |y - oracle| / |oracle| per activation dtype. float32: float32 sums of exact float32 products (K <= 300).
#: bfloat16 / float16: the oracle multiplies the weight and input rounded as the kernel rounds them, in float64;
#: what is left is the rounding of the sum (and the output) to 8 / 11 mantissa bits.
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
CASES = [("nf4", True, 48, 96, 64), ("fp4", False, 33, 70, 64), ("nf4", False, 7, 13, 32), ("fp4", True, 130, 300, 128),
         ("nf4", True, 40, 128, 256)]


def oracle_weight(w, dtype: torch.dtype) -> np.ndarray:
    if isinstance(w, BnbInt8Weight):
        return ref.round_to(ref.dequantize_int8(w.codes.numpy(), w.scb.numpy()), NAMES[dtype])
    n, k = w.codes.shape
    codes = ref.unpack(bnb.pack_codes(w.codes, w.quant_type).numpy(), n, k)
    return ref.round_to(ref.dequantize_4bit(codes, w.quant_type, oracle_absmax(w), w.blocksize), NAMES[dtype])


def check(layer, w, dtype: torch.dtype, m: int, bias: torch.Tensor | None, seed: int) -> None:
    x = torch.randn(m, w.codes.shape[1], generator=torch.Generator().manual_seed(seed)).to(dtype)
    want = x.double().numpy() @ oracle_weight(w, dtype).T
    if bias is not None:
        want = want + bias.to(dtype).double().numpy()
    y = layer(x)
    assert y.dtype == dtype and y.shape == (m, w.codes.shape[0])
    err = np.linalg.norm(y.double().numpy() - want) / np.linalg.norm(want)
    assert err < TOL[dtype], (dtype, err)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("quant_type", "nested", "n", "k", "bs"), CASES)
def test_4bit_matches_the_oracle(quant_type: str, nested: bool, n: int, k: int, bs: int, dtype: torch.dtype) -> None:
    w = make(n, k, quant_type, bs, nested, seed=n * k)
    bias = torch.randn(n) if n % 2 else None
    layer = create_bnb_layer(w, backend="bitsandbytes_torch", dtype=dtype, bias=bias)
    assert isinstance(layer, BitsAndBytesTorchLinear)
    for m in (1, 5):
        check(layer, w, dtype, m, bias, seed=m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_int8_matches_the_oracle(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(5)
    w = BnbInt8Weight(torch.randint(-127, 128, (37, 72), generator=g, dtype=torch.int8), torch.rand(37, generator=g))
    bias = torch.randn(37, generator=g).to(torch.bfloat16)
    layer = create_bnb_layer(w, backend="bitsandbytes_torch", dtype=dtype, bias=bias)
    check(layer, w, dtype, 3, bias, seed=7)
    assert layer.bias.dtype == torch.bfloat16  # the given bias dtype is kept, as a checkpoint's would be


def test_row_tiles_decode_any_range_exactly() -> None:
    """Tiles start mid-byte and mid-block: every range of rows equals the same rows of the whole weight."""
    w = make(29, 21, "fp4", 32, nested=True)
    layer = create_bnb_layer(w, backend="bitsandbytes_torch", dtype=torch.float32)
    whole = w.dequantize(torch.float32)
    for n0, n1 in [(0, 29), (1, 2), (3, 17), (28, 29), (5, 6)]:
        assert torch.equal(layer.decode_rows(n0, n1, torch.float32), whole[n0:n1])
    layer.tile_rows = lambda: 3  # several tiles per forward, of rows that straddle blocks
    x = torch.randn(4, 21)
    assert torch.allclose(layer(x), x @ whole.t(), rtol=1e-6, atol=1e-6)


def test_buffers_are_the_checkpoint_tensors_and_follow_mutation() -> None:
    w = make(16, 64, "nf4", 64, nested=True)
    layer = create_bnb_layer(w, backend="bitsandbytes_torch", dtype=torch.float32)
    state = layer.state_dict()
    assert list(state) == ["weight", "weight.absmax", "weight.quant_map", "weight.nested_absmax",
                           "weight.nested_quant_map", "weight.quant_state.bitsandbytes__nf4"]
    written = bnb.to_checkpoint(w, bnb.scheme_of(w))
    assert all(torch.equal(state[k], written[k]) and state[k].dtype == written[k].dtype for k in written)
    x = torch.randn(2, 64)
    y1 = layer(x)
    with torch.no_grad():
        layer.weight_nested_absmax.mul_(2)  # every block absmax doubles but for the offset
    y2 = layer(x)
    assert not torch.equal(y1, y2)
    fresh = BitsAndBytesTorchLinear(bnb.scheme_of(w))
    fresh.load_state_dict(state)
    fresh.prepare()
    assert torch.equal(fresh(x), y2)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"weight.nested_quant_map\""):
        fresh.load_state_dict({k: v for k, v in state.items() if k != "weight.nested_quant_map"})
    with pytest.raises(RuntimeError, match=r"weight.absmax: expected torch.uint8 shape \[16\], got torch.float32"):
        fresh.load_state_dict({**state, "weight.absmax": torch.ones(16)})
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"SCB\""):
        fresh.load_state_dict({**state, "SCB": torch.ones(16)})


def test_no_dense_weight_survives_forwards() -> None:
    k = n = 1024
    g = torch.Generator().manual_seed(1)
    w = make(n, k, "nf4", 64, nested=True)
    layer = create_bnb_layer(w, backend="bitsandbytes_torch", dtype=torch.bfloat16)
    del w
    for m in (1, 7, 1):
        layer(torch.randn(m, k, generator=g, dtype=torch.bfloat16))
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.is_floating_point()
               and t.numel() >= k * n // 4]  # a dense weight, or a quarter of one
    assert big == [], [(tuple(t.shape), t.dtype) for t in big]
    held = sum(b.numel() * b.element_size() for b in layer.buffers()) + layer._absmax.numel() * 4
    assert held < k * n * 0.6  # half a byte a weight, plus one float32 absmax (and a byte) per 64 weights


def test_declarations_and_selection() -> None:
    here = Target.here("cpu")
    s4 = bnb.bnb_scheme(64, 128, "nf4", 64, True)
    s8 = bnb.bnb_scheme(64, 128, "int8")
    for s in (s4, s8):
        assert BitsAndBytesTorchLinear.reasons(Problem(s, torch.bfloat16), here) == []
    choice = explain(Problem(s4, torch.float32), here, "bitsandbytes_torch")
    assert "nf4 blocksize 64, double-quantized absmax" in choice.explain()
    auto8 = explain(Problem(s8, torch.bfloat16), here)
    assert auto8.kernel is BitsAndBytesTorchLinear  # the package's int8 path quantizes activations: passed over
    bare = explain(Problem(s4, torch.bfloat16), Target.fake_cpu(modules={}))  # bitsandbytes not installed
    assert bare.kernel is BitsAndBytesTorchLinear
    assert "needs Python module 'bitsandbytes': pip install bitsandbytes==0.50.2" in bare.explain(width=None)
    triton = BitsAndBytesTritonLinear.reasons(Problem(s4, torch.bfloat16), Target.fake_cuda(modules={"triton": True}))
    assert triton == []  # runs there when asked for, but AUTO does not pick it yet (priority 0)
    assert explain(Problem(s4, torch.bfloat16), Target.fake_cuda(modules={"triton": True})).kernel \
        is not BitsAndBytesTritonLinear
    assert any("8-bit not supported" in r for r in BitsAndBytesTritonLinear.reasons(Problem(s8, torch.bfloat16), here))
    gptq = Problem(replace_format(s4), torch.bfloat16)
    assert any("format gptq_v2 not declared" in r for r in BitsAndBytesTorchLinear.reasons(gptq, here))
    with pytest.raises(NoKernelError, match="bitsandbytes_triton"):
        create_bnb_layer(make(8, 64), backend="bitsandbytes_triton")


def replace_format(s):
    from qlinear.spec import Scheme

    return Scheme(bits=4, group_size=64, in_features=s.in_features, out_features=s.out_features)


def test_bad_input_is_named() -> None:
    layer = create_bnb_layer(make(8, 64), backend="bitsandbytes_torch", dtype=torch.float32)
    with pytest.raises(ValueError, match=r"input: expected last dimension 64 \(in_features\), got shape \(2, 63\)"):
        layer(torch.randn(2, 63))
    with pytest.raises(TypeError, match="no integer-affine form"):
        layer.affine()
    with pytest.raises(TypeError, match="build it from a BnbWeight"):
        layer.load_affine(object())
    with pytest.raises(ValueError, match=r"the layer is nf4 blocksize 64 \[8, 64\]"):
        layer.load_bnb(make(8, 64, "fp4"))
    with pytest.raises(ValueError, match="bias given but the layer was built without one"):
        layer.load_bnb(make(8, 64), bias=torch.zeros(8))
    with pytest.raises(TypeError, match="expected a BnbWeight or BnbInt8Weight, got Tensor"):
        create_bnb_layer(torch.zeros(2, 2))
