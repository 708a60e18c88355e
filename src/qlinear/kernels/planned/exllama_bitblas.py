"""ExLlama v2, BitBLAS and EXL3 (ExLlama v3) families, declared from the reference's tables and family sections.
Pure class definitions."""

from __future__ import annotations

import torch

from ...caps import Caps
from ...enums import ALL_DEVICES, BACKEND, DEVICE, FORMAT
from ..base import PlannedKernel

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
BOTH = frozenset({False, True})
CUDA = frozenset({DEVICE.CUDA})
GROUPS = frozenset({-1, 32, 64, 128})
BITBLAS = {"bitblas": "bitblas>=0.1.0.post1"}  # the module's MINIMUM_BITBLAS_VERSION


class ExllamaV2Linear(PlannedKernel):
    """GPTQ packed buffers turned into an ExLlama v2 extension matrix handle (FP16 native execution)."""

    backend = BACKEND.GPTQ_EXLLAMA_V2
    caps = Caps(
        formats={FORMAT.GPTQ: 80, FORMAT.GPTQ_V2: 80},
        bits=frozenset({4}),
        group_sizes=GROUPS,
        desc_act=BOTH,
        sym=BOTH,
        training=False,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=32,
        out_divisible=32,
        auto_padding=False,
        sharded_load=True,
        devices=CUDA,
    )


class AwqExllamaV2Linear(PlannedKernel):
    """AWQ GEMM adapted to ExLlama v2-compatible packed buffers and its matrix handle."""

    backend = BACKEND.AWQ_EXLLAMA_V2
    caps = ExllamaV2Linear.caps.but(formats={FORMAT.GEMM: 80})


class BitblasLinear(PlannedKernel):
    """GPTQ or serialized BitBLAS weights transformed to BitBLAS's runtime weight/scales/zeros."""

    backend = BACKEND.GPTQ_BITBLAS
    caps = Caps(
        formats={FORMAT.BITBLAS: 30, FORMAT.GPTQ: 30, FORMAT.GPTQ_V2: 30},
        bits=frozenset({2, 4, 8}),
        group_sizes=GROUPS,
        desc_act=frozenset({False}),
        sym=BOTH,
        training=False,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=16,
        out_divisible=16,
        auto_padding=False,
        sharded_load=True,
        devices=CUDA,
        requires_modules=BITBLAS,
    )


class AWQBitBlasKernel(PlannedKernel):
    """AWQ GEMM or serialized BitBLAS weights transformed to BitBLAS's runtime weight/scales/zeros."""

    backend = BACKEND.AWQ_BITBLAS
    caps = BitblasLinear.caps.but(
        formats={FORMAT.GEMM: 0, FORMAT.BITBLAS: 30},
        bits=frozenset({4}),
        desc_act=BOTH,
    )


# EXL3 has no row in the reference's declaration tables. From its section: a trellis/codebook format, not grouped
# affine (so no group size, desc_act or sym), bits 1..8. The AUTO priorities only encode the loader's rule (native on
# CUDA/HIP, Torch otherwise). The 128-divisibility is the block Hadamard transform of GPTQModel's exllamav3_torch.py.
_EXL3 = Caps(
    formats={FORMAT.EXL3: 100},
    bits=frozenset(range(1, 9)),
    group_sizes=None,
    desc_act=None,
    sym=None,
    training=False,
    dtypes=frozenset({F16, BF16, F32}),
    pack_dtypes=frozenset({torch.int16, torch.int32}),  # trellis words are int16; int32 is the Scheme default
    in_divisible=128,
    out_divisible=128,
    auto_padding=False,
    sharded_load=True,
    devices=frozenset({DEVICE.CUDA, DEVICE.ROCM}),
)


class ExllamaV3Linear(PlannedKernel):
    """EXL3 trellis/su/sv tensors run by the bundled native LinearEXL3 runtime (CUDA/HIP only)."""

    backend = BACKEND.EXL3_EXLLAMA_V3
    caps = _EXL3


class ExllamaV3TorchLinear(PlannedKernel):
    """EXL3 trellis/codebook decoding and chunked matmul in portable Torch."""

    backend = BACKEND.EXL3_TORCH
    caps = _EXL3.but(formats={FORMAT.EXL3: 50}, devices=ALL_DEVICES)
