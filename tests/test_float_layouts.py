"""Float-quantized layouts (FP8 of GPTQModel / transformers / compressed-tensors, NVFP4, MXFP4): their
tensors decoded by the float64 oracle, round trips bit for bit, lossless conversions and refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear.blockfloat import FloatWeight
from qlinear.build import float_scheme_of
from qlinear.convert import ConversionError, convert_tensors
from qlinear.float_quant import quantize_fp8, quantize_mxfp4, quantize_nvfp4
from qlinear.layouts import float_layouts
from tests.oracle import float_numpy as ref

N, K = 40, 96


def weight(seed: int = 0, scale: float = 0.05) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * scale
    w[3] = 0.0  # an all-zero row: its scale must stay usable
    w[5, 7] = 1e-6 * scale  # a value deep in E4M3's subnormals
    return w


def oracle(tensors: dict[str, torch.Tensor], fmt: str, block: tuple[int, int]) -> np.ndarray:
    """Dequantize from the checkpoint tensors with the independent oracle (producer's operation order)."""
    if fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized"):
        packed = tensors["weight_packed"].numpy()
        raw = tensors["weight_scale"].view(torch.uint8).numpy()
        if fmt == "mxfp4-pack-quantized":
            return ref.dequant_fp4(packed, np.vectorize(ref.e8m0_value)(raw), block[1])
        scales = np.vectorize(lambda c: ref.fp8_value(int(c), "e4m3"))(raw)
        g = np.float32(tensors["weight_global_scale"].item())
        eff = (scales.astype(np.float32) / g).astype(np.float32)  # compressed-tensors: scale / global in float32
        return ref.dequant_fp4(packed, eff.astype(np.float64), block[1])
    name = "weight_scale_inv" if fmt in ("fp8", "hf_fp8") else "weight_scale"
    s = tensors[name].float().numpy().astype(np.float64)
    s = s.reshape(-(-N // block[0]), -(-K // block[1]))
    kind = "e4m3" if tensors["weight"].dtype == torch.float8_e4m3fn else "e5m2"
    return ref.dequant_fp8(tensors["weight"].view(torch.uint8).numpy(), kind, s, block, divide=fmt == "fp8")


CASES = [
    ("naive-quantized", lambda w: quantize_fp8(w)),
    ("float-quantized", lambda w: quantize_fp8(w, block=(16, 32), scale_dtype=torch.bfloat16)),
    ("float-quantized", lambda w: quantize_fp8(w, block=(N, K), scale_dtype=torch.float16)),
    ("naive-quantized", lambda w: quantize_fp8(w, element="e5m2", block=(1, 32))),
    ("hf_fp8", lambda w: quantize_fp8(w, block=(32, 64))),  # blocks that do not divide the weight (padded)
    ("fp8", lambda w: quantize_fp8(w, rule="divide")),
    ("fp8", lambda w: quantize_fp8(w, rule="divide", block=(N, K))),
    ("fp8", lambda w: quantize_fp8(w, rule="divide", block=(8, 32))),
    ("nvfp4-pack-quantized", quantize_nvfp4),
    ("mxfp4-pack-quantized", quantize_mxfp4),
]


@pytest.mark.parametrize(("fmt", "make"), CASES)
def test_layout_decodes_as_the_oracle_and_round_trips(fmt: str, make) -> None:
    fw: FloatWeight = make(weight())
    scheme = float_scheme_of(fw, fmt)
    tensors = float_layouts.to_checkpoint(fw, scheme)
    want = oracle(tensors, fmt, fw.block)
    got = float_layouts.from_checkpoint(tensors, scheme).dequantize(torch.float32).numpy()
    if fmt == "nvfp4-pack-quantized":  # value * f32(scale / global): the oracle's product rounded once
        assert np.array_equal(got, (want.astype(np.float32)))
    else:
        assert np.array_equal(got, want.astype(np.float32))
    back = float_layouts.to_checkpoint(float_layouts.from_checkpoint(tensors, scheme), scheme)
    assert tensors.keys() == back.keys()
    for name in tensors:
        a, b = tensors[name].reshape(-1), back[name].reshape(-1)
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


def test_stored_shapes_follow_each_producer() -> None:
    w = weight()
    shapes = {
        "fp8 row": float_layouts.to_checkpoint(quantize_fp8(w, rule="divide"), float_scheme_of(
            quantize_fp8(w, rule="divide"), "fp8"))["weight_scale_inv"].shape,
        "fp8 tensor": float_layouts.scale_shape(float_scheme_of(quantize_fp8(w, rule="divide", block=(N, K)))),
        "ct tensor": float_layouts.scale_shape(float_scheme_of(quantize_fp8(w, block=(N, K)), "float-quantized")),
        "ct channel": float_layouts.scale_shape(float_scheme_of(quantize_fp8(w), "float-quantized")),
        "nvfp4": float_layouts.scale_shape(float_scheme_of(quantize_nvfp4(w))),
    }
    assert shapes == {"fp8 row": (N,), "fp8 tensor": (), "ct tensor": (1,), "ct channel": (N, 1),
                      "nvfp4": (N, K // 16)}


def test_gptqmodel_inverse_scales_decode_right_when_every_row_exceeds_448() -> None:
    """The reference's CPU helper guesses multiply-or-divide from |scale_inv| <= 1 and gets weights whose rows all
    have absmax >= 448 wrong (relative error 0.99). The format says divide; qlinear never guesses."""
    w = weight(1, scale=1.0) * 1000  # rows' absmax in the thousands: every scale_inv is below 1
    fw = quantize_fp8(w, rule="divide")
    tensors = float_layouts.to_checkpoint(fw, float_scheme_of(fw, "fp8"))
    assert bool((tensors["weight_scale_inv"] <= 1).all())  # the zero row keeps 1
    deq = float_layouts.from_checkpoint(tensors, float_scheme_of(fw, "fp8")).dequantize()
    assert float((deq - w).norm() / w.norm()) < 0.04
    guessed = tensors["weight"].float() * tensors["weight_scale_inv"][:, None]  # the reference's wrong guess
    assert float((guessed - w).norm() / w.norm()) > 0.9


def test_lossless_float_conversions_and_refusals() -> None:
    fw = quantize_fp8(weight(), block=(32, 32))
    ct = float_scheme_of(fw, "float-quantized")
    tensors = float_layouts.to_checkpoint(fw, ct)
    hf, hf_scheme = convert_tensors(tensors, ct, "hf_fp8")
    assert torch.equal(hf["weight_scale_inv"], tensors["weight_scale"])
    naive, _ = convert_tensors(hf, hf_scheme, "naive-quantized")
    assert torch.equal(naive["weight"].view(torch.uint8), tensors["weight"].view(torch.uint8))
    with pytest.raises(ConversionError, match="stores scales that divide; the weight's multiply"):
        convert_tensors(tensors, ct, "fp8")
    with pytest.raises(ConversionError, match="float codes, which gptq_v2 does not hold"):
        convert_tensors(tensors, ct, "gptq_v2")
    bf = quantize_fp8(weight(), block=(32, 32), scale_dtype=torch.bfloat16)
    with pytest.raises(ConversionError, match="hf_fp8 .* stores them as torch.float32"):
        convert_tensors(float_layouts.to_checkpoint(bf, ct), ct, "hf_fp8")
    nv = quantize_nvfp4(weight())
    nv_scheme = float_scheme_of(nv)
    with pytest.raises(ConversionError, match="mxfp4-pack-quantized .* has no place for one"):
        convert_tensors(float_layouts.to_checkpoint(nv, nv_scheme), nv_scheme, "mxfp4-pack-quantized")


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t: t.update(weight_scale=t["weight_scale"][:, :2]), r"weight_scale: expected shape \[40, 6\]"),
    (lambda t: t.pop("weight_global_scale"), "weight_global_scale: missing"),
    (lambda t: t.update(weight_global_scale=torch.zeros(1)), "must be finite"),
    (lambda t: t.update(weight_zero_point=torch.zeros(1)), "asymmetric float weights"),
    (lambda t: t.update(weight_packed=t["weight_packed"].to(torch.int8)), "weight_packed: expected shape"),
])
def test_bad_tensors_are_named(edit, needle: str) -> None:
    fw = quantize_nvfp4(weight())
    scheme = float_scheme_of(fw)
    tensors = float_layouts.to_checkpoint(fw, scheme)
    edit(tensors)
    with pytest.raises(ValueError, match=needle):
        float_layouts.from_checkpoint(tensors, scheme)
