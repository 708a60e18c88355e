"""GPTQ / AWQ <-> MLX (``mlx_convert``): lossless round trips or refusals naming the first group; mlx-lm 0.32.2's own
AWQ import (``_transform_awq_weights``) reproduced bit for bit with ``round_biases=True``; checkpoint directories
converted both ways; and the float rounding difference between the two formats' arithmetic, measured."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qlinear.affine import AffineWeight, quantize_rtn
from qlinear.build import scheme_of
from qlinear.convert import ConversionError, convert_tensors, decode, encode
from qlinear.enums import FORMAT
from qlinear.layouts import mlx
from qlinear.mlx_convert import MlxConversionError, from_affine, to_affine


def gptq(n: int, k: int, bits: int, gs: int, sym: bool, seed: int = 0) -> tuple[dict[str, torch.Tensor], AffineWeight]:
    """GPTQ v2 checkpoint tensors of a round-to-nearest weight (float16 scales, as GPTQModel stores them)."""
    g = torch.Generator().manual_seed(seed)
    q = quantize_rtn(torch.randn(n, k, generator=g) * 0.02, bits, gs, sym=sym)
    scheme = scheme_of(q, "gptq_v2")
    tensors = encode(q, scheme)
    return tensors, decode(tensors, scheme)


def real_values(q: AffineWeight) -> torch.Tensor:
    g = q.g_idx.long()
    return q.scales.double()[:, g] * (q.codes.double() - q.zeros.double()[:, g])


@pytest.mark.parametrize(("bits", "gs", "mlx_gs"), [(4, 128, 128), (2, 64, 64), (3, 32, 32), (8, 128, 128),
                                                    (4, 256, 128), (4, -1, 128)])
def test_symmetric_gptq_round_trips_exactly(bits: int, gs: int, mlx_gs: int) -> None:
    """Symmetric zero points (2^(bits-1)) make -scale * zero exact: GPTQ -> MLX -> GPTQ gives the same tensors (a
    group wider than 128 comes back as 128-wide groups with the same values)."""
    tensors, q = gptq(48, 512, bits, gs, sym=True)
    scheme = scheme_of(q, "gptq_v2")
    out, target = convert_tensors(tensors, scheme, FORMAT.MLX)
    assert target.format is FORMAT.MLX and target.group_size == mlx_gs and target.bits == bits
    w = mlx.from_checkpoint(out, target)
    assert torch.equal(w.codes, q.codes)
    exact = real_values(q)
    assert torch.equal(w.scales.double().repeat_interleave(mlx_gs, 1) * w.codes.double()
                       + w.biases.double().repeat_interleave(mlx_gs, 1), exact)
    back, scheme_back = convert_tensors(out, target, FORMAT.GPTQ_V2)
    assert scheme_back.sym and scheme_back.group_size == mlx_gs
    if mlx_gs == q.group_size:
        assert scheme_back == scheme and all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert torch.equal(real_values(decode(back, scheme_back)), exact)


def test_asymmetric_gptq_is_refused_naming_the_first_group() -> None:
    tensors, q = gptq(64, 512, 4, 128, sym=False)
    with pytest.raises(ConversionError, match=r"biases: group \(out \d+, inputs \d+\.\.\d+\), scale .* zero \d+: "
                                              r"-scale \* zero is not exactly representable in torch.float16"):
        convert_tensors(tensors, scheme_of(q, "gptq_v2"), FORMAT.MLX)


def test_asymmetric_zero_points_convert_when_exact() -> None:
    """Scales with few mantissa bits (k / 1024, k < 16) keep s * z exact for any 4-bit zero point."""
    g = torch.Generator().manual_seed(1)
    n, k = 16, 256
    q = AffineWeight(torch.randint(0, 16, (n, k), generator=g).to(torch.uint8),
                     (torch.randint(1, 16, (n, 4), generator=g) / 1024).half(),
                     torch.randint(0, 16, (n, 4), generator=g).to(torch.int32),
                     torch.arange(k, dtype=torch.int32) // 64, 4, 64, False)
    w = from_affine(q)
    back = to_affine(w)
    assert torch.equal(back.zeros, q.zeros) and torch.equal(back.codes, q.codes) and not back.sym
    assert torch.equal(back.scales, q.scales)


def test_round_biases_is_mlx_lm_awq_import_bit_for_bit() -> None:
    """AutoAWQ GEMM 4-bit tensors through mlx-lm's own importer vs ``from_affine(round_biases=True)``."""
    from tests import mlx_support as mxs

    mx = mxs.need_mlx()
    utils = pytest.importorskip("mlx_lm.utils", reason="mlx-lm is not installed: pip install --no-deps mlx-lm==0.32.2")
    g = torch.Generator().manual_seed(2)
    q = quantize_rtn(torch.randn(64, 256, generator=g) * 0.02, 4, 64, sym=False)
    scheme = scheme_of(q, "gemm")
    awq = encode(q, scheme)
    q16 = decode(awq, scheme)
    theirs, quant = utils._transform_awq_weights(
        {f"m.{k}": mx.array(v.numpy()) if v.dtype != torch.float16 else mxs.to_mlx(v) for k, v in awq.items()},
        {"bits": 4, "group_size": 64})
    assert quant == {"group_size": 64, "bits": 4}
    ours = mlx.to_checkpoint(from_affine(q16, round_biases=True))
    for name in ("weight", "scales", "biases"):
        t = mxs.to_torch(theirs[f"m.{name}"])
        assert t.dtype == ours[name].dtype
        assert np.array_equal(t.view(torch.int16 if name != "weight" else torch.int32).numpy(),
                              ours[name].view(torch.int16 if name != "weight" else torch.int32).numpy()), name
    with pytest.raises(MlxConversionError, match="biases: group"):
        from_affine(q16)


