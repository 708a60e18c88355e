"""compressed-tensors integer layouts (pack-quantized; naive/int-quantized): packing against the independent
oracle (dense stream from 0.18, padded words before), decoding, lossless conversion to and from GPTQ / AWQ."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear import AffineWeight, Scheme, quantize_rtn
from qlinear.convert import ConversionError, convert_tensors
from qlinear.layouts import ct_int
from tests.oracle import float_numpy as ref

N, K = 24, 160


def scheme(bits: int = 4, block: tuple[int, int] = (1, 32), sym: bool = True, fmt: str = "pack-quantized",
           desc_act: bool = False, legacy: bool = False, n: int = N, k: int = K) -> Scheme:
    return Scheme(bits=bits, group_size=min(block[1], k), in_features=k, out_features=n, sym=sym, desc_act=desc_act,
                  method="compressed-tensors", format=fmt, scale_block=block, legacy_packing=legacy,
                  per_tensor_scale=block == (n, k))


def rtn(bits: int, group: int, sym: bool, seed: int = 0, desc_act: bool = False, k: int = K):
    """RTN codes with bfloat16 scales, as compressed-tensors models (bfloat16) carry them."""
    g = torch.Generator().manual_seed(seed)
    q = quantize_rtn(torch.randn(N, k, generator=g) * 0.02, bits=bits, group_size=group, sym=sym, desc_act=desc_act)
    return AffineWeight(codes=q.codes, scales=q.scales.to(torch.bfloat16), zeros=q.zeros, g_idx=q.g_idx, bits=bits,
                        group_size=q.group_size, sym=sym)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("legacy", [False, True])
def test_packing_matches_the_oracle(bits: int, legacy: bool) -> None:
    g = torch.Generator().manual_seed(bits)
    values = torch.randint(0, 1 << bits, (5, 77), generator=g, dtype=torch.uint8)
    words = ct_int.pack(values, bits, dim=1, legacy=legacy)
    per_word = 32 // bits
    assert words.shape == (5, -(-77 // per_word) if legacy and 32 % bits else -(-77 * bits // 32))
    signed = ref.ct_unpack(words.numpy(), bits, 77, legacy=legacy)
    assert np.array_equal(signed + (1 << (bits - 1)), values.numpy())
    assert torch.equal(ct_int.unpack(words, bits, 77, dim=1, legacy=legacy), values)
    cols = ct_int.pack(values.t().contiguous(), bits, dim=0, legacy=legacy)  # zero points pack along N
    assert torch.equal(cols, words.t())


def oracle_dequant(t: dict[str, torch.Tensor], s: Scheme) -> np.ndarray:
    """w = scale * (q - zp) from the stored tensors, decoded by the oracle."""
    b, n, k = s.bits, s.out_features, s.in_features
    bn, bk = s.scale_block
    if s.format.value == "pack-quantized":
        q = ref.ct_unpack(t["weight_packed"].numpy(), b, k, legacy=s.legacy_packing)
    else:
        q = t["weight"].numpy().astype(np.int64)
    scale = t["weight_scale"].float().numpy().astype(np.float64).reshape(-(-n // bn) if s.scale_block != (n, k)
                                                                        else 1, -1)
    if s.sym:
        zp = np.zeros_like(scale)
    elif s.format.value == "pack-quantized" and s.scale_block != (n, k):  # tensor strategy keeps it unpacked
        zp = ref.ct_unpack(t["weight_zero_point"].numpy().T.copy(), b, scale.shape[0], s.legacy_packing).T
    else:
        zp = t["weight_zero_point"].numpy().astype(np.float64).reshape(scale.shape)
    gi = t["weight_g_idx"].numpy() if s.desc_act else np.arange(k) // bk
    out = np.empty((n, k))
    for i in range(n):
        for j in range(k):
            r = 0 if s.scale_block == (n, k) else i // bn
            out[i, j] = scale[r, gi[j]] * (q[i, j] - zp[r, gi[j]])
    return out


@pytest.mark.parametrize(("bits", "block", "sym", "fmt", "desc", "legacy"), [
    (4, (1, 32), True, "pack-quantized", False, False),
    (4, (1, 32), False, "pack-quantized", False, False),
    (8, (1, K), True, "pack-quantized", False, False),
    (3, (1, 32), False, "pack-quantized", False, False),
    (3, (1, 32), False, "pack-quantized", False, True),
    (6, (1, 32), True, "pack-quantized", True, True),
    (4, (1, 32), True, "pack-quantized", True, False),
    (8, (N, K), False, "pack-quantized", False, False),
    (8, (1, K), True, "int-quantized", False, False),
    (4, (1, 32), False, "naive-quantized", False, False),
    (8, (8, 64), True, "naive-quantized", False, False),
])
def test_tensors_decode_as_the_oracle_and_round_trip(bits, block, sym, fmt, desc, legacy) -> None:
    s = scheme(bits, block, sym, fmt, desc, legacy)
    q = rtn(bits, block[1], sym, seed=bits, desc_act=desc)
    if block[0] > 1:  # a block spans several rows: give every row of a block the same scale and zero
        rows = torch.arange(N) // block[0] * block[0]
        q = type(q)(codes=q.codes, scales=q.scales[rows], zeros=q.zeros[rows], g_idx=q.g_idx, bits=bits,
                    group_size=q.group_size, sym=sym)
    t = ct_int.to_checkpoint(q, s, torch.bfloat16)
    back = ct_int.from_checkpoint(t, s)
    assert np.array_equal(back.dequantize(torch.float64).numpy(), oracle_dequant(t, s))
    again = ct_int.to_checkpoint(back, s)
    assert t.keys() == again.keys() and all(torch.equal(t[n], again[n]) for n in t)
    if not sym and fmt == "pack-quantized" and block[0] == 1:
        assert t["weight_zero_point"].shape == (ct_int.words_along(N, bits, legacy), s.num_groups)


def test_w4a16_converts_losslessly_to_gptq_v2_and_awq_and_back() -> None:
    s = scheme(4, (1, 32), sym=False)
    t = ct_int.to_checkpoint(rtn(4, 32, False), s, torch.bfloat16)
    gptq, gs = convert_tensors(t, s, "gptq_v2")
    assert gptq["scales"].dtype == torch.float16  # bfloat16 values of a usual range are exact in float16
    awq, aws = convert_tensors(t, s, "gemm")
    assert awq["scales"].dtype == torch.bfloat16
    for tensors, src in ((gptq, gs), (awq, aws)):
        back, bs = convert_tensors(tensors, src, "pack-quantized")
        assert bs.scale_block == (1, 32) and bs.method.value == "compressed-tensors"
        assert torch.equal(back["weight_packed"], t["weight_packed"])
        assert torch.equal(back["weight_zero_point"], t["weight_zero_point"])
        assert torch.equal(back["weight_scale"].double(), t["weight_scale"].double())
    in_mem, _ = convert_tensors(t, s, "gptq_v2", in_memory=True)
    assert in_mem["scales"].dtype == torch.bfloat16


def test_conversion_refusals_name_the_reason() -> None:
    s = scheme(4, (1, 32), sym=True, desc_act=True)
    t = ct_int.to_checkpoint(rtn(4, 32, True, desc_act=True), s)
    with pytest.raises(ConversionError, match="act-order"):
        convert_tensors(t, s, "gemm")
    tiny = dict(ct_int.to_checkpoint(rtn(4, 32, True), scheme()))
    tiny["weight_scale"] = torch.full_like(tiny["weight_scale"], 3e-8, dtype=torch.bfloat16)
    with pytest.raises(ConversionError, match="scales at"):
        convert_tensors(tiny, scheme(), "gptq_v2")
    with pytest.raises(ConversionError, match="integer codes, which float-quantized does not hold"):
        convert_tensors(tiny, scheme(), "float-quantized")


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t: t.update(weight_shape=torch.tensor([N, K + 1])), rf"weight_shape: says \[{N}, {K + 1}\]"),
    (lambda t: t.pop("weight_zero_point"), "weight_zero_point: missing"),
    (lambda t: t.update(weight_scale=t["weight_scale"].to(torch.int32)), "weight_scale: expected shape"),
    (lambda t: t.update(weight_packed=t["weight_packed"][:, :-1]), r"weight_packed: expected shape \[24, 20\]"),
])
def test_bad_tensors_are_named(edit, needle: str) -> None:
    s = scheme(4, (1, 32), sym=False)
    t = dict(ct_int.to_checkpoint(rtn(4, 32, False), s))
    edit(t)
    with pytest.raises(ValueError, match=needle):
        ct_int.from_checkpoint(t, s)


def test_naive_values_out_of_range_are_refused() -> None:
    s = scheme(4, (1, 32), fmt="naive-quantized")
    t = dict(ct_int.to_checkpoint(rtn(4, 32, True), s))
    t["weight"] = t["weight"].clone()
    t["weight"][0, 0] = 9
    with pytest.raises(ValueError, match="4-bit values must be in -8..7; found"):
        ct_int.from_checkpoint(t, s)
