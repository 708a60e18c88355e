"""The VPTQ Triton kernels (``kernels/triton/vptq_mv.py``) in Triton's CPU interpreter: the decode kernel writes
exactly the weight the Torch path decodes (itself bit-exact with VPTQ and GPTQModel), and ``VPTQCudaLinear``'s
product (GEMV and tensor-core tile with split-K, decode-then-matmul) matches ``VPTQLinear`` and a float64 product.

TRITON_INTERPRET=1 is set at collection, before anything imports the kernel bodies. Small shapes covering residual
codes, codes straddling words, several groups, outliers, permutation, norm, a vector length that is not a power
of two and padded output rows.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from qlinear.kernels.vptq import VPTQCudaLinear, VPTQLinear
from qlinear.layouts import vptq
from tests import vptq_cases
from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"

CASES = [
    dict(k=96, n=40, v=8, c=64, r=16, gs=32, perm=True, norm=True, bias=True, m=3),
    dict(k=80, n=18, v=6, c=8, os=16, vo=4, co=16, norm=True, perm=True, seed=3, dtype=torch.bfloat16, m=6),
    dict(k=130, n=16, v=4, c=1 << 12, r=1 << 9, seed=5, m=1),  # 21-bit codes straddle words, K tail
]


@pytest.fixture(scope="module")
def mv():
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import vptq_mv

    if type(vptq_mv.vptq_gemv_kernel).__name__ != "InterpretedFunction":
        pytest.skip("the kernel bodies were imported before TRITON_INTERPRET=1 was set")
    return vptq_mv


def layers(kw: dict, dtype: torch.dtype):
    meta, t = vptq_cases.make_case("c", **kw)
    packed = vptq.pack_indices(t["idx"], t.get("res"), vptq_cases.params(meta))
    state = vptq_cases.checkpoint_tensors(meta, t, packed) | ({"bias": t["bias"]} if "bias" in t else {})
    out = []
    for cls in (VPTQLinear, VPTQCudaLinear):
        layer = cls(vptq_cases.scheme(meta), bias="bias" in t, dtype=dtype)
        layer.load_state_dict(state, strict=True)
        layer.prepare()
        out.append(layer)
    return meta, t, out


@pytest.mark.parametrize("kw", CASES)
def test_decode_kernel_is_the_torch_decode(mv, kw: dict) -> None:
    meta, _, (ref, tri) = layers(kw, torch.float16)
    p, os_ = tri.params, meta["os"]
    w = ref.dequantize()
    if p.enable_perm:
        w = w[:, tri._rt_perm]  # decoded-column order
    t = tri.tensors()
    scale = None if tri._rt_scale is None else tri._rt_scale[os_:]
    shift = None if tri._rt_bias is None else tri._rt_bias[os_:]
    for dtype in (torch.float16, torch.bfloat16):
        got = mv.decode_main(t["indices"], t["centroids.weight"], t.get("res_centroids.weight"), scale, shift, p,
                             meta["N"], meta["K"] - os_, dtype)
        assert torch.equal(got, w[:, os_:].to(dtype))


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("path", ["gemv", "mma", "dense"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_product_matches_torch_kernel(mv, kw: dict, path: str, dtype: torch.dtype) -> None:
    _, t, (ref, tri) = layers(kw, dtype)
    x = t["x"].to(dtype)
    want = ref(x)
    with interpreted(mv.vptq_mma_kernel):  # bfloat16 dot operands as values, not raw bits
        got = tri.product(x, path)
    assert got.dtype == dtype and got.shape == want.shape
    exact = x.double() @ ref.dequantize(dtype).double().t() + (ref.bias.to(dtype).double() if ref.bias is not None
                                                              else 0)
    scale = exact.abs().max()
    tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5}[dtype]
    assert (got.double() - exact).abs().max() / scale < tol
    assert (got.double() - want.double()).abs().max() / scale < tol


def test_split_count(mv) -> None:
    assert mv.gemv_split(64, 14336, 64, 132) == 9
    assert mv.gemv_split(1000, 4096, 64, 132) == 1
    assert mv.gemv_split(1, 100, 64, 132) == 2


def test_every_bit_pattern_decodes(mv) -> None:
    """Random int32 words (sign bits set, codes straddling words, 24-bit codes with residuals) decode as in Torch."""
    meta, _, (ref, _) = layers(dict(k=70, n=24, v=8, c=1 << 16, r=1 << 8, seed=7), torch.float16)
    with torch.no_grad():
        ref.indices.copy_(torch.randint(-2**31, 2**31 - 1, ref.indices.shape, dtype=torch.int32,
                                        generator=torch.Generator().manual_seed(1)))
    got = mv.decode_main(ref.indices, ref.centroids.weight, ref.res_centroids.weight, None, None, ref.params,
                         meta["N"], meta["K"], torch.float16)
    assert torch.equal(got, ref.dequantize())
