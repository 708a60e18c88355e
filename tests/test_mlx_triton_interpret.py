"""``MlxTritonLinear``: MLX affine weights on the GPTQ Triton kernels with an offset per group
(``kernels/mlx_triton.py``), in Triton's CPU interpreter.

What is checked against what:

* weights quantized by ``mx.quantize`` (mlx 0.32.4, the producer): every variant family the layer can run (gemv,
  gemv_tc, skinny2, gemm2, dense) against the float64 product with ``mx.dequantize``'s weight, every width and group
  size, float16 and bfloat16 scales and activations, within the activation dtype's rounding;
* the words read back from the runtime (``weight``, ``state_dict()``) against mlx's own words, word for word;
* the variants that cannot add offsets are refused by name, gemm5 only for want of sm_90 (it takes every width and
  group size with offsets there); the selector prefers the layer on CUDA for 16-bit
  activations and leaves float32 to ``MlxTorchLinear``.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels.mlx_torch import MlxTorchLinear
from qlinear.kernels.mlx_triton import KERNEL_BITS, MlxTritonLinear
from qlinear.layouts import mlx
from qlinear.select import explain, select
from qlinear.target import Target
from tests.triton_interp import interpreted

INSTALL = "pip install -r requirements/triton-interpret.txt"
N, K = 40, 256  # N not a multiple of 16: the layout pads it
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
VARIANTS = ("gemv", "gemv_tc", "skinny2", "gemm2", "dense")


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import qmm

    with interpreted(qmm.qmm_kernel):
        yield


def produced(bits: int, gs: int, sdtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """One module's tensors as mlx writes them (``mx.quantize`` of a random weight)."""
    from tests import mlx_support as mxs

    mxs.need_mlx()
    w = (torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.02).to(sdtype)
    words, scales, biases = mxs.quantize(w, gs, bits)
    return {"weight": words, "scales": scales, "biases": biases}


def mlx_weight(t: dict[str, torch.Tensor], bits: int, gs: int) -> torch.Tensor:
    from tests import mlx_support as mxs

    return mxs.dequantize(t["weight"], t["scales"], t["biases"], gs, bits).double()


def layer_of(t: dict[str, torch.Tensor], bits: int, gs: int, dtype: torch.dtype,
             bias: torch.Tensor | None = None) -> MlxTritonLinear:
    lay = MlxTritonLinear(mlx.scheme_for(bits, gs, K, N), bias=bias is not None, dtype=dtype)
    lay.load_state_dict(dict(t, **({"bias": bias} if bias is not None else {})))
    return lay


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize(("gs", "sdtype"), [(32, torch.float16), (64, torch.bfloat16), (128, torch.float16)])
def test_variants_match_mlx_dequantize(bits: int, gs: int, sdtype: torch.dtype) -> None:
    t = produced(bits, gs, sdtype, seed=bits)
    bias = torch.randn(N).to(sdtype)
    w = mlx_weight(t, bits, gs)
    # both activation dtypes at 4 bits; the scales' own dtype at the other widths (the interpreter is slow)
    for dtype in ((torch.float16, torch.bfloat16) if bits == 4 else (sdtype,)):
        # mlx rounds each weight to the scales' dtype (s q, then + b); the kernels sum s (q x) and b x exactly
        tol = max(TOL[dtype], TOL[sdtype])
        lay = layer_of(t, bits, gs, dtype, bias)
        lay.prepare()
        assert lay.packed().bits == KERNEL_BITS[bits] and lay.packed().offsets.dtype == sdtype
        for m, variants in ((1, ("gemv", "gemv_tc")), (5, ("gemv_tc", "skinny2")), (40, ("gemm2", "dense"))):
            x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).to(dtype)
            want = x.double() @ w.t() + bias.double()
            for v in variants:
                got = lay.matmul(x, variant=v)
                assert got.dtype == dtype
                assert rel(got, want) < tol, (v, m, dtype)
            assert rel(lay(x), want) < tol  # the variant the layer picks for M


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_words_rebuilt_from_the_runtime(bits: int) -> None:
    t = produced(bits, 64, torch.float16, seed=10 + bits)
    lay = layer_of(t, bits, 64, torch.float16)
    lay.prepare()
    assert lay.codes_replaced  # the file's words are not kept beside the runtime
    assert torch.equal(lay.weight.view(torch.int32), t["weight"].view(torch.int32))
    assert torch.equal(lay.state_dict()["weight"].view(torch.int32), t["weight"].view(torch.int32))
    new = produced(bits, 64, torch.float16, seed=99)  # new words reach the next forward
    lay.load_state_dict(new)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1)).half()
    assert rel(lay(x), x.double() @ mlx_weight(new, bits, 64).t()) < TOL[torch.float16]


