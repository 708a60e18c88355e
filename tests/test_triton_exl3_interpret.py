"""The EXL3 Triton kernels (``kernels/triton/exl3_mv.py``) in Triton's CPU interpreter: the decode pass gives the
Torch layout's float16 inner weight bit for bit (every codebook, widths 1..8); the fused GEMM (split-K with
atomics and without, M past one 16-row block) equals ``xh @ inner`` up to float32 summation order (above
``FUSED_MAX_M``: the decoded weight times ``xh`` in float16, float16 output, within 1e-3), and so does the
GEMV (``exl3_gemv.py``, M = 1 and blocks of rows) at every width and codebook; the layer's
``ExllamaV3Linear.forward`` (input transform, product, output transform, all Triton) equals ``ExllamaV3TorchLinear``
up to the float16 rounding of the transformed input that the Triton path applies, as exllamav3 does.

TRITON_INTERPRET=1 is set at collection, before anything imports the kernel bodies.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from qlinear.kernels.exl3 import ExllamaV3Linear
from qlinear.layouts import exl3
from qlinear.layouts.exl3 import Exl3Params
from tests.test_exl3_kernels import layer_for

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"


@pytest.fixture(scope="module")
def mv():
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import exl3_mv

    if type(exl3_mv.exl3_mv_kernel).__name__ != "InterpretedFunction":
        pytest.skip("the kernel bodies were imported before TRITON_INTERPRET=1 was set")
    return exl3_mv


def trellis(k: int, n: int, bits: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), generator=g,
                         dtype=torch.int32).to(torch.int16)


@pytest.mark.parametrize(("bits", "cb"), [(1, "mul1"), (2, "3inst"), (3, "mcg"), (4, "3inst"), (5, "mul1"),
                                          (6, "mcg"), (7, "3inst"), (8, "mul1")])
def test_decode_is_bit_exact(mv, bits: int, cb: str) -> None:
    """The block decode in stream order (``_stream_block``)."""
    tr = trellis(128, 256, bits, seed=bits)
    ours = mv.decode_inner(tr, bits, cb)
    assert torch.equal(ours.view(torch.int16), exl3.inner_weight(tr, bits, exl3.codebook_table(cb)).view(torch.int16))


@pytest.mark.parametrize(("bits", "cb"), [(1, "3inst"), (2, "mcg"), (3, "mul1"), (4, "3inst"), (5, "mcg"),
                                          (6, "mul1"), (7, "mcg"), (8, "3inst")])
def test_gemv_matches_float64(mv, bits: int, cb: str) -> None:
    """The M = 1 path (``exl3_gemv.py``): two- and three-word windows, split K with atomics and not, fewer n tiles
    than one program's 32, with and without the next tile's prefetch, and an input row at an odd float16 offset
    (copied for the int32 view)."""
    from qlinear.kernels.triton import exl3_gemv

    tr = trellis(256, 384, bits, seed=10 + bits)
    ref_w = exl3.inner_weight(tr, bits, exl3.codebook_table(cb)).double()
    base = torch.randn(257, generator=torch.Generator().manual_seed(bits)).half()
    for xh, sms in ((base[:256].view(1, 256), 64), (base[1:].view(1, 256), 1)):
        assert exl3_gemv.two_words(bits) == (bits <= 4)
        y = exl3_gemv.gemv_product(xh, tr, bits, cb, sms=sms, tiles_n=32 if sms > 1 else 8, prefetch=sms > 1)
        ref = xh.double() @ ref_w
        assert y.dtype == torch.float32 and y.shape == (1, 384)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize(("bits", "cb", "m", "rows", "sms"), [(2, "3inst", 2, None, 64), (4, "mcg", 3, None, 1),
                                                             (5, "mul1", 8, None, 64), (6, "3inst", 11, 4, 64),
                                                             (3, "mcg", 16, None, 1)])
def test_gemv_rows_match_float64(mv, bits: int, cb: str, m: int, rows: int | None, sms: int) -> None:
    """Several rows through the GEMV: every row of a block multiplies the same decoded weights (rows past M masked
    off in the last block), with split K (atomics) and without, two- and three-word windows."""
    from qlinear.kernels.triton import exl3_gemv

    tr = trellis(256, 256, bits, seed=20 + m)
    xh = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).half()
    y = exl3_gemv.gemv_product(xh, tr, bits, cb, sms=sms, rows=rows)
    ref = xh.double() @ exl3.inner_weight(tr, bits, exl3.codebook_table(cb)).double()
    assert y.dtype == torch.float32 and y.shape == (m, 256)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize(("m", "sms"), [(1, 4), (5, 1), (20, 2), (40, 4), (70, 4)])
def test_product_matches(mv, m: int, sms: int) -> None:
    tr = trellis(256, 256, 3, seed=m)
    xh = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).half()
    y = mv.inner_product(xh, tr, 3, "mcg", sms=sms)
    ref = xh.double() @ exl3.inner_weight(tr, 3, exl3.codebook_table("mcg")).double()
    assert y.dtype == torch.float32 and y.shape == (m, 256)
    tol = 1e-5 if m <= mv.FUSED_MAX_M else 1e-3  # above: one float16 matmul (float16 output, as exllamav3's hgemm)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize(("bits", "cb", "block"), [(5, "mul1", (32, 32, 64)), (2, "3inst", (16, 64, 64)),
                                                   (8, "mcg", (64, 32, 128))])
def test_fused_blocks_match_float64(mv, bits: int, cb: str, block: tuple[int, int, int]) -> None:
    """The fused kernel at blocks other than the shipped one (the GPU sweep's) and three-word windows (5 and 8
    bits)."""
    tr = trellis(256, 256, bits, seed=bits)
    xh = torch.randn(20, 256, generator=torch.Generator().manual_seed(bits)).half()
    y = mv.fused_product(xh, tr, bits, cb, 2, block=block)
    ref = xh.double() @ exl3.inner_weight(tr, bits, exl3.codebook_table(cb)).double()
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize(("m", "dtype", "bias"), [(3, torch.float16, True), (1, torch.bfloat16, False),
                                                  (40, torch.float32, True)])
def test_layer_forward_matches_torch_kernel(mv, monkeypatch, m: int, dtype: torch.dtype, bias: bool) -> None:
    """``ExllamaV3Linear.forward`` itself, on CPU tensors (its CUDA-only input check lifted for the interpreter)."""
    torch_layer = layer_for(256, 384, Exl3Params(4, "3inst"), seed=9, bias=bias)
    layer = ExllamaV3Linear(torch_layer.scheme, bias=bias)
    layer.load_state_dict(torch_layer.state_dict(), strict=True)
    monkeypatch.setattr(layer, "check_input", lambda x, device_type=None: ExllamaV3Linear.check_input(layer, x))
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(1)).to(dtype)
    y = layer(x)
    assert y.dtype == dtype and layer._rt_table is None
    torch.testing.assert_close(y.float(), torch_layer(x).float(), rtol=3e-3, atol=3e-3)


@pytest.mark.parametrize("m", [1, 3, 16, 21])
def test_transforms_match_float64(mv, m: int) -> None:
    """The butterflies (``hadamard.py``) against ``x @ H`` in float64: the input within one float16 rounding plus
    float32 summation error (which matters only where the 128 terms cancel), the output to float32 rounding; every
    launch size (1 row, a partial block, a full one, one past it)."""
    from qlinear.kernels.triton import hadamard

    g = torch.Generator().manual_seed(3 + m)
    h64 = exl3.hadamard(dtype=torch.float64)
    x, su = torch.randn(m, 256, generator=g).bfloat16(), torch.randn(256, generator=g)
    want = exl3.had_last(x.double() * su.double(), h64)
    ours = hadamard.input_transform(x, su)
    assert ours.dtype == torch.float16
    ulp = want.abs().clamp_min(2 ** -14).log2().floor().exp2() * 2 ** -10
    assert bool(((ours.double() - want).abs() <= 0.5 * ulp + 1e-6 * want.abs().max()).all())
    y, sv, b = torch.randn(m, 384, generator=g), torch.randn(384, generator=g), torch.randn(384, generator=g).half()
    want = exl3.had_last(y.double(), h64) * sv.double() + b.double()
    torch.testing.assert_close(hadamard.output_transform(y, sv, b, torch.float32).double(), want,
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hadamard.output_transform(y, sv, None, torch.bfloat16),
                               (want - b.double()).bfloat16())


def test_transform_errors(mv) -> None:
    from qlinear.kernels.triton import hadamard

    with pytest.raises(ValueError, match=r"x: expected \[M, 256\].*found \[2, 128\]"):
        hadamard.input_transform(torch.zeros(2, 128), torch.zeros(256))
    with pytest.raises(ValueError, match="multiple of 128"):
        hadamard.output_transform(torch.zeros(2, 100), torch.zeros(100), None, torch.float32)
    with pytest.raises(ValueError, match="unit column stride"):
        hadamard.input_transform(torch.zeros(256, 2).t(), torch.zeros(256))


def test_launcher_errors(mv) -> None:
    tr = trellis(128, 128, 2, seed=0)
    with pytest.raises(ValueError, match=r"exl3_mv: trellis: expected a contiguous int16 \[K/16, N/16, 48\]"):
        mv.decode_inner(tr, 3, "3inst")
    with pytest.raises(ValueError, match=r"exl3_mv: xh: expected float16 \[M, 128\]"):
        mv.inner_product(torch.zeros(2, 128), tr, 2, "3inst", sms=1)
    with pytest.raises(ValueError, match="codebook"):
        mv.decode_inner(tr, 2, "2mad")


@pytest.mark.parametrize(("gluon", "routes"), [(True, {1: "tc", 8: "tc", 32: "tc", 33: "fused", 64: "fused"}),
                                               (False, {1: "gemv", 4: "gemv", 5: "fused", 64: "fused"})])
def test_route_by_rows(mv, monkeypatch: pytest.MonkeyPatch, gluon: bool, routes: dict[int, str]) -> None:
    """``inner_product``'s route (``TC_MAX_M``, ``GEMV_MAX_M``, ``FUSED_MAX_M``), with and without the Gluon kernel
    (``tc_available``: CUDA and a Triton with Gluon; here stood in for); above ``FUSED_MAX_M`` the weight is decoded
    and multiplied (run for real, in the interpreter)."""
    from qlinear.kernels.triton import exl3_tc

    taken: list[str] = []

    def stand_in(name: str):
        return lambda xh, tr, *a, **k: taken.append(name) or torch.zeros(xh.shape[0], 16 * tr.shape[1])

    monkeypatch.setattr(mv, "tc_available", lambda xh: gluon)
    monkeypatch.setattr(exl3_tc, "tc_product", stand_in("tc"))
    monkeypatch.setattr(mv, "gemv_product", stand_in("gemv"))
    monkeypatch.setattr(mv, "fused_product", stand_in("fused"))
    tr = trellis(64, 32, 2, seed=1)
    for m, want in routes.items():
        taken.clear()
        mv.inner_product(torch.zeros(m, 64, dtype=torch.float16), tr, 2, "3inst", sms=4)
        assert taken == [want], (m, taken)
    taken.clear()
    y = mv.inner_product(torch.ones(mv.FUSED_MAX_M + 1, 64, dtype=torch.float16), tr, 2, "3inst", sms=4)
    assert taken == [] and y.shape == (mv.FUSED_MAX_M + 1, 32)
