"""Method-specific families: bitsandbytes, QQQ, VPTQ and ParoQuant, declared from the reference's tables and their
family section. Pure class definitions."""

from __future__ import annotations

import torch

from ...caps import Caps
from ...enums import ALL_DEVICES, BACKEND, DEVICE, FORMAT
from ..base import PlannedKernel

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


class BitsAndBytesLinear(PlannedKernel):
    """bitsandbytes 4-bit codes plus QuantState, or INT8 state, with state-aware execution paths."""

    backend = BACKEND.BITSANDBYTES
    caps = Caps(
        formats={FORMAT.BITSANDBYTES: 40},
        bits=frozenset({4, 8}),
        group_sizes=None,
        desc_act=None,
        sym=None,
        training=False,
        dtypes=frozenset({F16, BF16, F32}),
        pack_dtypes=frozenset({torch.int8, torch.int16, torch.int32, torch.int64}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=False,
        sharded_load=True,
        devices=frozenset({DEVICE.CPU, DEVICE.CUDA}),
        requires_modules={"bitsandbytes": "bitsandbytes"},
    )


class QQQLinear(PlannedKernel):
    """QQQ packed B plus group/channel scales with dynamic activation quantization and the native multiply."""

    backend = BACKEND.QQQ
    caps = Caps(
        formats={FORMAT.QQQ: 100},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 128}),
        desc_act=frozenset({False}),
        sym=frozenset({True}),
        training=False,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=64,
        out_divisible=64,
        auto_padding=False,
        sharded_load=True,
        devices=frozenset({DEVICE.CUDA, DEVICE.ROCM}),
    )


class QQQTorchLinear(PlannedKernel):
    """QQQ packed B plus group/channel scales executed by portable Torch math."""

    backend = BACKEND.QQQ_TORCH
    caps = QQQLinear.caps.but(formats={FORMAT.QQQ: 90}, devices=ALL_DEVICES)


class VPTQLinear(PlannedKernel):
    """Packed vector indices, codebooks and optional residual/outlier state, decoded per call for F.linear."""

    backend = BACKEND.VPTQ_TORCH
    caps = Caps(
        formats={FORMAT.VPTQ: 100},
        bits=frozenset(range(1, 9)),
        group_sizes=None,
        desc_act=None,
        sym=None,
        training=False,
        dtypes=frozenset({F16, BF16, F32}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=True,
        sharded_load=True,
        devices=ALL_DEVICES,
    )


class VPTQCudaLinear(PlannedKernel):
    """Packed vector indices and codebooks through a fused native CUDA path for eligible rows/dtypes."""

    backend = BACKEND.VPTQ_CUDA
    caps = VPTQLinear.caps.but(devices=frozenset({DEVICE.CUDA}), requires_modules={"vptq": "vptq"})


class ParoLinear(PlannedKernel):
    """Packed affine weights plus pairwise rotation/scaling metadata; inputs rotated before the quantized matmul."""

    backend = BACKEND.PAROQUANT_CUDA
    caps = Caps(
        formats={FORMAT.PAROQUANT: 55},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 16, 32, 64, 128}),
        desc_act=frozenset({False, True}),
        sym=frozenset({True}),
        training=True,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=False,
        sharded_load=True,
        devices=ALL_DEVICES,  # portable despite the PAROQUANT_CUDA name
    )


class ParoQuantTritonLinear(PlannedKernel):
    """ParoQuant packed affine weights plus rotation metadata through Triton plans (explicit only)."""

    backend = BACKEND.PAROQUANT_TRITON
    caps = ParoLinear.caps.but(
        formats={FORMAT.PAROQUANT: 0},
        devices=frozenset({DEVICE.CUDA}),
        requires_modules={"triton": "triton>=3.4"},
    )
