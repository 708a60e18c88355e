"""GGUF blocks through torch's CPU int4pack op (GGUFTorchLinear's bfloat16 small-M route, kernels/gguf_int4pack).

Oracles: ``gguf.quants.dequantize`` (the gguf package's numpy decoder) for the 32-value affine form, and a
float64 matmul on that decode for the layer. Tolerances: bfloat16 activations and per-32 scales rounded to
bfloat16 leave about 2**-8 relative error; 1e-2 of max |y| as elsewhere for bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear.kernels import gguf_int4pack, native_int4
from qlinear.kernels.gguf_torch import GGUFTorchLinear
from qlinear.layouts import gguf
from qlinear.layouts.gguf.affine16 import AFFINE16_BITS, affine16
from qlinear.layouts.gguf.affine32 import AFFINE32_BITS, affine32

gq = pytest.importorskip("gguf.quants", reason="needs the gguf package: pip install 'qlinear[gguf]'")
from gguf import GGMLQuantizationType  # noqa: E402

TYPES = sorted(AFFINE32_BITS)
TYPES16 = sorted(AFFINE16_BITS)  # 16-value sub-blocks: planes with groups of 16, on the native extra only


def encoded(qtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    """Blocks from qlinear's ggml-exact encoders; IQ4_* (no encoder: ggml's search) are random bytes with a
    small float16 ``d`` (random sub-block scales and indices)."""
    if qtype.startswith("IQ4"):
        info = gguf.type_info(qtype)
        nb = -(-k // info.block_size)
        raw = torch.randint(0, 256, (n * nb, info.type_size), dtype=torch.uint8,
                            generator=torch.Generator().manual_seed(seed))
        raw[:, 0:2] = torch.from_numpy(np.full(n * nb, 2e-3, np.float16).view(np.uint8).reshape(-1, 2))
        return raw.reshape(n, nb * info.type_size)
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    return torch.from_numpy(gguf.quantize(w, qtype))


def k_for(qtype: str) -> int:
    """K for a test layer: whole 256-value super-blocks for K-quants and IQ4_XS, else a partial-free 160."""
    return 512 if qtype.endswith("_K") or qtype == "IQ4_XS" else 160


def oracle(raw: torch.Tensor, qtype: str) -> np.ndarray:
    return gq.dequantize(raw.numpy(), getattr(GGMLQuantizationType, qtype)).astype(np.float64)


@pytest.mark.parametrize("qtype", TYPES)
def test_affine32_is_exactly_the_gguf_decode(qtype: str) -> None:
    k = k_for(qtype)
    raw = encoded(qtype, 24, k, 0)
    codes, scale, offset = affine32(raw, qtype, k)
    assert codes.dtype == torch.uint8 and int(codes.max()) < 2 ** AFFINE32_BITS[qtype]
    w = codes.double().view(24, -1, 32) * scale.double()[..., None] + offset.double()[..., None]
    np.testing.assert_array_equal(w.view(24, k).numpy(), oracle(raw, qtype))


@pytest.mark.parametrize("qtype", TYPES16)
def test_affine16_is_exactly_the_gguf_decode(qtype: str) -> None:
    raw = encoded(qtype, 24, 512, 1)
    codes, scale, offset = affine16(raw, qtype, 512)
    assert codes.dtype == torch.uint8 and int(codes.max()) < 2 ** AFFINE16_BITS[qtype] and scale.shape == (24, 32)
    w = codes.double().view(24, -1, 16) * scale.double()[..., None] + offset.double()[..., None]
    np.testing.assert_array_equal(w.view(24, 512).numpy(), oracle(raw, qtype))
    with pytest.raises(ValueError, match="Q4_K: no 16-value affine form"):
        affine16(raw, "Q4_K", 512)
    with pytest.raises(ValueError, match=rf"qweight \({qtype}\): expected uint8 \[24, \d+\], got uint8 \[24, 7\]"):
        affine16(raw[:, :7].contiguous(), qtype, 512)


@pytest.mark.parametrize("qtype", TYPES16)
def test_bf16_group16_types_run_on_the_native_extra(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Q2_K / Q3_K / Q6_K with bfloat16 activations: int4pack planes with per-16 scales on the native kernels
    (GEMV at M=1, AMX above) against the float64 decode; without the extra, the exact decode as before."""
    k, n = 512, 80
    raw = encoded(qtype, n, k, 9)
    lay = GGUFTorchLinear(gguf.scheme_for(qtype, k, n), dtype=torch.bfloat16)
    lay.load_blocks(raw)
    w64 = oracle(raw, qtype)
    native = native_int4.native_int4() is not None
    for m in (1, 5, 70):
        x = torch.randn(m, k).to(torch.bfloat16)
        assert lay.uses_int4pack(x) == (native and lay.int4pack_runtime().native_kernel(m) is not None)
        ref = x.double().numpy() @ w64.T
        err = np.abs(lay(x).double().numpy() - ref).max() / np.abs(ref).max()
        assert err < 1e-2, f"{qtype} M={m}: relative error {err:.2e}"
    if native:
        rt = lay.int4pack_runtime()
        assert rt.group == 16 and not rt.op and rt.planes == (2 if qtype == "Q6_K" else 1)
    monkeypatch.setattr(native_int4, "_MODULE", False)
    x = torch.randn(3, k).to(torch.bfloat16)
    assert not lay.uses_int4pack(x)  # torch's op takes no group of 16: the exact decode
    ref = x.double().numpy() @ w64.T
    assert np.abs(lay(x).double().numpy() - ref).max() / np.abs(ref).max() < 1e-2


