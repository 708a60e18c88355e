"""The CUDA path of benchmarks/conformance_report.py for the Triton kernels, on CPU tensors in Triton's interpreter.

TRITON_INTERPRET=1 is set here, at collection, before anything imports a kernel body (``triton.jit`` decides
interpreted-or-compiled when a body is defined). The same enumeration, builders and oracles as the CUDA report run
a tiny covering sample per kernel; the selector's answer is taken for a fake H200 with Triton installed (the kernels
declare CUDA only), and each layer is constructed directly and run on CPU tensors. Tolerances are the report's,
except bfloat16 where the interpreter rounds float32 -> bfloat16 by truncation (twice the GPU's error:
tests/test_triton_interpret.py): 3e-2.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from tests.conformance import builders
from tests.conformance.known import known
from tests.conformance.run import Tally, tally
from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"
#: Combinations per kernel: the interpreter runs a Triton program in numpy, seconds per call.
CAP = 4
#: The Triton kernels whose layers run on CPU tensors when interpreting (the others refuse CPU tensors in forward:
#: TritonFP8/FP4Linear, W4AFP8Linear, QQQLinear, VPTQCudaLinear, ExllamaV3Linear; their interpreter tests call
#: the kernel functions directly).
KERNELS = ("TritonV2Linear", "AwqGEMMTritonLinear", "GGUFTritonKernel", "BitsAndBytesTritonLinear",
           "ParoQuantTritonLinear", "BitblasLinear", "AWQBitBlasKernel", "Exl2TritonLinear", "MlxTritonLinear")


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """Skip without triton; run bodies interpreted; float32 dots for bfloat16 operands."""
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import qmm

    with interpreted(qmm.qmm_kernel):
        yield


@pytest.mark.parametrize("name", KERNELS)
def test_triton_kernel_conformance_interpreted(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from qlinear.kernels.registry import kernel_by_name
    from qlinear.target import Target

    monkeypatch.setitem(builders.TOL, torch.bfloat16, 3e-2)
    kernel = kernel_by_name(name)
    t: Tally = tally(kernel, "cpu", CAP, target=Target.fake_cuda((9, 0), modules={"triton": True}))
    print(t.line())
    assert t.valid and t.sampled == CAP and t.refused_count == 0, t.refused
    unexpected = [(label, detail) for label, detail in t.failures if not known(t.kernel, label, detail)]
    assert not unexpected and t.executed == CAP, unexpected
