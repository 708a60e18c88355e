"""BitBLAS checkpoints (GPTQModel 7.7 ``format: bitblas``): codec, conversions, planning and loading.

Producer facts: ``tests/fixtures/bitblas_golden.safetensors`` holds BitBLAS 0.1.0.post1's own NumPy
``general_compress`` (2, 4, 8 bits) and ``interleave_weight(..., "float16")`` (the LOP3 permutation, 4 bits), made by
``tests/fixtures/make_bitblas_golden.py``. BitBLAS's TVM operators need CUDA's libnvrtc and do not import here; its
NumPy 2-bit interleave overflows under NumPy 2, so the 2-bit permutation is checked against a transcription of the
TIR ``interleave_weight_f16_2b`` (``bitblas/ops/lop3_permutate/lop3_permutate_impl.py``), written below with NumPy
uint32 words. What GPTQModel stores (``nn_modules/qlinear/bitblas.py``): ``qweight`` = the operator's weight
transform of the ``[N, K]`` codes, float16 ``scales [N, G]``, ``qzeros`` = ``general_compress`` of ``[G, N]`` true
zeros, or an empty int8 buffer when symmetric (signed ``int{bits}``, code ``q`` means ``q - 2**(bits-1)``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from qlinear.affine import AffineWeight
from qlinear.convert import ConversionError, convert_tensors
from qlinear.layouts import bitblas as bb
from qlinear.layouts import gptq
from qlinear.spec import Scheme

F16 = torch.float16
GOLDEN = Path(__file__).parent / "fixtures" / "bitblas_golden.safetensors"


def scheme(bits: int = 4, k: int = 128, n: int = 32, gs: int = 32, sym: bool = False, method: str = "gptq",
           fmt: str = "bitblas") -> Scheme:
    return Scheme(bits=bits, group_size=gs, in_features=k, out_features=n, sym=sym, method=method, format=fmt)


def weight(s: Scheme, seed: int = 0) -> AffineWeight:
    g = torch.Generator().manual_seed(seed)
    n, k, b, groups = s.out_features, s.in_features, s.bits, s.num_groups
    codes = torch.randint(0, 1 << b, (n, k), generator=g, dtype=torch.int16).to(torch.uint8)
    zeros = torch.full((n, groups), 1 << (b - 1), dtype=torch.int32) if s.sym \
        else torch.randint(0, 1 << b, (n, groups), generator=g, dtype=torch.int32)
    scales = (torch.rand(n, groups, generator=g) * 0.02 + 0.001).half()
    return AffineWeight(codes, scales, zeros, torch.arange(k, dtype=torch.int32) // s.group_size, b, s.group_size,
                        s.sym)


# ---------------------------------------------------------------- against the producer's packing
def tir_lop3_2bit(words: np.ndarray) -> np.ndarray:
    """Transcription of BitBLAS's ``interleave_weight_f16_2b`` on uint32 words (independent of qlinear's code)."""
    b = np.zeros_like(words)
    for offset in range(16):  # num_groups 2, elems_per_group 8
        shift = (offset % 2) * 16 + (offset // 2) * 2
        b |= ((words >> np.uint32(2 * offset)) & np.uint32(3)) << np.uint32(shift)
    t1 = b & np.uint32(0xFF0000FF)
    t2 = ((b & np.uint32(0x00FF0000)) << np.uint32(8)) >> np.uint32(16)
    t3 = ((b & np.uint32(0x0000FF00)) << np.uint32(16)) >> np.uint32(8)
    return t1 | t2 | t3


def test_packing_matches_bitblas_golden() -> None:
    t = load_file(str(GOLDEN))
    for bits in (2, 4, 8):
        codes = t[f"codes_{bits}"]
        assert torch.equal(bb.compress(codes, bits), t[f"compress_{bits}"]), bits
        assert torch.equal(bb.decompress(t[f"compress_{bits}"], bits, codes.shape[1]), codes), bits
    assert torch.equal(bb.pack_qweight(t["codes_4"], 4), t["lop3_4"])
    assert torch.equal(bb.pack_qweight(t["codes_8"], 8), t["compress_8"])  # 8 bits: no fast-decoding permutation
    words = t["compress_2"].numpy().view(np.uint32)
    expected = torch.from_numpy(tir_lop3_2bit(words).view(np.int8).reshape(t["compress_2"].shape).copy())
    assert torch.equal(bb.pack_qweight(t["codes_2"], 2), expected)
    for bits in (2, 4, 8):
        assert torch.equal(bb.unpack_qweight(bb.pack_qweight(t[f"codes_{bits}"], bits), bits, 64), t[f"codes_{bits}"])


def test_lop3_word_by_hand() -> None:
    """4-bit: codes 0..7 of one word go to nibbles 0,4,1,5,2,6,3,7 (even codes in the low half)."""
    codes = torch.arange(8, dtype=torch.uint8).view(1, 8)
    word = int(bb.pack_qweight(codes, 4).view(torch.int32)[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]


# ---------------------------------------------------------------- codec vs a float64 reference
@pytest.mark.parametrize(("bits", "gs", "sym", "method"), [(4, 32, False, "gptq"), (4, 128, True, "gptq"),
                                                           (2, 64, False, "gptq"), (8, 32, True, "gptq"),
                                                           (8, 128, False, "gptq"), (4, 64, False, "awq")])
def test_round_trip_and_float64_reference(bits: int, gs: int, sym: bool, method: str) -> None:
    s = scheme(bits, gs=gs, sym=sym, method=method)
    q = weight(s, seed=bits + gs)
    t = bb.to_checkpoint(q, s)
    shapes = bb.checkpoint_shapes(s)
    assert {k: (tuple(v.shape), v.dtype) for k, v in t.items()} == {k: v for k, v in shapes.items()}
    back = bb.from_checkpoint(t, s)
    assert torch.equal(back.codes, q.codes) and torch.equal(back.zeros, q.zeros) and torch.equal(back.scales, q.scales)
    # float64, straight from the stored bytes: unpermute by the bit positions of the docstring, then (q - z) * s
    raw = t["qweight"].view(torch.uint8).numpy().astype(np.uint64)
    n, k = s.out_features, s.in_features
    if bits in (2, 4):
        words = raw.reshape(n, -1, 4) @ (np.uint64(1) << (np.uint64(8) * np.arange(4, dtype=np.uint64)))
        per = 32 // bits
        dest = [16 * (i % 2) + bits * (i // 2) for i in range(per)]
        if bits == 2:
            dest = [d + 8 if d // 8 == 1 else d - 8 if d // 8 == 2 else d for d in dest]
        codes = np.stack([(words >> np.uint64(d)) & np.uint64((1 << bits) - 1) for d in dest], -1).reshape(n, k)
    else:
        codes = raw
    if bb.zeros_stored(s):
        zb = t["qzeros"].view(torch.uint8).numpy().astype(np.int64)
        per = 8 // bits
        z = np.stack([(zb >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], -1).reshape(s.num_groups, n).T
    else:
        z = np.full((n, s.num_groups), 1 << (bits - 1))
    g = np.arange(k) // gs
    ref = (codes.astype(np.float64) - z[:, g]) * t["scales"].double().numpy()[:, g]
    assert np.array_equal(ref, q.dequantize(torch.float64).numpy())


def test_gptq_to_bitblas_to_gptq_is_byte_identical() -> None:
    for bits, sym in ((4, False), (4, True), (2, False), (8, True)):
        src = scheme(bits, gs=32, sym=sym, fmt="gptq_v2")
        g = gptq.to_checkpoint(weight(src, seed=bits), src.format, src.pack_dtype)
        g["bias"] = torch.randn(src.out_features).half()
        b, bs = convert_tensors(g, src, "bitblas")
        assert bs.format.value == "bitblas" and set(b) == {"qweight", "scales", "qzeros", "bias"}
        back, s2 = convert_tensors(b, bs, "gptq_v2")
        assert s2 == src
        for name in g:
            assert g[name].dtype == back[name].dtype and torch.equal(g[name], back[name]), (bits, sym, name)


def test_awq_gemm_round_trip_through_bitblas() -> None:
    from qlinear.layouts import awq

    src = scheme(4, gs=64, method="awq", fmt="gemm")
    t = awq.to_checkpoint(weight(src, seed=3), src.format, scale_dtype=torch.float16)
    b, bs = convert_tensors(t, src, "bitblas")
    back, _ = convert_tensors(b, bs, "gemm")
    assert all(torch.equal(t[n], back[n]) for n in t)


# ---------------------------------------------------------------- checkpoint directory as GPTQModel writes it
def write_gptqmodel_dir(root: Path, sym: bool) -> tuple[dict[str, torch.Tensor], Scheme]:
    src = scheme(4, k=128, n=48, gs=32, sym=sym, fmt="gptq_v2")
    g = gptq.to_checkpoint(weight(src, seed=11), src.format, src.pack_dtype)
    g["bias"] = (torch.randn(src.out_features) * 0.1).half()
    b, _ = convert_tensors(g, src, "bitblas")
    if sym:
        assert b["qzeros"].shape == (0,)
    tensors = {f"model.layers.0.mlp.up_proj.{k}": v for k, v in b.items()}
    tensors["model.embed_tokens.weight"] = torch.zeros(4, 128, dtype=torch.float16)
    save_file(tensors, str(root / "model.safetensors"))
    (root / "quantize_config.json").write_text(json.dumps({
        "bits": 4, "group_size": 32, "desc_act": False, "sym": sym, "quant_method": "gptq", "format": "bitblas",
        "checkpoint_format": "bitblas", "pack_dtype": "int32"}))
    return g, src


@pytest.mark.parametrize("sym", [False, True])
def test_checkpoint_loads_and_matches_the_gptq_layer(tmp_path: Path, sym: bool) -> None:
    from qlinear.checkpoint.load import build_layer, load_checkpoint
    from qlinear.checkpoint.plan import plan_checkpoint
    from qlinear.target import Target

    g, src = write_gptqmodel_dir(tmp_path, sym)
    plan = plan_checkpoint(tmp_path)
    mp = plan.modules["model.layers.0.mlp.up_proj"]
    assert mp.scheme.format.value == "bitblas" and mp.scheme.sym is sym
    layer = load_checkpoint(tmp_path)["model.layers.0.mlp.up_proj"]
    assert "re-encoded to gptq_v2" in (layer.choice.note or "")
    ref = build_layer("ref", src, g, Target.here("cpu"))
    x = torch.randn(3, 128, dtype=torch.float16)
    assert torch.equal(layer(x), ref(x))
    w64 = ref.affine().dequantize(torch.float64)
    y64 = x.double() @ w64.t() + g["bias"].double()
    assert torch.allclose(layer(x).double(), y64, atol=2e-2, rtol=1e-2)


def test_bitblas_kernel_holds_the_checkpoint_tensors(tmp_path: Path) -> None:
    from qlinear.checkpoint.load import read_module
    from qlinear.checkpoint.plan import plan_checkpoint
    from qlinear.kernels.bitblas import AWQBitBlasKernel, BitblasLinear

    write_gptqmodel_dir(tmp_path, sym=True)
    mp = plan_checkpoint(tmp_path).modules["model.layers.0.mlp.up_proj"]
    tensors, s = read_module(mp)
    layer = BitblasLinear(s, bias=True)
    layer.load_state_dict({k: v for k, v in tensors.items() if k != "qzeros"}, strict=True)  # empty qzeros optional
    sd = layer.state_dict()
    assert all(torch.equal(sd[k], tensors[k]) for k in tensors)
    fresh = BitblasLinear(s, bias=True)
    fresh.load_affine(layer.affine(), tensors["bias"])
    assert all(torch.equal(fresh.state_dict()[k], tensors[k]) for k in tensors)
    assert set(BitblasLinear.caps.requires_modules) == set(AWQBitBlasKernel.caps.requires_modules) == {"triton"}
    from qlinear.caps import Problem
    from qlinear.target import Target

    gptq_scheme = scheme(4, fmt="gptq_v2")
    cuda = Target.fake_cuda((9, 0), modules={"triton": True})
    # the declared plain GPTQ layouts are held as stored (GPTQModel repacks them into BitBLAS at load); AUTO keeps
    # TritonV2Linear for them
    assert not BitblasLinear.runtime_reasons(Problem(gptq_scheme, F16), cuda)
    assert any("runs awq checkpoints" in r for r in AWQBitBlasKernel.runtime_reasons(Problem(s, F16), cuda))
    assert any("holds bitblas, gemm tensors, not gemv ones" in r
               for r in AWQBitBlasKernel.runtime_reasons(Problem(replace(gptq_scheme, method="awq", format="gemv"),
                                                                 F16), cuda))
    assert not BitblasLinear.runtime_reasons(Problem(s, F16), cuda)
    from qlinear.select import explain

    assert explain(Problem(gptq_scheme, F16), cuda).kernel.__name__ == "TritonV2Linear"

    awq_scheme = scheme(4, k=128, n=48, method="awq")
    assert explain(Problem(s, F16), cuda).kernel is BitblasLinear
    assert explain(Problem(awq_scheme, F16), cuda).kernel is AWQBitBlasKernel


def test_convert_checkpoint_to_bitblas_and_back(tmp_path: Path) -> None:
    from qlinear.checkpoint.save import convert_checkpoint

    (tmp_path / "bb").mkdir()
    write_gptqmodel_dir(tmp_path / "bb", sym=False)
    convert_checkpoint(tmp_path / "bb", tmp_path / "g", "gptq_v2")
    convert_checkpoint(tmp_path / "g", tmp_path / "bb2", "bitblas")
    a, b = load_file(str(tmp_path / "bb" / "model.safetensors")), load_file(str(tmp_path / "bb2" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    cfg = json.loads((tmp_path / "bb2" / "quantize_config.json").read_text())
    assert cfg["checkpoint_format"] == "bitblas" and cfg["quant_method"] == "gptq"


# ---------------------------------------------------------------- errors
def test_errors(tmp_path: Path) -> None:
    from qlinear.checkpoint.plan import plan_checkpoint
    from qlinear.checkpoint.safetensors_io import CheckpointError

    s = scheme(4)
    t = bb.to_checkpoint(weight(s), s)
    with pytest.raises(ValueError, match=r"qweight: expected shape \[32, 64\] dtype torch.int8"):
        bb.from_checkpoint({**t, "qweight": t["qweight"].view(torch.int32)}, s)
    with pytest.raises(ValueError, match="scales: every scale must be finite"):
        bb.from_checkpoint({**t, "scales": torch.full_like(t["scales"], float("nan"))}, s)
    with pytest.raises(ValueError, match="qzeros: missing"):
        bb.from_checkpoint({k: v for k, v in t.items() if k != "qzeros"}, s)
    sym = scheme(4, sym=True)
    with pytest.raises(ValueError, match="zeros: a symmetric BitBLAS layer has zero 8"):
        bb.to_checkpoint(weight(s), sym)
    with pytest.raises(ValueError, match="bits 3"):
        bb.to_checkpoint(weight(scheme(3, fmt="gptq_v2")), scheme(3))
    with pytest.raises(ValueError, match="BitBLAS checkpoints are 4-bit"):
        bb.to_checkpoint(weight(scheme(2)), scheme(2, method="awq"))
    with pytest.raises(ConversionError, match="desc_act"):
        src = Scheme(bits=4, group_size=32, in_features=128, out_features=32, desc_act=True, format="gptq_v2")
        q = weight(scheme(4))
        q = AffineWeight(q.codes, q.scales, q.zeros, q.g_idx.flip(0), 4, 32, False)
        convert_tensors(gptq.to_checkpoint(q, src.format, src.pack_dtype), src, "bitblas")
    write_gptqmodel_dir(tmp_path, sym=False)
    good = load_file(str(tmp_path / "model.safetensors"))
    save_file({**good, "model.layers.0.mlp.up_proj.qzeros": torch.zeros(4, 3, dtype=torch.int8)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"up_proj.qzeros: .*bitblas 4-bit"):
        plan_checkpoint(tmp_path)


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_bitblas_class_holds_a_plain_gptq_module_as_stored(fmt: str) -> None:
    """The reference's BitblasLinear takes GPTQ modules too: their tensors are kept as GPTQ writes them, and the
    canonical weight read back is the one given (the same codec as any GPTQ layer; checked against float64)."""
    from qlinear.affine import quantize_rtn
    from qlinear.kernels.bitblas import BitblasLinear
    from qlinear.layouts import gptq as gptq_layout

    q = quantize_rtn(torch.randn(48, 128, generator=torch.Generator().manual_seed(3)) * 0.02, bits=4, group_size=32,
                     sym=False)
    layer = BitblasLinear(scheme(4, k=128, n=48, fmt=fmt, sym=False), bias=False, dtype=F16)
    layer.load_affine(q)
    assert set(layer.state_dict()) == set(gptq_layout.checkpoint_shapes(layer.scheme))
    back = layer.affine()
    assert torch.equal(back.codes, q.codes) and torch.equal(back.zeros, q.zeros)
    from tests.oracle.gptq_numpy import dequantize_checkpoint

    sd = {k: v.numpy() for k, v in layer.state_dict().items()}
    w64 = torch.from_numpy(dequantize_checkpoint(sd, 4, 128, 48, fmt))
    assert torch.allclose(layer.dequantize(torch.float64), w64, rtol=0, atol=1e-12)
