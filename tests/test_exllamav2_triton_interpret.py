"""ExllamaV2Linear / AwqExllamaV2Linear's CUDA route (qlinear's Triton GPTQ kernels, ``TritonQuantMixin``) in Triton's
CPU interpreter, against the same layers' exllamav2 Torch path (exact float16 decode, ``test_exllamav2.py``).

On CUDA ``prepare()`` builds the Triton layout instead of exllamav2's; the interpreter runs on CPU tensors, so the
test calls the Triton half of ``prepare`` and ``forward`` directly. TRITON_INTERPRET=1 is set at collection, before
anything imports the kernel bodies.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from qlinear import Scheme, quantize_rtn
from qlinear.kernels.exllamav2 import AwqExllamaV2Linear, ExllamaV2Linear
from qlinear.kernels.triton_gptq import TritonQuantMixin
from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"


@pytest.mark.parametrize(("cls", "method", "fmt", "desc_act"), [
    (ExllamaV2Linear, "gptq", "gptq", True),
    (AwqExllamaV2Linear, "awq", "gemm", False),
])
def test_cuda_route_matches_torch_path(cls, method: str, fmt: str, desc_act: bool) -> None:
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import qmm

    k, n = 256, 64
    g = torch.Generator().manual_seed(11)
    q = quantize_rtn(torch.randn(n, k, generator=g) * 0.02, bits=4, group_size=64, sym=False, desc_act=desc_act)
    s = Scheme(bits=4, group_size=64, in_features=k, out_features=n, sym=False, desc_act=desc_act, method=method,
               format=fmt)
    layer = cls(s, bias=True)
    layer.load_affine(q, bias=torch.randn(n, generator=g) * 0.1)
    x = torch.randn(2, k, generator=g).half()
    exact = layer(x).float()  # exllamav2's layout, float16 decode
    with interpreted(qmm.qmm_kernel):
        TritonQuantMixin.prepare(layer)
        y = TritonQuantMixin.forward(layer, x).float()
    assert (y - exact).abs().max() <= 2e-3 * exact.abs().max()
