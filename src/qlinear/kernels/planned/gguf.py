"""GGUF family: native GGML block bytes run by Torch, the ggml C++ bridge (CPU/CUDA) or Triton, declared from the
reference's tables. GGUF has no affine groups, so group size, desc_act and sym are None. Pure class definitions."""

from __future__ import annotations

import torch

from ...caps import Caps
from ...enums import ALL_DEVICES, BACKEND, DEVICE, FORMAT
from ..base import PlannedKernel

#: The ggml bridge is llama-cpp-python's bundled ggml libraries (GPTQModel's gguf_cpp.py loads them from there).
GGML_BRIDGE = {"llama_cpp": "llama-cpp-python"}


class GGUFTorchLinear(PlannedKernel):
    """Native GGUF block bytes and qtype decoded by Torch (fused/tiled or current-call paths)."""

    backend = BACKEND.GGUF_TORCH
    caps = Caps(
        formats={FORMAT.GGUF: 15},
        bits=frozenset({1, 2, 3, 4, 5, 6, 8}),
        group_sizes=None,
        desc_act=None,
        sym=None,
        training=True,
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        pack_dtypes=frozenset({torch.int8, torch.int16, torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=True,
        sharded_load=True,
        devices=ALL_DEVICES,
    )


class GGUFCppKernel(PlannedKernel):
    """Native GGUF block bytes multiplied by the ggml CPU bridge (CPU input required)."""

    backend = BACKEND.GGUF_CPP_CPU
    caps = GGUFTorchLinear.caps.but(
        formats={FORMAT.GGUF: 25},
        training=False,
        devices=frozenset({DEVICE.CPU}),
        requires_modules=GGML_BRIDGE,
    )


class GGUFCudaKernel(PlannedKernel):
    """Native GGUF block bytes multiplied by the ggml CUDA bridge with cached execution plans."""

    backend = BACKEND.GGUF_CPP_CUDA
    caps = GGUFTorchLinear.caps.but(
        formats={FORMAT.GGUF: 35},
        training=False,
        devices=frozenset({DEVICE.CUDA}),
        requires_modules=GGML_BRIDGE,
    )


#: Bits qlinear's GGUFTritonKernel declares beyond the reference's 1/4/5/6: Q8_0, which its block bodies run
#: (``kernels/gguf_triton.RUNNABLE``, checked against gguf-py). Without it AUTO sends every Q8_0 layer on CUDA to
#: GGUFTorchLinear, which decodes the whole weight with torch in each forward. A deliberate widening
#: (``tests/test_declarations.DELIBERATE``).
TRITON_EXTRA_BITS = frozenset({8})


class GGUFTritonKernel(PlannedKernel):
    """Native GGUF block bytes for its qtype subset decoded and multiplied by Triton (FP16 work inputs)."""

    backend = BACKEND.GGUF_TRITON
    caps = GGUFTorchLinear.caps.but(
        formats={FORMAT.GGUF: 45},
        bits=frozenset({1, 4, 5, 6}) | TRITON_EXTRA_BITS,
        training=False,
        devices=frozenset({DEVICE.CUDA}),
        requires_modules={"triton": "triton>=3.4"},
    )