def test_affine32_refuses_what_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="Q6_K: no 32-value affine form"):
        affine32(torch.zeros(2, 210, dtype=torch.uint8), "Q6_K", 256)
    with pytest.raises(ValueError, match=r"qweight \(Q4_0\): expected uint8 \[2, 36\], got uint8 \[2, 18\]"):
        affine32(torch.zeros(2, 18, dtype=torch.uint8), "Q4_0", 64)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n", [80, 128])  # 80: output channels padded to the op's 64-channel block
def test_bf16_small_m_runs_the_op_and_matches_float64(qtype: str, n: int) -> None:
    k = k_for(qtype)
    raw = encoded(qtype, n, k, n)
    lay = GGUFTorchLinear(gguf.scheme_for(qtype, k, n), bias=True, dtype=torch.bfloat16)
    bias = torch.randn(n) * 0.1
    lay.load_blocks(raw, bias)
    w64 = oracle(raw, qtype)
    planes = 1 if AFFINE32_BITS[qtype] == 4 else 2
    for m in (1, 3, gguf_int4pack.MAX_M[planes]):
        x = torch.randn(2, m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        native = lay.int4pack_runtime().native_kernel(2 * m) is not None  # the extra takes any M it runs
        assert lay.uses_int4pack(x.reshape(-1, k)) == (native or 2 * m <= gguf_int4pack.MAX_M[planes])
        y = lay(x)
        assert y.dtype == torch.bfloat16 and y.shape == (2, m, n)
        ref = x.double().numpy() @ w64.T + bias.double().numpy()
        err = np.abs(y.double().numpy() - ref).max() / np.abs(ref).max()
        assert err < 1e-2, f"{qtype} M={2 * m}: relative error {err:.2e}"
    assert lay._int4pack is not None and lay._int4pack.planes == planes
    assert (lay._int4pack.native_kernel(1) is not None) == (native_int4.native_int4() is not None)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_native_kernels_and_the_op_agree(qtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumers of the same planes (the native extra's kernels, torch's op) against the float64 decode."""
    if native_int4.native_int4() is None:
        pytest.skip("the native extra is not available here")
    k, n = 512, 192
    raw = encoded(qtype, n, k, 5)
    lay = GGUFTorchLinear(gguf.scheme_for(qtype, k, n), dtype=torch.bfloat16)
    lay.load_blocks(raw)
    w64 = oracle(raw, qtype)
    for m in (1, 3, 40, 90):  # mv, AMX codes, codes (one plane) / weights (two), weights (on a CPU with both)
        x = torch.randn(m, k).to(torch.bfloat16)
        ref = x.double().numpy() @ w64.T
        amx = lay(x).double().numpy()
        with monkeypatch.context() as mp:
            mp.setattr(native_int4, "_MODULE", False)
            op = gguf_int4pack.matmul(lay.int4pack_runtime(), x, n).double().numpy()
        for y in (amx, op):
            assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-2, m


def test_float32_and_float16_keep_the_exact_decode() -> None:
    raw = encoded("Q4_K", 64, 256, 1)
    w64 = oracle(raw, "Q4_K")
    for dtype, tol in ((torch.float32, 1e-6), (torch.float16, 2e-3)):
        lay = GGUFTorchLinear(gguf.scheme_for("Q4_K", 256, 64), dtype=dtype)
        lay.load_blocks(raw)
        x = torch.randn(1, 256).to(dtype)
        y = lay(x)
        assert lay._int4pack is None
        ref = x.double().numpy() @ w64.T
        assert np.abs(y.double().numpy() - ref).max() / np.abs(ref).max() < tol


def test_gradients_take_the_decode_path() -> None:
    lay = GGUFTorchLinear(gguf.scheme_for("Q8_0", 64, 64), dtype=torch.bfloat16)
    lay.load_blocks(encoded("Q8_0", 64, 64, 2))
    x = torch.randn(1, 64, dtype=torch.bfloat16, requires_grad=True)
    assert not lay.uses_int4pack(x)
    lay(x).sum().backward()
    assert x.grad is not None and lay._int4pack is None


def test_new_blocks_rebuild_the_runtime() -> None:
    lay = GGUFTorchLinear(gguf.scheme_for("Q4_0", 64, 64), dtype=torch.bfloat16)
    lay.load_blocks(encoded("Q4_0", 64, 64, 3))
    x = torch.randn(1, 64, dtype=torch.bfloat16)
    lay(x)
    raw = encoded("Q4_0", 64, 64, 4)
    lay.load_blocks(raw)
    ref = x.double().numpy() @ oracle(raw, "Q4_0").T
    y = lay(x).double().numpy()
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-2