def test_real_mlx_weights_are_refused_as_gptq() -> None:
    """mx.quantize's biases are group edges, so -bias/scale is an integer only in some groups."""
    from tests import mlx_support as mxs

    mxs.need_mlx()
    words, scales, biases = mxs.quantize((torch.randn(64, 512) * 0.02).half(), 64, 4)
    w = mlx.MlxWeight(mlx.unpack(words, 4, 512), scales, biases, 4, 64)
    with pytest.raises(MlxConversionError, match=r"is not an integer zero point in 0\.\.15; \d+ of 512 groups are not"):
        to_affine(w)
    with pytest.raises(ConversionError, match="cannot convert mlx to gptq"):
        convert_tensors(mlx.to_checkpoint(w), mlx.scheme_for(4, 64, 512, 64), FORMAT.GPTQ)


def test_float_results_differ_in_rounding() -> None:
    """Same real numbers, different rounding: MLX rounds s * q and then the sum in float16 (error up to half an ulp
    of s * q, about maxq * |s| * 2^-11), GPTQ's s * (q - z) once (half an ulp of the result). Measured on a
    symmetric 4-bit layer: about half the float16 weights differ."""
    tensors, q = gptq(64, 512, 4, 128, sym=True)
    out, target = convert_tensors(tensors, scheme_of(q, "gptq_v2"), FORMAT.MLX)
    a = q.dequantize(torch.float16).double()
    b = mlx.from_checkpoint(out, target).dequantize().double()
    exact = real_values(q)
    assert 0.2 < (a != b).double().mean().item() < 0.8
    s = q.scales.double().abs().repeat_interleave(128, 1)
    assert ((a - exact).abs() <= exact.abs() * 2.0 ** -11 + 2.0 ** -25).all()
    assert ((b - exact).abs() <= (15 * s + exact.abs()) * 2.0 ** -11 + 2.0 ** -25).all()


@pytest.mark.parametrize(("change", "message"), [
    ({"bits": 7, "fmt": "gptq_p"}, "bits: MLX holds 1, 2, 3, 4, 5, 6, 8-bit codes; the weight is 7-bit"),
    ({"desc_act": True}, "the weight is act-order"),
    ({"gs": 48}, "group_size: MLX groups are 32, 64 or 128 wide"),
])
def test_refusals_say_why(change: dict[str, object], message: str) -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(32, 384, generator=g) * 0.02
    q = quantize_rtn(w, int(change.get("bits", 4)), int(change.get("gs", 128)), sym=True,
                     desc_act=bool(change.get("desc_act", False)))
    scheme = scheme_of(q, str(change.get("fmt", "gptq_v2")))
    with pytest.raises(ConversionError, match=message):
        convert_tensors(encode(q, scheme), scheme, FORMAT.MLX)


def test_bfloat16_mlx_scales_are_refused_by_float16_gptq() -> None:
    """A bfloat16 scale below float16's range has no float16 GPTQ form: refused, naming the scales."""
    s = torch.full((4, 2), 3.0e-8).bfloat16()
    w = mlx.MlxWeight(torch.zeros(4, 64, dtype=torch.uint8), s, -8 * s, 4, 32)
    with pytest.raises(ConversionError, match="cannot convert mlx to gptq_v2 without loss: scales"):
        convert_tensors(mlx.to_checkpoint(w), mlx.scheme_for(4, 32, 64, 4), FORMAT.GPTQ_V2)


def test_checkpoint_directories_convert_both_ways(tmp_path: Path) -> None:
    """A GPTQ v2 checkpoint -> mlx-lm layout (config.json "quantization", no quantize_config.json) -> GPTQ v2 again:
    every tensor identical to the first."""
    from qlinear import create_layer
    from qlinear.checkpoint.plan import find_tensors, plan_checkpoint
    from qlinear.checkpoint.safetensors_io import read_tensor
    from qlinear.checkpoint.save import convert_checkpoint, save_checkpoint

    layers = {}
    for i, (n, k) in enumerate(((64, 256), (128, 256))):
        q = quantize_rtn(torch.randn(n, k, generator=torch.Generator().manual_seed(i)) * 0.02, 4, 128, sym=True)
        layers[f"model.layers.0.mlp.p{i}"] = create_layer(q, format="gptq_v2", bias=torch.randn(n).half())
    src = save_checkpoint(layers, tmp_path / "gptq", "gptq_v2", config={"model_type": "llama"})
    mid = convert_checkpoint(src, tmp_path / "mlx", "mlx")
    assert not (mid / "quantize_config.json").exists()
    config = json.loads((mid / "config.json").read_text())
    assert config["quantization"] == {"group_size": 128, "bits": 4, "mode": "affine"}
    assert config["model_type"] == "llama"
    plan = plan_checkpoint(mid)
    assert sorted(plan.modules) == sorted(layers) and all(m.has_bias for m in plan.modules.values())
    back = convert_checkpoint(mid, tmp_path / "back", "gptq_v2")
    first, last = find_tensors(src)[2], find_tensors(back)[2]
    assert sorted(first) == sorted(last)
    assert all(torch.equal(read_tensor(first[k]), read_tensor(last[k])) for k in first)
