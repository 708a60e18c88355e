"""``BitblasLinear`` / ``AWQBitBlasKernel`` in Triton's CPU interpreter: the BitBLAS buffers decode to the same
runtime layout ``TritonV2Linear`` builds from the GPTQ tensors of the same weight, so the outputs are bit-identical;
and both are within the interpreter's float16 tolerance of a float64 product (tests/test_triton_interpret.py).

TRITON_INTERPRET=1 is set at collection, before anything imports the kernel bodies.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

from qlinear.spec import Scheme
from tests.test_bitblas import weight
from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import qmm

    with interpreted(qmm.qmm_kernel):
        yield


@pytest.mark.parametrize(("bits", "gs", "sym", "method", "m"), [(4, 32, False, "gptq", 3), (4, 128, True, "gptq", 1),
                                                                (2, 64, False, "gptq", 5), (8, 32, True, "gptq", 2),
                                                                (4, 64, False, "awq", 4)])
def test_bitblas_layer_matches_triton_gptq_and_float64(bits: int, gs: int, sym: bool, method: str, m: int) -> None:
    from qlinear.kernels.bitblas import AWQBitBlasKernel, BitblasLinear
    from qlinear.kernels.triton_gptq import TritonV2Linear

    k, n = 128, 48
    s = Scheme(bits=bits, group_size=gs, in_features=k, out_features=n, sym=sym, method=method, format="bitblas")
    q = weight(s, seed=bits * gs + m)
    bias = (torch.randn(n, generator=torch.Generator().manual_seed(m)) * 0.1).half()
    layer = (AWQBitBlasKernel if method == "awq" else BitblasLinear)(s, bias=True)
    layer.load_affine(q, bias)
    ref = TritonV2Linear(Scheme(bits=bits, group_size=gs, in_features=k, out_features=n, sym=sym), bias=True)
    ref.load_affine(q, bias)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(7)).half()
    y = layer(x)
    assert torch.equal(y, ref(x))
    y64 = x.double().numpy() @ q.dequantize(torch.float64).numpy().T + bias.double().numpy()
    assert np.linalg.norm(y.double().numpy() - y64) / np.linalg.norm(y64) < 4e-3
