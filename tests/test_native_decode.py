"""The optional native decode (``pip install ./native``) against torch's own int4pack decode, bit for bit.

Two independent implementations of one decode: qlinear's torch-ops path in ``cpu_int4.decode_matmul`` and
the C extension. Both feed the same bf16 GEMM, so the layers' outputs must be identical; the float64
oracle tests of the CPU kernels (test_cpu_kernels.py) cover the values themselves.
"""

from __future__ import annotations

import pytest
import torch

from qlinear import create_layer, quantize_rtn
from qlinear.kernels import cpu_int4

native = pytest.importorskip("qlinear_native", reason="optional extra: pip install ./native (needs a C compiler)")


def reference_tile(packed: torch.Tensor, scales: torch.Tensor, group: int, col0: int) -> torch.Tensor:
    """One block ``[K, half]`` of int4pack bytes decoded with plain torch: (q - 8) * s, rounded to bf16 once."""
    lo, hi = (packed & 15).int() - 8, (packed >> 4).int() - 8
    q = torch.cat([lo, hi], 1).float()
    s = scales[:, col0:col0 + q.shape[1]].float().repeat_interleave(group, 0)[: q.shape[0]]
    return (q * s).to(torch.bfloat16)


@pytest.mark.parametrize("half", [32, 16, 8])  # 32: the AVX-512 path; others: the portable loop
def test_decode_matches_plain_torch(half: int) -> None:
    g = torch.Generator().manual_seed(half)
    k, blocks, group = 96, 3, 32
    n_pad = blocks * 2 * half + 2 * half  # one block of scales more than decoded: col0 is honoured
    packed = torch.randint(0, 256, (blocks, k, half), dtype=torch.uint8, generator=g)
    scales = (torch.randn(k // group, n_pad, generator=g) * 0.01).to(torch.bfloat16)
    ld = blocks * 2 * half + 5  # a row stride wider than the decoded columns
    out = torch.full((k, ld), -1.0, dtype=torch.bfloat16)
    col0 = 2 * half
    native.decode_int4_bf16(packed.data_ptr(), scales.data_ptr(), out.data_ptr(), k, group, n_pad, col0, blocks,
                            half, ld)
    for b in range(blocks):
        want = reference_tile(packed[b], scales, group, col0 + b * 2 * half)
        assert torch.equal(out[:, b * 2 * half:(b + 1) * 2 * half], want), b
    assert bool((out[:, blocks * 2 * half:] == -1).all())  # nothing written past the tile


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="inconsistent sizes"):
        native.decode_int4_bf16(0, 0, 0, 8, 32, 64, 0, 1, 32, 16)


def test_layer_output_is_identical_with_and_without_the_native_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(192, 384, generator=torch.Generator().manual_seed(1)) * 0.02
    layer = create_layer(quantize_rtn(w, bits=4, group_size=64, sym=False), format="gptq_v2",
                               backend="gptq_torch_cpu_avx512", dtype=torch.bfloat16)
    x = torch.randn(70, 384, dtype=torch.bfloat16)
    monkeypatch.setattr(layer, "path", lambda m, grad: cpu_int4.Path.DECODE)  # not AMX, where installed
    monkeypatch.setattr(cpu_int4, "_NATIVE", None)
    assert cpu_int4.native_decoder() is not None
    with_native = layer(x)
    monkeypatch.setattr(cpu_int4, "_NATIVE", False)
    assert cpu_int4.native_decoder() is None
    assert torch.equal(layer(x), with_native)