def test_a_cast_moves_nothing_but_the_device() -> None:
    """``model.to(torch.bfloat16)`` must not round float16 scales and biases (MLX computes with them as stored)."""
    t = produced(4, 32, torch.float16, seed=3)
    lay = layer_of(t, 4, 32, torch.float16)
    lay.prepare()
    lay.to(torch.bfloat16)
    assert lay.scales.dtype == lay._rt_scales.dtype == lay._rt_offsets.dtype == torch.float16
    assert torch.equal(lay.weight.view(torch.int32), t["weight"].view(torch.int32))


def test_refusals_and_explain() -> None:
    t = produced(4, 64, torch.bfloat16)
    lay = layer_of(t, 4, 64, torch.bfloat16)
    text = lay.explain_call(40, "cpu")
    assert text.startswith("MLX 4-bit g64 on the GPTQ kernels (4-bit words, torch.bfloat16 scales and biases")
    assert "  gemm5: no CUDA device (Gluon wgmma + TMA: sm_90 only)" in text.splitlines()  # no MLX reason
    assert "gemm4: additive offsets (GGUF minimums, MLX biases): use skinny2" in text
    assert "gemm: adds no per-group offset (MLX biases)" in text
    assert lay.config(40, torch.device("cpu"), variant="gemm4").variant == "gemm2"  # the role among the offset ones
    with pytest.raises(ValueError, match="runs on CUDA tensors"):
        os.environ["TRITON_INTERPRET"] = "0"
        try:
            lay(torch.randn(1, K).bfloat16())
        finally:
            os.environ["TRITON_INTERPRET"] = "1"


def test_selected_on_cuda_for_16_bit_activations() -> None:
    cuda = Target.fake_cuda((9, 0), modules={"triton": True})
    s = mlx.scheme_for(4, 64, 4096, 4096)
    choice = select(Problem(s, torch.bfloat16), cuda)
    assert choice.kernel is MlxTritonLinear and "offsets per group" in choice.runs
    assert select(Problem(s, torch.float32), cuda).kernel is MlxTorchLinear  # float32: the exact decode
    assert select(Problem(s, torch.bfloat16), Target.fake_cpu()).kernel is not MlxTritonLinear
    no_triton = explain(Problem(s, torch.bfloat16), Target.fake_cuda((9, 0), modules={"triton": False}))
    verdict = next(v for v in no_triton.verdicts if v.kernel is MlxTritonLinear)
    assert not verdict.ok and any("triton" in r for r in verdict.reasons)


@pytest.mark.parametrize(("bits", "gs"), [(4, 32), (4, 64), (4, 128), (3, 64), (8, 64), (6, 32), (5, 128)])
def test_gemm5_takes_mlx_layers_on_sm90(bits: int, gs: int) -> None:
    """On sm_90, gemm5 adds MLX's biases over every group size, in 4-bit words (its one-group step reads the
    offsets since 2026-12-07) and in 8-bit words (5, 6 and 8-bit codes: ``fragment8.py``'s FMA form); checked on an
    H100 in results/h100-gpu_mlx-2026-12-07-gemm5.md. Not on sm_80 (wgmma), nor for float32 activations."""
    from qlinear.kernels.triton.gemm4_limits import gemm4_reasons

    lay = layer_of(produced(bits, gs, torch.bfloat16), bits, gs, torch.bfloat16)
    lay.prepare()
    p = lay.packed()
    assert gemm4_reasons(p, 40, torch.bfloat16, (9, 0), "gemm5") == []
    assert gemm4_reasons(p, 40, torch.bfloat16, (8, 0), "gemm5") != []
    assert gemm4_reasons(p, 40, torch.float32, (9, 0), "gemm5") != []


@pytest.mark.parametrize(("bits", "gs"), [(4, 64), (8, 64), (4, 32), (2, 32)])
def test_sm90_routing_gives_mlx_layers_gemm5_from_m9_to_1024(bits: int, gs: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The offset crossovers on an sm_90 device (its capability stood in for here): gemm5 for M = 9..1024 where it
    takes the layer, dense above; 2-bit words (which gemm5 does not pair) keep the crossovers' other variants."""
    from qlinear.kernels.triton import qmv_tc

    monkeypatch.setattr(qmv_tc, "capability", lambda device: (9, 0))
    lay = layer_of(produced(bits, gs, torch.bfloat16), bits, gs, torch.bfloat16)
    lay.prepare()
    got = {m: lay.config(m, torch.device("cpu")).variant for m in (12, 40, 300, 1024, 2000)}
    if bits == 2:
        assert "gemm5" not in got.values() and got[2000] == "dense", got
    else:
        assert got == {12: "gemm5", 40: "gemm5", 300: "gemm5", 1024: "gemm5", 2000: "dense"}, got
    assert lay.explain_call(40, "cpu").splitlines()[1].startswith(f"M=40: {got[40]} — crossovers for layouts")
