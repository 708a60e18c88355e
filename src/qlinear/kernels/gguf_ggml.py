"""GGUF through ggml itself: ``GGUFCppKernel`` runs ggml's CPU matmul on the raw blocks (ggml-python).

``qweight`` rows are ggml's own block structs, so they go to ``ggml_mul_mat`` unchanged: a no-alloc ggml
context gets tensor headers whose data pointers are the layer's ``qweight``, the float32 activations and
the output (nothing is copied), and one graph runs on ``torch.get_num_threads()`` threads. ggml's kernels
quantize the activations first (to Q8_0 blocks for the 32-value types and Q1_0, Q8_K for the K-quants
and IQ4_XS) and multiply integer blocks: the result differs from the float64 product by about 5e-3
relative (random weights and activations), the accuracy llama.cpp has on CPU. So AUTO passes it over
(``auto_reasons``) and an explicit ``backend="gguf_cpp_cpu"`` accepts it.

ggml-python is an optional extra (``pip install 'qlinear[ggml]'``: ggml-python 0.0.45, built from source
with cmake, about a minute). Without it the kernel reports that, with the install command.

``GGUFCudaKernel`` stays declared only: ggml-python builds ggml's CPU backend (its CUDA backend needs
``CMAKE_ARGS=-DGGML_CUDA=on`` and nvcc at install time), and GGUF on CUDA is GGUFTritonKernel's job.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

import torch

from ..caps import Problem
from ..layouts import gguf
from ..target import Target
from .gguf_torch import GGUFQuantLinear
from .planned.gguf import GGUFCppKernel as _DeclaredCpp
from .planned.gguf import GGUFCudaKernel as _DeclaredCuda

GGML = {"ggml": "ggml-python==0.0.45"}  # pip install 'qlinear[ggml]'
T = gguf.GGMLType
#: qlinear type -> ggml type id. Upstream id 41 (Q1_0) is the reference's Q1_0_G128 byte for byte; the
#: reference's 32-value Q1_0 (qlinear id 40) has no ggml type (upstream 40 is NVFP4).
GGML_IDS = {T.Q4_0: 2, T.Q4_1: 3, T.Q5_0: 6, T.Q5_1: 7, T.Q8_0: 8, T.Q2_K: 10, T.Q3_K: 11, T.Q4_K: 12,
            T.Q5_K: 13, T.Q6_K: 14, T.IQ4_NL: 20, T.IQ4_XS: 23, T.Q1_0_G128: 41}


def _ggml() -> Any:
    return importlib.import_module("ggml")


def ggml_matmul(qweight: torch.Tensor, ggml_id: int, x: torch.Tensor, threads: int = 0) -> torch.Tensor:
    """``x [M, KP] float32 @ W^T`` -> float32 ``[M, N]`` by ggml's CPU ``mul_mat`` (``KP`` whole blocks).

    ``qweight`` (uint8 ``[N, R]``) and ``x`` must be contiguous CPU tensors; they are used in place."""
    g = _ggml()
    n, m, kp = qweight.shape[0], x.shape[0], x.shape[1]
    y = torch.empty((m, n), dtype=torch.float32)
    if m == 0 or n == 0:
        return y
    params = g.ggml_init_params(mem_size=g.ggml_tensor_overhead() * 4 + g.ggml_graph_overhead(),
                                mem_buffer=None, no_alloc=True)
    ctx = g.ggml_init(params)
    if ctx is None:
        raise RuntimeError("ggml_init failed")
    try:
        a = g.ggml_new_tensor_2d(ctx, ggml_id, kp, n)
        b = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, kp, m)
        out = g.ggml_mul_mat(ctx, a, b)
        if g.ggml_row_size(ggml_id, kp) != qweight.shape[1]:
            raise ValueError(f"qweight: ggml expects rows of {g.ggml_row_size(ggml_id, kp)} bytes for "
                             f"{kp} values, got {qweight.shape[1]}")
        a.contents.data, b.contents.data, out.contents.data = qweight.data_ptr(), x.data_ptr(), y.data_ptr()
        graph = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(graph, out)
        plan = g.ggml_graph_plan(graph, threads or torch.get_num_threads(), None)
        work = torch.empty(max(1, plan.work_size), dtype=torch.uint8)  # ggml's quantized activations
        plan.work_data = ctypes.cast(work.data_ptr(), ctypes.POINTER(ctypes.c_uint8))
        status = g.ggml_graph_compute(graph, ctypes.pointer(plan))
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute failed with status {status}")
    finally:
        g.ggml_free(ctx)
    return y


class GGUFCppKernel(GGUFQuantLinear):
    """Native GGML blocks multiplied by ggml's own CPU kernels (activations quantized to 8 bits by ggml)."""

    backend = _DeclaredCpp.backend
    caps = _DeclaredCpp.caps.but(requires_modules=GGML)
    qtypes = frozenset(GGML_IDS)

    @classmethod
    def auto_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return ["ggml quantizes activations to 8 bits (~5e-3 relative error): AUTO keeps layers on kernels that "
                "multiply the activations as given (name backend gguf_cpp_cpu to accept it)"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if x.device.type != "cpu" or self.qweight.device.type != "cpu":
            raise ValueError(f"input: {type(self).__name__} runs on CPU tensors, got input on {x.device} and "
                             f"weights on {self.qweight.device}")
        if self.qtype not in GGML_IDS:
            raise ValueError(f"{type(self).__name__}: qtype {self.qtype.name} has no ggml type")
        self.ensure_prepared()
        info, k = self.type_info, self.in_features
        kp = info.blocks_per_row(k) * info.block_size
        x2 = x.reshape(-1, k).to(torch.float32)
        if kp != k:  # ggml multiplies whole blocks: the padding values meet zero activations
            x2 = torch.nn.functional.pad(x2, (0, kp - k))
        y = ggml_matmul(self.qweight.contiguous(), GGML_IDS[self.qtype], x2.contiguous())
        if self.bias is not None:
            y += self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class GGUFCudaKernel(_DeclaredCuda):
    """Declared from the reference, not built: no ggml CUDA build is present (GGUFTritonKernel runs GGUF on CUDA)."""

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        if target.modules is None and target.has_module("ggml") and getattr(_ggml(), "GGML_USE_CUDA", False):
            return []
        return ["no ggml CUDA build present: ggml-python 0.0.45 builds ggml's CPU backend only (CUDA needs "
                "CMAKE_ARGS=-DGGML_CUDA=on and nvcc at install); GGUF on CUDA runs on gguf_triton or gguf_torch"]


KERNELS = (GGUFCppKernel, GGUFCudaKernel)
