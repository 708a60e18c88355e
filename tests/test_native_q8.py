"""The native extra's GGUF Q8_0 kernel (``qlinear_native._q8`` through ``kernels/native_q8``) against float64.

Blocks come from gguf-py's own quantizer (``gguf.quants.quantize``) or are random bytes with finite scales;
the oracle is gguf-py's ``dequantize`` in float64 times the activations, independent of the C code. The
kernel's products are exact in float32 and summed in float32: 1e-5 of max |y| (float32 activations).
Skipped where the extra is not installed or the CPU lacks AVX-512F / F16C.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels import native_q8
from qlinear.kernels.gguf_torch import GGUFTorchLinear
from qlinear.layouts import gguf as G
from qlinear.target import Target

Q8 = gguf.GGMLQuantizationType.Q8_0
mod = native_q8.native_q8()
if mod is None:
    pytest.skip("needs the native extra (pip install ./native) on an AVX-512F CPU", allow_module_level=True)


def blocks(n: int, k: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """Q8_0 bytes [N, ceil(K/32)*34] (random codes, finite float16 scales) and the float64 weight [N, K]."""
    rng = np.random.default_rng(seed)
    nblk = -(-k // 32)
    raw = rng.integers(0, 256, (n, nblk, 34), dtype=np.uint8)
    raw[:, :, :2] = np.frombuffer(rng.uniform(-0.02, 0.02, (n, nblk)).astype(np.float16).tobytes(),
                                  dtype=np.uint8).reshape(n, nblk, 2)
    raw = raw.reshape(n, nblk * 34)
    return torch.from_numpy(raw.copy()), gguf.quants.dequantize(raw, Q8).astype(np.float64)[:, :k]


def close(y: torch.Tensor, ref: np.ndarray) -> None:
    err = np.abs(y.double().numpy() - ref).max() / np.abs(ref).max()
    assert err < 1e-5, f"max error {err:.2e} of max |y|"


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 16])
@pytest.mark.parametrize(("k", "n"), [(256, 37), (96, 64), (4096, 33)])
def test_q8_0_matches_float64(m: int, k: int, n: int) -> None:
    """Odd N (the 1-row tail after row pairs), 3 blocks, a long row; M across the 4-row tiles and their tail."""
    w, w64 = blocks(n, k, seed=k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    close(native_q8.matmul(x, w, k), x.double().numpy() @ w64.T)


def test_q8_0_real_quantizer_partial_block_and_dtypes() -> None:
    """gguf-py's quantizer; K = 100 (the last block padded with zero activations); bfloat16 and float16 inputs
    are multiplied exactly as given (their float32 values)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((24, 100)).astype(np.float32)
    raw = gguf.quants.quantize(np.pad(w, ((0, 0), (0, 28))), Q8)
    w64 = gguf.quants.dequantize(raw, Q8).astype(np.float64)[:, :100]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(3, 100).to(dtype)
        close(native_q8.matmul(x, torch.from_numpy(raw), 100), x.double().numpy() @ w64.T)


def test_q8_0_threads_are_bit_identical() -> None:
    w, _ = blocks(130, 512, seed=1)
    x = torch.randn(5, 512)
    before = torch.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(native_q8.matmul(x, w, 512))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_q8_0_bad_arguments_name_what_was_expected() -> None:
    w, _ = blocks(8, 64, seed=2)
    with pytest.raises(ValueError, match=r"expected x \[M, 64\] and uint8 blocks \[N, 68\]; got x \(2, 63\)"):
        native_q8.matmul(torch.randn(2, 63), w, 64)
    with pytest.raises(ValueError, match="uint8 blocks"):
        native_q8.matmul(torch.randn(2, 64), w.view(torch.int8), 64)
    out = torch.empty(1, 8)
    with pytest.raises(ValueError, match="K % 32 == 0.*got M=1 K=48"):
        mod.q8_0_mm(torch.randn(1, 48).data_ptr(), w.data_ptr(), out.data_ptr(), 1, 48, 8, 48, 8, 1)


def test_layer_routes_small_m_to_the_kernel_and_larger_m_to_the_exact_decode(monkeypatch) -> None:
    """GGUFTorchLinear (float32) multiplies the stored blocks up to MAX_M rows, decodes above; both exact."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((40, 96)).astype(np.float32)
    raw = gguf.quants.quantize(w, Q8)
    lay = GGUFTorchLinear(G.scheme_for(G.GGMLType.Q8_0, 96, 40), bias=True, dtype=torch.float32)
    lay.load_blocks(raw, torch.from_numpy(rng.standard_normal(40).astype(np.float32)))
    lay.prepare()
    w64 = gguf.quants.dequantize(raw, Q8).astype(np.float64)
    calls = []
    real = native_q8.matmul
    monkeypatch.setattr(native_q8, "matmul", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for m in (1, native_q8.MAX_M, native_q8.MAX_M + 1):
        x = torch.randn(m, 96)
        close(lay(x), x.double().numpy() @ w64.T + lay.bias.double().numpy())
    assert calls == [1, native_q8.MAX_M]
    lay16 = GGUFTorchLinear(G.scheme_for(G.GGMLType.Q8_0, 96, 40), bias=True, dtype=torch.bfloat16)
    lay16.load_blocks(raw, lay.bias)
    lay16.prepare()
    calls.clear()
    for m in (1, native_q8.BF16_MAX_M, native_q8.BF16_MAX_M + 1):  # bfloat16: the planes route above BF16_MAX_M
        x = torch.randn(m, 96).to(torch.bfloat16)
        ref = x.double().numpy() @ w64.T + lay.bias.double().numpy()
        err = np.abs(lay16(x).double().numpy() - ref).max() / np.abs(ref).max()
        assert err < 1e-2
    assert calls == [1, native_q8.BF16_MAX_M]
    runs = GGUFTorchLinear.describe_runs(Problem(lay.scheme, torch.float32), Target.here("cpu"))
    assert f"native q8_0_mm, exact float32 products) at M=1..{native_q8.MAX_M}, then blocks decoded" in runs
    bf16 = GGUFTorchLinear.describe_runs(Problem(lay.scheme, torch.bfloat16), Target.here("cpu"))
    assert f"at M=1..{native_q8.BF16_MAX_M}, then Q8_0 as int4pack planes" in bf16


def test_without_the_extra_the_exact_decode_runs_and_explain_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setattr(native_q8, "_MODULE", False)
    rng = np.random.default_rng(8)
    raw = gguf.quants.quantize(rng.standard_normal((16, 64)).astype(np.float32), Q8)
    lay = GGUFTorchLinear(G.scheme_for(G.GGMLType.Q8_0, 64, 16), dtype=torch.float32)
    lay.load_blocks(raw)
    lay.prepare()
    x = torch.randn(2, 64)
    close(lay(x), x.double().numpy() @ gguf.quants.dequantize(raw, Q8).astype(np.float64).T)
    runs = GGUFTorchLinear.describe_runs(Problem(lay.scheme, torch.float32), Target.here("cpu"))
    assert "(the native extra, pip install ./native on an AVX-512 CPU, would multiply the stored blocks" in runs
    with pytest.raises(RuntimeError, match="pip install ./native"):
        native_q8.matmul(x, lay.qweight, 64)
