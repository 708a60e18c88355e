"""GGUFCppKernel: ggml's own CPU matmul on the raw blocks, vs a float64 oracle (gguf-py decode, or numpy).

Skipped without ggml-python (``pip install 'qlinear[ggml]'``). ggml quantizes the activations to 8-bit blocks
(Q8_0 / Q8_K) before multiplying, so the tolerance is that quantization's: 1.5e-2 relative (measured about
5e-3 to 7e-3 on Gaussian data).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels.gguf_ggml import GGML_IDS, GGUFCppKernel, GGUFCudaKernel
from qlinear.layouts import gguf as G
from qlinear.select import select
from qlinear.target import Target

INSTALL = "pip install ggml-python==0.0.45  (or pip install 'qlinear[ggml]')"
TOL = 1.5e-2
ENCODABLE = [t for t in sorted(GGML_IDS) if G.TYPES[t].encode is not None]


def need_ggml() -> None:
    pytest.importorskip("ggml", reason=f"ggml-python is not installed: {INSTALL}")


def oracle(raw: np.ndarray, qtype: G.GGMLType, k: int) -> np.ndarray:
    if qtype == G.GGMLType.Q1_0_G128:
        blocks = raw.reshape(-1, 18)
        d = blocks[:, :2].copy().view("<f2").astype(np.float64)
        bits = np.unpackbits(blocks[:, 2:], axis=1, bitorder="little").astype(np.float64)
        return (d * (bits * 2 - 1)).reshape(raw.shape[0], -1)[:, :k]
    gguf = pytest.importorskip("gguf", reason="gguf-py is the oracle: pip install -r requirements/nodeps-gguf.txt")
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype.value))[:, :k].astype(np.float64)


@pytest.mark.parametrize("qtype", ENCODABLE, ids=lambda t: t.name)
@pytest.mark.parametrize("k", [512, 544])
def test_matmul_matches_oracle(qtype: G.GGMLType, k: int) -> None:
    need_ggml()
    if k % G.TYPES[qtype].block_size == 0 and k != 512:
        pytest.skip("no partial block for this type")
    n, m = 48, 5
    rng = np.random.default_rng(qtype.value + k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    layer = GGUFCppKernel(G.scheme_for(qtype, k, n), bias=True, dtype=torch.bfloat16)
    layer.load_blocks(G.quantize(w, qtype), torch.from_numpy(rng.standard_normal(n).astype(np.float32)))
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32))
    ref = x.double().numpy() @ oracle(layer.qweight.numpy(), qtype, k).T + layer.bias.double().numpy()
    for dtype in (torch.float32, torch.bfloat16):
        y = layer(x.to(dtype).reshape(1, m, k))
        assert y.shape == (1, m, n) and y.dtype == dtype
        err = float(np.linalg.norm(y[0].double().numpy() - ref) / np.linalg.norm(ref))
        assert err < TOL, f"{qtype.name} {dtype}: relative error {err:.2e}"


def test_decode_only_types_run_too() -> None:
    need_ggml()
    for qtype in (G.GGMLType.IQ4_NL, G.GGMLType.IQ4_XS):
        info = G.TYPES[qtype]
        raw = np.random.default_rng(1).integers(0, 256, (16, info.row_bytes(512)), dtype=np.uint8)
        raw.reshape(16, -1, info.type_size)[:, :, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        layer = GGUFCppKernel(G.scheme_for(qtype, 512, 16), dtype=torch.float32)
        layer.load_blocks(raw)
        x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
        ref = x.double().numpy() @ oracle(raw, qtype, 512).T
        err = np.linalg.norm(layer(x).double().numpy() - ref) / np.linalg.norm(ref)
        assert err < TOL, qtype.name


def test_reasons_and_auto() -> None:
    p = Problem(G.scheme_for("Q4_K", 4096, 4096), torch.bfloat16)
    missing = GGUFCppKernel.reasons(p, Target.fake_cpu(modules={}))
    assert missing == ["needs Python module 'ggml': pip install ggml-python==0.0.45"]
    assert GGUFCppKernel.reasons(p, Target.fake_cpu(modules={"ggml": True})) == []
    q1 = GGUFCppKernel.reasons(Problem(G.scheme_for("Q1_0", 4096, 4096)), Target.fake_cpu(modules={"ggml": True}))
    assert any("qtype Q1_0 not run" in r for r in q1)  # the reference's 32-value Q1_0 has no ggml type
    assert GGUFCppKernel.auto_reasons(p, Target.fake_cpu()) != []  # explicit only: 8-bit activations
    assert select(p, Target.fake_cpu(modules={"ggml": True})).kernel is not GGUFCppKernel
    cuda = GGUFCudaKernel.reasons(p, Target.fake_cuda((9, 0), modules={"llama_cpp": True}))
    assert any("no ggml CUDA build present" in r for r in cuda)


def test_cpu_only() -> None:
    need_ggml()
    layer = GGUFCppKernel(G.scheme_for("Q8_0", 64, 8))
    with pytest.raises(ValueError, match="expected last dimension 64"):
        layer(torch.zeros(2, 32))
