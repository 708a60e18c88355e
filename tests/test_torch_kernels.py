"""TorchLinear and TorchQuantEmbeddings against the float64 numpy oracle (tests/oracle, no qlinear code).

Tolerances, as a fraction of max |y_ref|: float32 1e-5 (only summation order differs); float16 2e-3
and bfloat16 1.5e-2 (the decoded weight and the output are rounded to the activation dtype: 2**-11
and 2**-8 relative per element, and K of them are summed).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear import QuantLinear, Scheme, TorchLinear, TorchQuantEmbeddings, create_layer, quantize_rtn
from qlinear.enums import FORMAT
from tests.oracle.gptq_numpy import dequantize_checkpoint

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def oracle_weight(layer: QuantLinear) -> np.ndarray:
    sd = {k: v.cpu().numpy() for k, v in layer.state_dict().items() if k != "bias"}
    s = layer.scheme
    return dequantize_checkpoint(sd, s.bits, s.in_features, s.out_features, s.format.value)


def make_weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # A negative minimum in every group keeps asymmetric zero points above 0 (v1 cannot hold z = 0).
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, ::8] = -0.05
    return w


CASES = [
    # fmt, bits, group, sym, desc_act, pack dtype, K, N
    ("gptq_v2", 4, 128, True, False, torch.int32, 256, 64),
    ("gptq_v2", 4, 32, False, True, torch.int32, 160, 72),
    ("gptq_v2", 2, 16, False, False, torch.int16, 96, 40),
    ("gptq_v2", 8, -1, True, False, torch.int8, 100, 24),
    ("gptq_v2", 3, 64, False, True, torch.int32, 192, 33),
    ("gptq", 4, 64, False, False, torch.int32, 128, 48),
    ("gptq", 3, -1, False, True, torch.int32, 96, 40),
    ("gptq", 8, 16, True, True, torch.int16, 64, 16),
    ("gptq_p", 5, 32, False, False, torch.int32, 128, 64),
    ("gptq_p", 6, 64, True, True, torch.int32, 128, 32),
    ("gptq_p", 7, -1, False, False, torch.int32, 96, 32),
    ("gptq_p", 3, 16, False, True, torch.int32, 64, 96),
]


@pytest.mark.parametrize(("fmt", "bits", "group", "sym", "desc_act", "pack", "k", "n"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forward_matches_float64_oracle(fmt, bits, group, sym, desc_act, pack, k, n, dtype) -> None:
    w = make_weight(n, k, seed=bits * 1000 + k)
    bias = torch.randn(n) * 0.1
    q = quantize_rtn(w, bits=bits, group_size=group, sym=sym, desc_act=desc_act)
    layer = create_layer(q, format=fmt, backend="gptq_torch", dtype=dtype, bias=bias, pack_dtype=pack)
    assert isinstance(layer, TorchLinear) and layer.scheme.format is FORMAT(fmt)
    w64 = oracle_weight(layer)
    # The decoded weight is exact: fp16 scale times a small integer fits float32.
    np.testing.assert_array_equal(layer.dequantize().numpy(), w64.astype(np.float32))
    np.testing.assert_allclose(w64, q.dequantize(torch.float64).numpy(), rtol=1e-3, atol=1e-6)
    for m in (1, 3, 7):
        x = torch.randn(2, m, k).to(dtype)
        y = layer(x)
        assert y.dtype == dtype and y.shape == (2, m, n)
        ref = x.double().numpy() @ w64.T + bias.half().double().numpy()
        err = np.abs(y.double().numpy() - ref).max() / np.abs(ref).max()
        assert err < TOL[dtype], f"relative error {err:.2e} over {TOL[dtype]:.0e}"


@pytest.mark.parametrize("desc_act", [False, True])
def test_tiled_forward_equals_single_tile(monkeypatch, desc_act: bool) -> None:
    q = quantize_rtn(make_weight(64, 512, 1), bits=4, group_size=32, sym=False, desc_act=desc_act)
    layer = create_layer(q, backend="gptq_torch", dtype=torch.float32)
    x = torch.randn(5, 512)
    whole = x @ layer.dequantize().t()
    monkeypatch.setattr("qlinear.kernels.torch.TILE_ELEMENTS", 512 * 16)
    assert layer.tile_cols() == 16
    torch.testing.assert_close(layer(x), whole, rtol=1e-5, atol=1e-6)


def test_state_dict_holds_only_the_checkpoint_layout() -> None:
    q = quantize_rtn(make_weight(48, 128, 2), bits=4, group_size=64, sym=False)
    layer = create_layer(q, format="gptq", backend="gptq_torch", dtype=torch.float32, bias=torch.zeros(48))
    sd = layer.state_dict()
    assert set(sd) == {"qweight", "qzeros", "scales", "g_idx", "bias"}
    assert sd["qweight"].shape == (16, 48) and sd["qweight"].dtype == torch.int32
    assert sd["qzeros"].shape == (2, 6) and sd["scales"].dtype == torch.float16
    fresh = TorchLinear(layer.scheme, bias=True, dtype=torch.float32)
    fresh.load_state_dict(sd)
    x = torch.randn(3, 128)
    torch.testing.assert_close(fresh(x), layer(x))


def test_runtime_state_follows_buffer_mutation() -> None:
    q1 = quantize_rtn(make_weight(32, 64, 3), bits=4, group_size=32)
    q2 = quantize_rtn(make_weight(32, 64, 4), bits=4, group_size=32)
    layer = create_layer(q1, backend="gptq_torch", dtype=torch.float32)
    calls = []
    original = layer.prepare
    layer.prepare = lambda: (calls.append(1), original())[1]
    x = torch.randn(2, 64)
    layer(x)
    assert calls == []
    layer.load_affine(q2)
    y = layer(x)
    assert calls == [1]
    torch.testing.assert_close(y, x @ layer.dequantize().t(), rtol=1e-4, atol=1e-5)
    assert (y - x @ q1.dequantize().t()).abs().max() > 1e-3


def test_no_dense_weight_survives_forwards() -> None:
    import gc
    import warnings

    k = n = 4096
    q = quantize_rtn(torch.randn(n, k) * 0.02, bits=4, group_size=128)
    layer = create_layer(q, backend="gptq_torch", dtype=torch.bfloat16)
    del q
    x = torch.randn(4, k, dtype=torch.bfloat16)
    for _ in range(10):
        layer(x)
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on some torch.distributed shims warns
        warnings.simplefilter("ignore")
        big = [t for t in gc.get_objects() if isinstance(t, torch.Tensor) and t.numel() >= k * n]
    assert big == [], [tuple(t.shape) for t in big]
    held = sum(b.numel() * b.element_size() for b in layer.buffers())
    assert held < k * n * 0.6  # 4-bit codes + fp16 scales + zeros: about a quarter of fp16 bytes


def test_forward_input_errors() -> None:
    layer = create_layer(quantize_rtn(torch.randn(8, 32), bits=4, group_size=32), backend="gptq_torch",
                               dtype=torch.float32)
    with pytest.raises(ValueError, match=r"input: expected last dimension 32 \(in_features\), got shape \(2, 31\)"):
        layer(torch.randn(2, 31))
    with pytest.raises(ValueError, match="input: dtype torch.int64 not supported"):
        layer(torch.ones(2, 32, dtype=torch.long))


@pytest.mark.parametrize(("fmt", "bits"), [("gptq_v2", 4), ("gptq", 8), ("gptq_p", 5)])
def test_embeddings_look_up_decoded_rows(fmt: str, bits: int) -> None:
    vocab, dim = 96, 64
    q = quantize_rtn(make_weight(vocab, dim, 5), bits=bits, group_size=32, sym=False)
    scheme = Scheme(bits=bits, group_size=32, in_features=dim, out_features=vocab, sym=False, format=FORMAT(fmt))
    emb = TorchQuantEmbeddings(scheme, dtype=torch.float32)
    emb.load_affine(q)
    ids = torch.tensor([[0, 5, 95], [7, 7, 1]])
    table = oracle_weight(emb)
    np.testing.assert_array_equal(emb(ids).numpy(), table[ids.numpy()].astype(np.float32))
    with pytest.raises(ValueError, match=r"ids: must be in 0\.\.95; found 0\.\.96"):
        emb(torch.tensor([0, 96]))


def test_cuda_forward_if_available() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (the GPU checks live in tests/gpu and benchmarks/)")
    q = quantize_rtn(make_weight(64, 256, 6), bits=4, group_size=64, sym=False)
    layer = create_layer(q, device="cuda", dtype=torch.float16)
    x = torch.randn(3, 256, device="cuda", dtype=torch.float16)
    ref = x.double().cpu().numpy() @ oracle_weight(layer).T
    assert np.abs(layer(x).double().cpu().numpy() - ref).max() / np.abs(ref).max() < 2e-3
