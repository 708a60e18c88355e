"""Triton v2: GPTQ packed words consumed directly by Triton kernels, declared from the reference's tables."""

from __future__ import annotations

import torch

from ...caps import Caps
from ...enums import BACKEND, DEVICE, FORMAT
from ..base import PlannedKernel


class TritonV2Linear(PlannedKernel):
    """GPTQ packed qweight/qzeros/scales/g_idx consumed by Triton kernels (no dense weight kept)."""

    backend = BACKEND.GPTQ_TRITON
    caps = Caps(
        formats={FORMAT.GPTQ: 40, FORMAT.GPTQ_V2: 40},
        bits=frozenset({2, 4, 8}),
        group_sizes=frozenset({-1, 16, 32, 64, 128, 256, 512, 1024}),
        desc_act=frozenset({False, True}),
        sym=frozenset({False, True}),
        training=True,
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        pack_dtypes=frozenset({torch.int32, torch.int16, torch.int8}),
        in_divisible=32,
        out_divisible=32,
        auto_padding=True,
        sharded_load=True,
        devices=frozenset({DEVICE.CUDA}),
        # The reference's Triton section names no architecture set; the validator gates Triton versions only.
        gpu_archs=None,
        requires_modules={"triton": "triton>=3.4"},
    )
