"""GPTQ <-> AWQ conversion: lossless round trips where both formats can hold the weight, clear refusals elsewhere.

The weights are compared through the independent oracles (tests/oracle), never through the code that converted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear import AffineWeight, Scheme, quantize_rtn
from qlinear.convert import ConversionError, convert_tensors
from qlinear.layouts import awq, gptq
from tests.oracle import awq_numpy
from tests.oracle.gptq_numpy import dequantize_checkpoint

AWQ = ("gemm", "gemv", "gemv_fast", "llm-awq")


def weight(n: int = 32, k: int = 128, bits: int = 4, gs: int = 32, sym: bool = False, desc_act: bool = False,
           seed: int = 0) -> AffineWeight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, ::8] = -0.05  # a negative minimum in every group: asymmetric zeros stay above 0 (v1 can hold them)
    return quantize_rtn(w, bits=bits, group_size=gs, sym=sym, desc_act=desc_act)


def gptq_layer(q: AffineWeight, fmt: str = "gptq_v2") -> tuple[dict[str, torch.Tensor], Scheme]:
    s = Scheme(bits=q.bits, group_size=q.group_size, in_features=q.in_features, out_features=q.out_features,
               sym=q.sym, desc_act=q.desc_act, format=fmt)
    return gptq.to_checkpoint(q, fmt), s


def oracle(tensors: dict[str, torch.Tensor], s: Scheme) -> np.ndarray:
    arrays = {n: v.numpy() for n, v in tensors.items() if n != "bias"}
    if s.method.value == "gptq":
        return dequantize_checkpoint(arrays, s.bits, s.in_features, s.out_features, s.format.value)
    return awq_numpy.dequantize(s.format.value, arrays, s.bits, s.in_features, s.out_features, s.group_size)


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.int16) if t.is_floating_point() else t
    return a.keys() == b.keys() and all(torch.equal(bits(a[n]), bits(b[n])) for n in a)


@pytest.mark.parametrize("to", AWQ)
@pytest.mark.parametrize(("src", "sym", "gs"), [("gptq_v2", False, 32), ("gptq", False, 64), ("gptq_v2", True, 128),
                                                 ("gptq_p", False, 64)])
def test_gptq_to_awq_and_back_is_bit_exact(src: str, sym: bool, gs: int, to: str) -> None:
    tensors, s = gptq_layer(weight(sym=sym, gs=gs, seed=gs), src)
    out, target = convert_tensors(tensors, s, to)
    assert target.method.value == "awq" and target.format.value == to and not target.desc_act
    assert target.pack_dtype == (torch.int16 if to in ("gemv_fast", "llm-awq") else torch.int32)
    assert set(out) == set(awq.checkpoint_shapes(target))
    w_src, w_dst = oracle(tensors, s), oracle(out, target)
    if to in ("gemm", "gemv"):
        np.testing.assert_array_equal(w_dst, w_src)
    else:  # the fast layouts compute q*s + fp16(-s*z): equal up to the rounding of the scaled zero
        np.testing.assert_allclose(w_dst, w_src, rtol=0, atol=np.abs(w_src).max() * 2e-3)
    back, s_back = convert_tensors(out, target, src)
    assert s_back.format.value == src and same_tensors(back, tensors)


@pytest.mark.parametrize("bits", [2, 8])
def test_other_widths_through_awq_gemm(bits: int) -> None:
    tensors, s = gptq_layer(weight(bits=bits, n=48, seed=bits))
    out, target = convert_tensors(tensors, s, "gemm")
    assert out["qweight"].shape == (128, 48 * bits // 32)
    np.testing.assert_array_equal(oracle(out, target), oracle(tensors, s))
    assert same_tensors(convert_tensors(out, target, "gptq_v2")[0], tensors)


def test_awq_to_awq_and_gptq_word_dtypes() -> None:
    tensors, s = gptq_layer(weight(seed=4))
    fast, fs = convert_tensors(tensors, s, "gemv_fast")
    llm, ls = convert_tensors(fast, fs, "llm-awq")
    assert torch.equal(llm["scaled_zeros"].view(torch.int16), fast["qzeros"].view(torch.int16))
    narrow, ns = convert_tensors(llm, ls, "gptq_v2", pack_dtype=torch.int16)
    assert ns.pack_dtype == torch.int16 and narrow["qweight"].dtype == torch.int16
    assert same_tensors(convert_tensors(narrow, ns, "gptq_v2")[0], tensors)


def test_bfloat16_gemm_scales() -> None:
    q = weight(seed=5)
    s = Scheme(bits=4, group_size=32, in_features=128, out_features=32, sym=False, method="awq", format="gemm")
    t = awq.to_checkpoint(q, "gemm", scale_dtype=torch.bfloat16)
    out, _ = convert_tensors(t, s, "gemm")
    assert out["scales"].dtype == torch.bfloat16 and torch.equal(out["scales"], t["scales"])
    to_gptq, gs_ = convert_tensors(t, s, "gptq_v2")  # these bfloat16 values are exact in float16
    assert to_gptq["scales"].dtype == torch.float16
    np.testing.assert_array_equal(oracle(to_gptq, gs_), awq_numpy.dequantize("gemm", {n: v.float().numpy() if
                                  v.is_floating_point() else v.numpy() for n, v in t.items()}, 4, 128, 32, 32))
    tiny = dict(t, scales=t["scales"].clone())
    tiny["scales"][0, 0] = 1e-7  # bfloat16 keeps 8 significant bits here, float16 (subnormal) fewer
    with pytest.raises(ConversionError, match=r"cannot convert gemm to gptq_v2 without loss: scales at \(out column "
                                              r"0, group 0\)"):
        convert_tensors(tiny, s, "gptq_v2")


def test_bias_is_carried() -> None:
    tensors, s = gptq_layer(weight(seed=6))
    bias = torch.randn(32).half()
    out, _ = convert_tensors({**tensors, "bias": bias}, s, "gemm")
    assert out["bias"].dtype == torch.float16 and torch.equal(out["bias"], bias)


# ------------------------------------------------------------------ refusals
def test_desc_act_to_awq_is_refused() -> None:
    tensors, s = gptq_layer(weight(desc_act=True))
    for to in AWQ:
        with pytest.raises(ConversionError, match=rf"cannot convert gptq_v2 to {to}: the weight is act-order "
                                                  r"\(desc_act\): AWQ layouts have no g_idx"):
            convert_tensors(tensors, s, to)
    out, target = convert_tensors(tensors, s, "gptq_p")  # GPTQ to GPTQ keeps g_idx
    assert target.desc_act and torch.equal(out["g_idx"], tensors["g_idx"])


def test_widths_and_groups_the_target_lacks_are_refused() -> None:
    tensors, s = gptq_layer(weight(bits=3))
    with pytest.raises(ConversionError, match="cannot convert gptq_v2 to gemm: AWQ checkpoint_format 'gemm' holds "
                                              "bits 2, 4, 8; got bits=3"):
        convert_tensors(tensors, s, "gemm")
    tensors, s = gptq_layer(weight(bits=5), "gptq_p")
    with pytest.raises(ConversionError, match="cannot convert gptq_p to gemm: .* got bits=5"):
        convert_tensors(tensors, s, "gemm")
    tensors, s = gptq_layer(weight(bits=8))
    with pytest.raises(ConversionError, match="cannot convert gptq_v2 to gemv: .* holds bits 4; got bits=8"):
        convert_tensors(tensors, s, "gemv")
    tensors, s = gptq_layer(weight(gs=16))
    with pytest.raises(ConversionError, match="cannot convert gptq_v2 to gemv_fast: .*no width for group size 16"):
        convert_tensors(tensors, s, "gemv_fast")
    tensors, s = gptq_layer(weight(n=12))
    with pytest.raises(ConversionError, match="out_features: 12 is not a multiple of 8"):
        convert_tensors(tensors, s, "gemm")


def test_lossy_fast_zeros_and_v1_zero_are_refused() -> None:
    q = weight(seed=7)
    scales = q.scales.clone()
    scales[2, 1] = 0.0  # a zero scale keeps no zero point in -s*z
    zeros = q.zeros.clone()
    zeros[2, 1] = 5
    tensors, s = gptq_layer(AffineWeight(codes=q.codes, scales=scales, zeros=zeros, g_idx=q.g_idx, bits=4,
                                         group_size=32, sym=False))
    with pytest.raises(ConversionError, match=r"to gemv_fast without loss: zeros at \(out column 2, group 1\): 5 reads "
                                              r"back as 0"):
        convert_tensors(tensors, s, "gemv_fast")
    scales[2, 1] = 60000.0
    tensors, s = gptq_layer(AffineWeight(codes=q.codes, scales=scales, zeros=zeros, g_idx=q.g_idx, bits=4,
                                         group_size=32, sym=False))
    with pytest.raises(ConversionError, match="to llm-awq: zeros: scaled zero .* overflows float16"):
        convert_tensors(tensors, s, "llm-awq")
    zeros[0, 0] = 0
    out, target = convert_tensors(*gptq_layer(AffineWeight(codes=q.codes, scales=q.scales, zeros=zeros, g_idx=q.g_idx,
                                                           bits=4, group_size=32, sym=False)), "gemm")
    with pytest.raises(ConversionError, match="cannot convert gemm to gptq: zeros: true zero point 0 at"):
        convert_tensors(out, target, "gptq")


def test_unknown_layouts_are_refused() -> None:
    tensors, s = gptq_layer(weight())
    with pytest.raises(ConversionError, match="vptq vptq: no encoder for integer codes in this layout"):
        convert_tensors(tensors, s, "vptq")
