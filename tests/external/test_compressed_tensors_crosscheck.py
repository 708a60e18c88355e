"""qlinear's compressed-tensors layouts against the compressed-tensors package itself (requirements/
nodeps-compressed-tensors.txt): its packers produce our bytes, and its compressors' decompress of the tensors
qlinear writes gives qlinear's dequantization, for every format and strategy on random weights."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from qlinear import AffineWeight, quantize_rtn
from qlinear.build import float_scheme_of
from qlinear.float_quant import quantize_fp8, quantize_mxfp4, quantize_nvfp4
from qlinear.layouts import ct_int, float_layouts
from qlinear.spec import Scheme

pytestmark = pytest.mark.external
INSTALL = "pip install --no-deps -r requirements/nodeps-compressed-tensors.txt"


@pytest.fixture(scope="module")
def ct():
    """compressed-tensors, imported when a test runs: it imports triton and defines Triton kernels, and doing that
    at collection would fix Triton's own library functions in compiled mode before the interpreter tests set
    TRITON_INTERPRET (every interpreted kernel then fails)."""
    pytest.importorskip("compressed_tensors", reason=INSTALL)
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    return SimpleNamespace(BaseCompressor=BaseCompressor, pack_fp4_to_uint8=pack_fp4_to_uint8,
                           unpack_fp4_from_uint8=unpack_fp4_from_uint8, pack_to_int32=pack_to_int32,
                           unpack_from_int32=unpack_from_int32, QuantizationArgs=QuantizationArgs,
                           QuantizationScheme=QuantizationScheme)


N, K = 48, 256


@pytest.mark.parametrize("bits", range(1, 9))
def test_packers_agree(ct, bits: int) -> None:
    g = torch.Generator().manual_seed(bits)
    q = torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), (N, 70), generator=g).to(torch.int8)
    ours = ct_int.pack((q.to(torch.int16) + (1 << (bits - 1))).to(torch.uint8), bits, dim=1)
    assert torch.equal(ours, ct.pack_to_int32(q, bits))
    assert torch.equal(ours.t().contiguous(), ct.pack_to_int32(q.t().contiguous(), bits, packed_dim=0))
    back = ct.unpack_from_int32(ours, bits, torch.Size((N, 70)))
    assert torch.equal(back, q)


def test_fp4_nibbles_agree(ct) -> None:
    fw = quantize_nvfp4(torch.randn(N, K) * 0.1)
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])[fw.codes.long()]
    packed = float_layouts.to_checkpoint(fw, float_scheme_of(fw))["weight_packed"]
    assert torch.equal(packed, ct.pack_fp4_to_uint8(values))
    assert torch.equal(ct.unpack_fp4_from_uint8(packed, N, K, torch.float32), values)


def _decompress(ct, fmt: str, tensors: dict[str, torch.Tensor], weights: dict) -> torch.Tensor:
    scheme = ct.QuantizationScheme(targets=["Linear"], weights=ct.QuantizationArgs(**weights))
    return ct.BaseCompressor.get_value_from_registry(fmt).decompress(dict(tensors), scheme)["weight"]


INT_CASES = [  # bits, strategy args, sym, format
    (4, {"strategy": "group", "group_size": 32}, True, "pack-quantized"),
    (4, {"strategy": "group", "group_size": 64}, False, "pack-quantized"),
    (3, {"strategy": "group", "group_size": 32}, False, "pack-quantized"),
    (8, {"strategy": "channel"}, True, "pack-quantized"),
    (8, {"strategy": "channel"}, True, "int-quantized"),
    (4, {"strategy": "group", "group_size": 128}, True, "naive-quantized"),
]


@pytest.mark.parametrize(("bits", "strategy", "sym", "fmt"), INT_CASES)
def test_integer_formats_decompress_to_our_dequantization(ct, bits, strategy, sym, fmt) -> None:
    group = strategy.get("group_size", K)
    q = quantize_rtn(torch.randn(N, K, generator=torch.Generator().manual_seed(bits)) * 0.02, bits=bits,
                     group_size=group, sym=sym)
    q = AffineWeight(codes=q.codes, scales=q.scales.to(torch.bfloat16), zeros=q.zeros, g_idx=q.g_idx, bits=bits,
                     group_size=q.group_size, sym=sym)
    s = Scheme(bits=bits, group_size=group, in_features=K, out_features=N, sym=sym, method="compressed-tensors",
               format=fmt, scale_block=(1, group))
    tensors = ct_int.to_checkpoint(q, s)
    theirs = _decompress(ct, fmt, tensors, {"num_bits": bits, "type": "int", "symmetric": sym, **strategy})
    assert torch.equal(theirs, q.dequantize(torch.bfloat16))


FLOAT_CASES = [
    ("float-quantized", lambda w: quantize_fp8(w, scale_dtype=torch.bfloat16), {"strategy": "channel"}),
    ("float-quantized", lambda w: quantize_fp8(w, block=(N, K), scale_dtype=torch.bfloat16), {"strategy": "tensor"}),
    ("naive-quantized", lambda w: quantize_fp8(w, block=(32, 128), scale_dtype=torch.bfloat16),
     {"strategy": "block", "block_structure": [32, 128]}),
    ("nvfp4-pack-quantized", quantize_nvfp4, {"strategy": "tensor_group", "group_size": 16}),
    ("mxfp4-pack-quantized", quantize_mxfp4, {"strategy": "group", "group_size": 32, "scale_dtype": torch.uint8}),
]


@pytest.mark.parametrize(("fmt", "make", "strategy"), FLOAT_CASES)
def test_float_formats_decompress_to_our_dequantization(ct, fmt, make, strategy) -> None:
    fw = make(torch.randn(N, K, generator=torch.Generator().manual_seed(3)) * 0.05)
    tensors = float_layouts.to_checkpoint(fw, float_scheme_of(fw, fmt))
    bits = 4 if fmt.endswith("fp4-pack-quantized") else 8
    theirs = _decompress(ct, fmt, tensors, {"num_bits": bits, "type": "float", "symmetric": True, **strategy})
    assert torch.equal(theirs, fw.dequantize(theirs.dtype))
