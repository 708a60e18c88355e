"""ExllamaV2Linear / AwqExllamaV2Linear: exllamav2's runtime layout for 4-bit GPTQ and AWQ weights.

What is checked against what:

* the runtime layout (``layouts/exllamav2.build``: sorted rows, q_perm / q_invperm, shuffled words, zeros) against
  ``tests/oracle/exl2_numpy.py``, a line-by-line numpy transcription of exllamav2 0.3.2's ``QMatrix::make_sequential``
  (with its ``short`` histogram), ``make_sequential_kernel`` and ``shuffle_4bit_8``, applied to the GPTQ checkpoint
  words exactly as the extension applies them. The CUDA extension is JIT-built with nvcc and cannot run here
  (no GPU, no compiler); nothing was run from it, everything is transcribed.
* the decoded weight against the oracle's transcription of GPTQModel 7.7.0's ``reconstruct_gptq_kernel`` (float16
  ``q - z`` times the float16 scale, one rounding), bit for bit.
* the layer's forward against a float64 product computed from the canonical weight, and against TorchLinear.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear import AffineWeight, NoKernelError, Problem, Scheme, Target, quantize_rtn, select
from qlinear.kernels.exllamav2 import AwqExllamaV2Linear, ExllamaV2Linear
from qlinear.kernels.torch import TorchLinear
from qlinear.layouts import exllamav2 as exv2
from qlinear.layouts import gptq
from tests.oracle import exl2_numpy as oracle

K, N = 256, 64


def weight(group: int, desc_act: bool, sym: bool = False, seed: int = 0, k: int = K, n: int = N) -> AffineWeight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    perm = torch.randperm(k, generator=g) if desc_act else None
    return quantize_rtn(w, bits=4, group_size=group, sym=sym, desc_act=desc_act, perm=perm)


def layer(q: AffineWeight, fmt: str = "gptq_v2", bias: torch.Tensor | None = None) -> ExllamaV2Linear:
    s = Scheme(bits=4, group_size=q.group_size, in_features=q.in_features, out_features=q.out_features,
               sym=q.sym, desc_act=q.desc_act, format=fmt)
    out = ExllamaV2Linear(s, bias=bias is not None)
    out.load_affine(q, bias=bias)
    return out


CASES = [(32, True), (128, True), (64, False), (-1, False)]


@pytest.mark.parametrize(("group", "desc_act"), CASES)
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_runtime_layout_matches_make_q_matrix(group: int, desc_act: bool, fmt: str) -> None:
    q = weight(group, desc_act)
    lay = layer(q, fmt)
    rt = lay.runtime()
    qweight, g_idx = lay.qweight.numpy(), lay.g_idx.numpy()
    groups = lay.scales.shape[0]
    if (g_idx == 0).all():  # ext.py: no g_idx handed over, no make_sequential
        want_w, perm, inv = qweight, None, None
        assert rt.q_perm is None and rt.q_invperm is None
    else:
        want_w, perm, inv = oracle.make_sequential(qweight, g_idx, groups)
        assert np.array_equal(rt.q_perm.numpy().view(np.uint16), perm)
        assert np.array_equal(rt.q_invperm.numpy().view(np.uint16), inv)
    assert np.array_equal(rt.qweight.numpy().view(np.uint32), oracle.shuffle_4bit_8(want_w))
    v2 = gptq.to_checkpoint(q, "gptq_v2")["qzeros"]  # GPTQModel hands the kernel v2 (true) zero points
    assert torch.equal(rt.qzeros, v2)
    assert rt.scales.dtype == torch.float16 and torch.equal(rt.scales, lay.scales)
    decoded = oracle.gptq_weight(rt.qweight.numpy(), perm, v2.numpy(), lay.scales.numpy(), q.in_features)
    assert np.array_equal(exv2.dequantize(rt).numpy().view(np.uint16), decoded.T.copy().view(np.uint16))


@pytest.mark.parametrize(("group", "desc_act"), CASES)
def test_forward_matches_float64_and_torch_linear(group: int, desc_act: bool) -> None:
    q = weight(group, desc_act, seed=3)
    bias = torch.randn(N) * 0.1
    lay = layer(q, bias=bias)
    x = torch.randn(5, K)
    w64 = (q.codes.double() - q.zeros.double()[:, q.g_idx.long()]) * q.scales.double()[:, q.g_idx.long()]
    ref = x.half().double() @ w64.t() + bias.half().double()
    for dtype, tol in ((torch.float16, 3e-3), (torch.bfloat16, 1.5e-2)):
        y = lay(x.to(dtype))
        assert y.dtype == dtype and y.shape == (5, N)
        assert (y.double() - ref).abs().max() <= tol * ref.abs().max()
    s = lay.scheme
    torch_layer = TorchLinear(s, bias=True)
    torch_layer.load_affine(q, bias=bias)
    y_t, y_e = torch_layer(x.half()).double(), lay(x.half()).double()
    assert (y_t - y_e).abs().max() <= 3e-3 * ref.abs().max()


def test_awq_layer_runs_the_same_runtime() -> None:
    q = weight(128, False, seed=5)
    s = Scheme(bits=4, group_size=128, in_features=K, out_features=N, sym=False, method="awq", format="gemm")
    awq = AwqExllamaV2Linear(s)
    awq.load_affine(q)
    ref = layer(q)
    a, b = awq.runtime(), ref.runtime()
    assert torch.equal(a.qweight, b.qweight) and torch.equal(a.qzeros, b.qzeros) and torch.equal(a.scales, b.scales)
    assert a.q_perm is None and torch.equal(b.q_perm, torch.arange(K, dtype=torch.int16))  # no g_idx handed over
    x = torch.randn(2, K).half()
    assert torch.equal(awq(x), ref(x))


def test_runtime_follows_checkpoint_mutation() -> None:
    q = weight(64, True, seed=7)
    lay = layer(q)
    x = torch.randn(1, K).half()
    y0 = lay(x)
    with torch.no_grad():
        lay.scales.mul_(2)
    assert torch.allclose(lay(x).float(), 2 * y0.float(), rtol=2e-3, atol=1e-3)


def test_state_dict_is_the_gptq_checkpoint() -> None:
    lay = layer(weight(32, True), "gptq")
    assert sorted(lay.state_dict()) == ["g_idx", "qweight", "qzeros", "scales"]


def test_bad_inputs_raise_value_errors() -> None:
    q3 = quantize_rtn(torch.randn(N, K) * 0.02, bits=3, group_size=32)
    with pytest.raises(ValueError, match="4-bit only"):
        exv2.build(q3)
    q = weight(32, False, k=96 + 16)
    with pytest.raises(ValueError, match="in_features: 112 is not a multiple of 32"):
        exv2.build(q)
    q = weight(32, False)
    uneven = AffineWeight(q.codes, q.scales, q.zeros, torch.cat([torch.zeros(40), torch.arange(40, K) // 32])
                          .to(torch.int32), 4, 32, q.sym)
    with pytest.raises(ValueError, match="g_idx: exllamav2 reads group k // 32"):
        exv2.build(uneven)
    lay = layer(weight(32, True))
    with pytest.raises(ValueError, match="expected last dimension 256"):
        lay(torch.randn(2, K + 1).half())
    with pytest.raises(ValueError, match="dtype torch.float32 not supported"):
        lay(torch.randn(2, K))


def test_auto_keeps_the_existing_kernels_and_explicit_works() -> None:
    s = Scheme(bits=4, group_size=128, in_features=4096, out_features=4096, format="gptq")
    cpu, sm90 = Target.fake_cpu(), Target.fake_cuda((9, 0), modules={"triton": True})
    assert select(Problem(s, torch.float16), cpu).kernel.__name__ == "TorchLinear"
    assert select(Problem(s, torch.float16), sm90).kernel.__name__ == "TritonV2Linear"
    assert select(Problem(s, torch.float16), sm90, "gptq_exllama_v2").kernel is ExllamaV2Linear
    no_triton = Target.fake_cuda((9, 0), modules={"triton": False})
    with pytest.raises(NoKernelError, match="triton is not installed"):
        select(Problem(s, torch.float16), no_triton, "gptq_exllama_v2")
    awq = Scheme(bits=4, group_size=128, in_features=4096, out_features=4096, method="awq", format="gemm",
                 sym=False)
    assert select(Problem(awq, torch.float16), sm90, "awq_exllama_v2").kernel is AwqExllamaV2Linear
