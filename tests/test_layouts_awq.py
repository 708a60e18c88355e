"""AWQ layouts (gemm, gemv, gemv_fast, llm-awq) and the CPU int4pack inputs, against the spec's worked examples
and the independent float64 oracle in tests/oracle/awq_numpy.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qlinear import AffineWeight, ConfigError, Scheme, quantize_rtn
from qlinear.layouts import awq
from qlinear.layouts.int4pack import int4pack_reasons, reorder_index, to_int4pack_inputs, zero_offsets
from tests.oracle import awq_numpy as oracle


def affine(n: int, k: int, gs: int, bits: int = 4, sym: bool = False, seed: int = 0) -> AffineWeight:
    """Random codes and zeros, float16-representable positive scales."""
    g = torch.Generator().manual_seed(seed)
    groups, maxq = -(-k // gs), (1 << bits) - 1
    zeros = torch.full((n, groups), 1 << (bits - 1), dtype=torch.int32) if sym else \
        torch.randint(0, maxq + 1, (n, groups), generator=g, dtype=torch.int32)
    return AffineWeight(codes=torch.randint(0, maxq + 1, (n, k), generator=g).to(torch.uint8),
                        scales=(torch.rand(n, groups, generator=g) * 0.05 + 1e-3).half().float(), zeros=zeros,
                        g_idx=torch.arange(k, dtype=torch.int32) // gs, bits=bits, group_size=gs, sym=sym)


def scheme(q: AffineWeight, fmt: str) -> Scheme:
    return Scheme(bits=q.bits, group_size=q.group_size, in_features=q.in_features, out_features=q.out_features,
                  sym=q.sym, method="awq", format=fmt)


def same(a: AffineWeight, b: AffineWeight) -> bool:
    return (torch.equal(a.codes, b.codes) and torch.equal(a.zeros.int(), b.zeros.int())
            and torch.equal(a.scales.double(), b.scales.double()) and torch.equal(a.g_idx.int(), b.g_idx.int()))


# ------------------------------------------------------------------ worked examples (formats.md 2.5-2.7)
def word(v: int, bits: int = 32) -> int:
    return v - (1 << bits) if v >= 1 << (bits - 1) else v


def test_gemm_worked_examples() -> None:
    assert awq.pack_gemm(torch.arange(8, dtype=torch.uint8)[None], 4).item() == word(0x75316420)
    assert awq.pack_gemm(torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8), 8).item() == 0x04030201  # natural order
    assert awq.pack_gemm((torch.arange(16) % 4).to(torch.uint8)[None], 2).item() == word(0xE4E4E4E4)
    assert awq.REVERSE_ORDER == (0, 4, 1, 5, 2, 6, 3, 7)
    assert awq.unpack_gemm(torch.tensor([[word(0x75316420)]], dtype=torch.int32), 4, 8).tolist() == [list(range(8))]


def test_gemv_worked_example_and_zeros_width() -> None:
    q = affine(8, 64, 32)
    q = AffineWeight(codes=(torch.arange(64) % 8 + 1).to(torch.uint8).repeat(8, 1), scales=q.scales, zeros=q.zeros,
                     g_idx=q.g_idx, bits=4, group_size=32, sym=False)
    t = awq.to_checkpoint(q, "gemv")
    assert t["qweight"][0, 0].item() == word(0x87654321) and t["qweight"].shape == (8, 8)
    assert t["qzeros"].shape == (8, 4) and t["scales"].shape == (8, 32) and not t["scales"][:, 2:].any()
    table = {(4096, 128): 4, (4096, 64): 8, (4096, 32): 16, (256, 128): 1, (256, 64): 2, (256, 32): 4,
             (1088, 128): 2, (64, 64): 2, (32, 32): 4}
    for (k, gs), zw in table.items():
        assert awq.zeros_width(k, gs) == zw == oracle.zeros_width(k, gs), (k, gs)
    for gs in (16, 48, 96):
        with pytest.raises(ValueError, match=f"no width for group size {gs}"):
            awq.zeros_width(1024, gs)


def test_gemv_fast_worked_examples() -> None:
    assert list(awq.FAST_PERM) == oracle.FAST_TABLE
    rows = torch.arange(4, dtype=torch.uint8)[:, None].repeat(1, 64)  # Q[n][k] = n
    assert awq.pack_fast(rows).tolist() == [[0] * 16 + [0x1111] * 16 + [0x2222] * 16 + [0x3333] * 16]
    cols = (torch.arange(64) % 16).to(torch.uint8).repeat(4, 1)  # Q[n][k] = k % 16
    expected = [word(v, 16) for v in (0x8080, 0x9191, 0xA2A2, 0xB3B3, 0xC4C4, 0xD5D5, 0xE6E6, 0xF7F7)]
    assert awq.pack_fast(cols)[0, :16].tolist() == expected * 2
    # -s*z rounds in float16: 0.1 (fp16 0.0999755859375) * 3 = 0.2999267578125 ties to 0.2998046875 (even)
    s, z = torch.tensor([[0.1]]).half(), torch.tensor([[3]], dtype=torch.int32)
    zb = awq.scaled_zeros(s, z)
    assert zb.item() == -0.2998046875 and awq.zeros_from_scaled(zb, s, 4).item() == 3
    assert awq.scaled_zeros(s, torch.zeros_like(z)).view(torch.int16).item() == word(0x8000, 16)  # -0.0 as written


def test_gemv_fast_zero_points_recover_exactly_for_every_float16_scale() -> None:
    s = torch.arange(1, 0x7C00, dtype=torch.int32).to(torch.int16).view(torch.float16)  # every positive finite fp16
    big_s, z = s[:, None].expand(-1, 16), torch.arange(16, dtype=torch.int32)[None].expand(s.numel(), -1)
    fits = torch.isfinite(big_s.float() * 15).all(1) & (big_s.float() * 15 <= 65504).all(1)
    big_s, z = big_s[fits], z[fits]
    assert torch.equal(awq.zeros_from_scaled(awq.scaled_zeros(big_s, z), big_s, 4), z)


# ------------------------------------------------------------------ round trips through the oracle
@st.composite
def cases(draw: st.DrawFn) -> tuple[str, AffineWeight]:
    fmt = draw(st.sampled_from(["gemm", "gemv", "gemv_fast", "llm-awq"]))
    bits = draw(st.sampled_from([2, 4, 8])) if fmt == "gemm" else 4
    if fmt == "gemm":
        n, k = 32 // bits * draw(st.integers(1, 4)), draw(st.integers(1, 80))
        gs = draw(st.sampled_from([k, 16, 32, 64, 128]))
    elif fmt == "gemv":
        gs = draw(st.sampled_from([32, 64, 128]))
        n, k = draw(st.integers(1, 12)), gs * draw(st.integers(1, 3)) + 8 * draw(st.integers(0, 3))
    else:
        n, k = 4 * draw(st.integers(1, 3)), 64 * draw(st.integers(1, 3))
        gs = draw(st.sampled_from([32, 64, 128]))
    return fmt, affine(n, k, min(gs, k) if fmt == "gemm" else gs, bits, draw(st.booleans()), draw(st.integers(0, 99)))


@settings(max_examples=40, deadline=None)
@given(cases())
def test_round_trip_matches_the_oracle(case: tuple[str, AffineWeight]) -> None:
    fmt, q = case
    t = awq.to_checkpoint(q, fmt)
    shapes = awq.checkpoint_shapes(scheme(q, fmt))
    assert {n: (tuple(v.shape), v.dtype) for n, v in t.items()} == shapes
    back = awq.from_checkpoint(t, scheme(q, fmt))
    assert same(q, back)
    again = awq.to_checkpoint(back, fmt)
    assert all(torch.equal(t[n].view(torch.int16) if t[n].is_floating_point() else t[n],
                           again[n].view(torch.int16) if t[n].is_floating_point() else again[n]) for n in t)
    arrays = {n: v.numpy() for n, v in t.items()}
    w = oracle.dequantize(fmt, arrays, q.bits, q.in_features, q.out_features, q.group_size)
    if fmt in ("gemm", "gemv"):
        np.testing.assert_array_equal(w, q.dequantize(torch.float64).numpy())
    else:  # q*s + fp16(-s*z): off from s*(q-z) by the rounding of the scaled zero only
        np.testing.assert_allclose(w, q.dequantize(torch.float64).numpy(), rtol=0, atol=float(q.scales.max()) * 0.01)
        np.testing.assert_array_equal(oracle.fast_unpack(arrays["qweight"], q.out_features), q.codes.numpy())


def test_gemm_scales_in_bfloat16() -> None:
    q = affine(16, 64, 32, seed=3)
    t = awq.to_checkpoint(q, "gemm", scale_dtype=torch.bfloat16)
    assert t["scales"].dtype == torch.bfloat16
    assert torch.equal(awq.from_checkpoint(t, scheme(q, "gemm")).scales, t["scales"].t())
    with pytest.raises(ValueError, match=r"scales: expected shape \[16, 32\] dtype torch.float16 for gemv 4-bit.* "
                                         r"dtype torch.bfloat16"):
        awq.from_checkpoint({**awq.to_checkpoint(q, "gemv"), "scales": torch.zeros(16, 32, dtype=torch.bfloat16)},
                            scheme(q, "gemv"))


# ------------------------------------------------------------------ bad input
def test_bad_inputs_are_named() -> None:
    q = affine(16, 64, 32)
    with pytest.raises(ValueError, match="out_features: 12 is not a multiple of 8: AWQ GEMM packs 8 4-bit"):
        awq.to_checkpoint(affine(12, 64, 32), "gemm")
    with pytest.raises(ValueError, match="out_features: 24 is not a multiple of 16"):
        awq.to_checkpoint(affine(24, 64, 32, bits=2), "gemm")
    with pytest.raises(ConfigError, match="AWQ checkpoint_format 'gemm' holds bits 2, 4, 8; got bits=3"):
        awq.to_checkpoint(affine(32, 64, 32, bits=3), "gemm")
    with pytest.raises(ConfigError, match="AWQ checkpoint_format 'gemv' holds bits 4; got bits=8"):
        awq.to_checkpoint(affine(16, 64, 32, bits=8), "gemv")
    with pytest.raises(ValueError, match="no width for group size 16"):
        awq.to_checkpoint(affine(16, 64, 16), "gemv_fast")
    with pytest.raises(ValueError, match="in_features: 60 is not a multiple of 8"):
        awq.to_checkpoint(affine(16, 60, 32), "gemv")
    with pytest.raises(ValueError, match="gemv_fast needs K a multiple of 64 and N a multiple of 4"):
        awq.to_checkpoint(affine(6, 64, 32), "gemv_fast")
    with pytest.raises(ValueError, match=r"g_idx: act-order grouping \(desc_act\) has no AWQ encoding"):
        awq.to_checkpoint(quantize_rtn(torch.randn(16, 64), group_size=32, desc_act=True), "gemm")
    t = awq.to_checkpoint(q, "gemm")
    with pytest.raises(ValueError, match=r"qweight: expected shape \[64, 2\] dtype torch.int32 for gemm 4-bit K=64 "
                                         r"N=16 gs=32 G=2, got shape \[64, 3\] dtype torch.int32"):
        awq.from_checkpoint({**t, "qweight": torch.zeros(64, 3, dtype=torch.int32)}, scheme(q, "gemm"))
    with pytest.raises(ValueError, match="qzeros: missing from the checkpoint tensors"):
        awq.from_checkpoint({"qweight": t["qweight"], "scales": t["scales"]}, scheme(q, "gemm"))
    with pytest.raises(ValueError, match="pack_dtype: AWQ gemv_fast checkpoints store torch.int16 words, got "
                                         "torch.int32"):
        awq.checkpoint_shapes(Scheme(bits=4, group_size=32, in_features=64, out_features=16, method="awq",
                                     format="gemv_fast", pack_dtype=torch.int32))
    with pytest.raises(ValueError, match="fmt: expected one of gemm, gemv, gemv_fast, llm-awq, got 'gptq'"):
        awq.to_checkpoint(q, "gptq")


def test_gemv_fast_zero_without_integer_z_is_refused() -> None:
    q = affine(8, 64, 32, seed=5)
    t = awq.to_checkpoint(q, "llm-awq")
    bad = t["scaled_zeros"].clone()
    bad[1, 3] = -t["scales"][1, 3] * 2.5
    with pytest.raises(ValueError, match=r"scaled_zeros: scaled zero .* at \(group 1, out column 3\) is not -s\*z for "
                                         r"an integer z in 0\.\.15"):
        awq.from_checkpoint({**t, "scaled_zeros": bad}, scheme(q, "llm-awq"))
    with pytest.raises(ValueError, match="overflows float16"):
        awq.scaled_zeros(torch.tensor([[60000.0]]), torch.tensor([[2]]))


# ------------------------------------------------------------------ CPU int4pack inputs (formats.md 2.11)
def test_int4pack_reorder_index() -> None:
    assert reorder_index(torch.arange(96, dtype=torch.int32) // 32, 32) is None
    q = quantize_rtn(torch.randn(16, 80), bits=4, group_size=32, desc_act=True)
    ret = reorder_index(q.g_idx, 32)
    assert sorted(ret.tolist()) == list(range(80))
    assert torch.equal(q.g_idx[ret].long(), torch.arange(80) // 32)  # every group's rows contiguous
    for g in range(3):  # ascending input channel inside a group
        assert ret[g * 32:(g + 1) * 32].tolist() == sorted(ret[g * 32:(g + 1) * 32].tolist())
    with pytest.raises(ValueError, match="g_idx: group 0 holds 3 input channels, expected 2"):
        reorder_index(torch.tensor([0, 0, 0, 1]), 2)


def test_int4pack_inputs_drive_the_cpu_ops() -> None:
    q = quantize_rtn(torch.randn(32, 128) * 0.02, bits=4, group_size=32, sym=False, desc_act=True)
    inputs = to_int4pack_inputs(q)
    assert inputs.weight.dtype == torch.int32 and inputs.weight.shape == (32, 128)
    assert inputs.scales_and_zeros.shape == (4, 32, 2) and inputs.scales_and_zeros.dtype == torch.bfloat16
    s = q.scales.t().bfloat16().float()
    assert torch.equal(inputs.scales_and_zeros[..., 1], ((8 - q.zeros.t().float()) * s).bfloat16())
    assert torch.equal(zero_offsets(torch.tensor([[8]]), torch.tensor([[0.5]]), 4), torch.zeros(1, 1).bfloat16())
    assert int4pack_reasons(128, 32, 32) == []
    assert int4pack_reasons(100, 24, 16) == [
        "group size 16 not accepted by _weight_int4pack_mm_for_cpu (takes 32, 64, 128, 256)",
        "out_features 24 not a multiple of 16 (_convert_weight_to_int4pack_for_cpu)"]
    with pytest.raises(ValueError, match="bits: the int4pack ops hold 4-bit codes only, got 8-bit"):
        to_int4pack_inputs(quantize_rtn(torch.randn(16, 64), bits=8, group_size=32))
    if not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"):
        pytest.skip("this torch build lacks the CPU int4pack ops")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(inputs.weight, 1)
    x = torch.randn(3, 128)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x[:, inputs.ret_idx].bfloat16(), packed, 32,
                                                   inputs.scales_and_zeros)
    ref = x.double() @ q.dequantize(torch.float64).t()
    assert (y.double() - ref).abs().max() / ref.abs().max() < 2e-2


def test_scheme_resolves_the_word_dtype_from_the_format() -> None:
    from qlinear import QuantizeConfig

    for fmt, word in (("gemv_fast", torch.int16), ("llm-awq", torch.int16), ("gemm", torch.int32),
                      ("gemv", torch.int32)):
        s = Scheme(bits=4, group_size=64, in_features=128, out_features=8, method="awq", format=fmt)
        assert s.pack_dtype == word
        cfg = QuantizeConfig.from_hf_config({"quant_method": "awq", "bits": 4, "group_size": 64, "version": fmt})
        assert cfg.pack_dtype == word and cfg.scheme(128, 8).pack_dtype == word
    assert Scheme(bits=4, group_size=64, in_features=128, out_features=8).pack_dtype == torch.int32
    assert QuantizeConfig(pack_dtype="int16").pack_dtype == torch.int16
    with pytest.raises(ConfigError, match="AWQ never reorders input channels: desc_act must be False"):
        Scheme(bits=4, group_size=64, in_features=128, out_features=8, method="awq", format="gemm", desc_act=True)
