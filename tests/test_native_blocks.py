"""The native extra's GGUF block kernel (``qlinear_native._blocks`` through ``kernels/native_blocks``) vs float64.

Blocks come from gguf-py's own quantizer (``gguf.quants.quantize``) or are random bytes with finite scales;
the oracle is gguf-py's ``dequantize`` in float64 times the activations, independent of the C code. The
kernel's products are exact in float32 and summed in float32: 1e-5 of max |y|. Skipped where the extra is not
installed or the CPU lacks AVX-512F / F16C.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels import native_blocks
from qlinear.kernels.gguf_torch import GGUFTorchLinear
from qlinear.layouts import gguf as G
from qlinear.target import Target

mod = native_blocks.native_blocks()
if mod is None:
    pytest.skip("needs the native extra (pip install ./native) on an AVX-512F CPU", allow_module_level=True)
TYPES = sorted(native_blocks.TYPES)


def qt(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name]


def blocks(name: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """Random bytes [N, ceil(K/values)*bytes] of type ``name`` with finite float16 scales (and minimums), and
    the float64 weight [N, K]."""
    rng = np.random.default_rng(seed)
    values, size = native_blocks.TYPES[name]
    nblk = -(-k // values)
    raw = rng.integers(0, 256, (n, nblk, size), dtype=np.uint8)
    for at in {"Q4_1": (0, 2), "Q4_K": (0, 2), "Q6_K": (208,)}.get(name, (0,)):  # float16 scales: finite
        scales = rng.uniform(-0.02, 0.02, (n, nblk)).astype(np.float16)
        raw[:, :, at:at + 2] = np.frombuffer(scales.tobytes(), dtype=np.uint8).reshape(n, nblk, 2)
    raw = raw.reshape(n, nblk * size)
    return torch.from_numpy(raw.copy()), gguf.quants.dequantize(raw, qt(name)).astype(np.float64)[:, :k]


def close(y: torch.Tensor, ref: np.ndarray) -> None:
    err = np.abs(y.double().numpy() - ref).max() / np.abs(ref).max()
    assert err < 1e-5, f"max error {err:.2e} of max |y|"


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 16])
@pytest.mark.parametrize(("k", "n"), [(256, 37), (96, 64), (4096, 33), (2304, 8)])
def test_blocks_match_float64(name: str, m: int, k: int, n: int) -> None:
    """Odd N (the 1-row tail after row pairs), 3 blocks (Q4_K: one super-block, padded), a long row, 72 blocks
    (a chunk of 64 scales plus 8); M across the 4-row tiles and their tail."""
    w, w64 = blocks(name, n, k, seed=k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    close(native_blocks.matmul(x, w, name, k), x.double().numpy() @ w64.T)


@pytest.mark.parametrize("name", TYPES)
def test_real_quantizer_partial_block_and_dtypes(name: str) -> None:
    """gguf-py's quantizer (K-quants: qlinear's, tested byte-identical to ggml's elsewhere; gguf-py has none);
    K = 100 (the last block padded with zero activations); bfloat16 and float16 inputs are multiplied exactly as
    given (their float32 values)."""
    rng = np.random.default_rng(3)
    values = native_blocks.TYPES[name][0]
    w = np.pad(rng.standard_normal((24, 100)).astype(np.float32), ((0, 0), (0, -100 % values)))
    raw = G.quantize(w, name) if name.endswith("_K") else gguf.quants.quantize(w, qt(name))
    w64 = gguf.quants.dequantize(raw, qt(name)).astype(np.float64)[:, :100]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(3, 100).to(dtype)
        close(native_blocks.matmul(x, torch.from_numpy(raw), name, 100), x.double().numpy() @ w64.T)


@pytest.mark.parametrize("name", TYPES)
def test_threads_are_bit_identical(name: str) -> None:
    w, _ = blocks(name, 130, 512, seed=1)
    x = torch.randn(5, 512)
    before = torch.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(native_blocks.matmul(x, w, name, 512))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_bad_arguments_name_what_was_expected() -> None:
    w, _ = blocks("Q8_0", 8, 64, seed=2)
    with pytest.raises(ValueError, match=r"expected x \[M, 64\] and uint8 Q8_0 blocks \[N, 68\]; got x \(2, 63\)"):
        native_blocks.matmul(torch.randn(2, 63), w, "Q8_0", 64)
    with pytest.raises(ValueError, match=r"uint8 Q4_0 blocks \[N, 36\]; got .* \(8, 68\)"):
        native_blocks.matmul(torch.randn(2, 64), w, "Q4_0", 64)
    with pytest.raises(ValueError, match="expected a block type Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, got Q5_0"):
        native_blocks.matmul(torch.randn(2, 64), w, "Q5_0", 64)
    out = torch.empty(1, 8)
    with pytest.raises(ValueError, match="K % 32 == 0.*got M=1 K=48"):
        mod.mm("Q8_0", torch.randn(1, 48).data_ptr(), 0, w.data_ptr(), out.data_ptr(), 1, 48, 8, 48, 8, 1)
    with pytest.raises(ValueError, match="block sums of x for Q4_0/Q4_1/Q4_K"):
        mod.mm("Q4_1", torch.randn(1, 64).data_ptr(), 0, w.data_ptr(), out.data_ptr(), 1, 64, 8, 64, 8, 1)
    with pytest.raises(ValueError, match="expected a block type Q8_0, Q4_0, Q4_1, Q4_K or Q6_K, got IQ4_NL"):
        mod.mm("IQ4_NL", 0, 0, 0, 0, 1, 64, 8, 64, 8, 1)


def layer_of(name: str, raw: np.ndarray, n: int, k: int, dtype: torch.dtype, bias: torch.Tensor) -> GGUFTorchLinear:
    lay = GGUFTorchLinear(G.scheme_for(G.GGMLType[name], k, n), bias=True, dtype=dtype)
    lay.load_blocks(raw, bias)
    lay.prepare()
    return lay


@pytest.mark.parametrize("name", TYPES)
def test_layer_routes_small_m_to_the_kernel(name: str, monkeypatch) -> None:
    """GGUFTorchLinear multiplies the stored blocks up to max_m rows (float32: MAX_M; bfloat16: BF16_MAX_M for
    Q8_0, none for the 4-bit types, whose one int4pack plane is faster) and takes its other paths above."""
    rng = np.random.default_rng(7)
    k = 256 if name.endswith("_K") else 96
    w = rng.standard_normal((40, k)).astype(np.float32)
    raw = G.quantize(w, name) if name.endswith("_K") else gguf.quants.quantize(w, qt(name))
    w64 = gguf.quants.dequantize(raw, qt(name)).astype(np.float64)
    bias = torch.from_numpy(rng.standard_normal(40).astype(np.float32))
    calls: list[int] = []
    real = native_blocks.matmul
    monkeypatch.setattr(native_blocks, "matmul", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        lay = layer_of(name, raw, 40, k, dtype, bias)
        top = native_blocks.max_m(name, dtype)
        calls.clear()
        for m in sorted({1, top, top + 1} - {0}):
            x = torch.randn(m, k).to(dtype)
            ref = x.double().numpy() @ w64.T + bias.double().numpy()
            assert np.abs(lay(x).double().numpy() - ref).max() / np.abs(ref).max() < tol
        assert calls == [m for m in sorted({1, top}) if 0 < m <= top]
        runs = GGUFTorchLinear.describe_runs(Problem(lay.scheme, dtype), Target.here("cpu"))
        assert (f"(native blocks kernel, exact float32 products) at M=1..{top}" in runs) is (top > 0)
    assert native_blocks.max_m("Q8_0", torch.bfloat16) == native_blocks.BF16_MAX_M
    assert native_blocks.max_m("Q5_K", torch.float32) == 0


def test_without_the_extra_the_exact_decode_runs_and_explain_says_how_to_get_it(monkeypatch) -> None:
    monkeypatch.setattr(native_blocks, "_MODULE", False)
    rng = np.random.default_rng(8)
    raw = gguf.quants.quantize(rng.standard_normal((16, 64)).astype(np.float32), qt("Q4_1"))
    lay = layer_of("Q4_1", raw, 16, 64, torch.float32, torch.zeros(16))
    x = torch.randn(2, 64)
    close(lay(x), x.double().numpy() @ gguf.quants.dequantize(raw, qt("Q4_1")).astype(np.float64).T)
    runs = GGUFTorchLinear.describe_runs(Problem(lay.scheme, torch.float32), Target.here("cpu"))
    assert "(the native extra, pip install ./native on an AVX-512 CPU, would multiply the stored blocks" in runs
    with pytest.raises(RuntimeError, match="pip install ./native"):
        native_blocks.matmul(x, lay.qweight, "Q4_1", 64)
