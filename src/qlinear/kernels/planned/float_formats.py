"""Floating-point formats: FP8 weights, and the W4A kernels (GPTQ INT4 weights with FP8 / NVFP4 activations),
declared from the reference's tables and its FP8/FP4/W4A section. Pure class definitions."""

from __future__ import annotations

import torch

from ...caps import Caps, Problem, archs_from
from ...enums import ALL_DEVICES, BACKEND, DEVICE, FORMAT
from ...target import Target
from ..base import PlannedKernel


class TorchFP8Linear(PlannedKernel):
    """FP8 weight codes plus scales: ``_scaled_mm`` where it applies, else a current-call decoded matmul."""

    backend = BACKEND.FP8_TORCH
    caps = Caps(
        formats={FORMAT.FP8: 15},
        bits=frozenset({8}),
        group_sizes=None,
        desc_act=None,
        sym=None,
        training=True,
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        pack_dtypes=frozenset({torch.int8, torch.int16, torch.int32, torch.int64}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=False,
        sharded_load=True,
        devices=ALL_DEVICES,
    )

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        if not hasattr(torch, "float8_e4m3fn"):
            return [f"torch {torch.__version__} has no FP8 dtypes (torch.float8_e4m3fn)"]
        return []


# W4A: explicit or activation-policy selection only (priority 0), GPTQ INT4 g128, no act-order, symmetric (the
# centered-code path needs zero point 8, which sym=True states), int32 words, K % 128, N % 32, no adapters.
# Execution is Triton (w4a_triton.py / w4a_nvfp4_triton.py), hence the triton requirement.
_W4A = Caps(
    formats={FORMAT.GPTQ: 0, FORMAT.GPTQ_V2: 0},
    bits=frozenset({4}),
    group_sizes=frozenset({128}),
    desc_act=frozenset({False}),
    sym=frozenset({True}),
    training=False,
    dtypes=frozenset({torch.float16, torch.bfloat16}),
    pack_dtypes=frozenset({torch.int32}),
    in_divisible=128,
    out_divisible=32,
    auto_padding=False,
    sharded_load=True,
    devices=frozenset({DEVICE.CUDA}),
    adapters=frozenset(),
    gpu_archs=archs_from((8, 9)),
    requires_modules={"triton": "triton>=3.4"},
)


class W4AFP8Linear(PlannedKernel):
    """Saved GPTQ INT4 weights with a runtime E4M3 operand and group-aware FP8 GEMM (capability 8.9+)."""

    backend = BACKEND.GPTQ_W4AFP8
    caps = _W4A


class W4ANVFP4Linear(PlannedKernel):
    """Saved GPTQ INT4 weights with runtime FP4/FP8 operands and block-scaled GEMM (capability 12.1+)."""

    backend = BACKEND.GPTQ_W4A_NVFP4
    caps = _W4A.but(gpu_archs=archs_from((12, 1)))
