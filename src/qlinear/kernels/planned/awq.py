"""AWQ native and portable families (GEMM, GEMM-Triton, GEMV, GEMV_FAST, LLM-AWQ, portable Torch), declared from
the reference's tables. Pure class definitions: nothing here touches a device or imports an optional module."""

from __future__ import annotations

import torch

from ...caps import Caps, Problem
from ...enums import ALL_DEVICES, BACKEND, DEVICE, FORMAT
from ...target import Target
from ..base import PlannedKernel

F16, BF16 = torch.float16, torch.bfloat16
BOTH = frozenset({False, True})
TRITON = {"triton": "triton>=3.4"}


def gemv_zeros_width_reasons(problem: Problem) -> list[str]:
    """The GEMV / GEMV_FAST / LLM-AWQ zeros-width rule (``calculate_zeros_width``) only knows group sizes 32, 64
    and >= 128; any other group size raises at construction even where the class declares it (group 16)."""
    gs = problem.scheme.group_size  # already K for channelwise schemes
    if gs >= 128 or gs in (32, 64):
        return []
    return [f"group size {gs}: the AWQ GEMV zeros-width rule has no width for it (accepts 32, 64 or >= 128)"]


class AwqGEMMLinear(PlannedKernel):
    """AWQ GEMM packed qweight/qzeros/scales through the native CUDA AWQ GEMM extension."""

    backend = BACKEND.AWQ_GEMM
    caps = Caps(
        formats={FORMAT.GEMM: 60},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 16, 32, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=True,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=False,
        sharded_load=True,
        devices=frozenset({DEVICE.CUDA}),
    )


class AwqGEMMTritonLinear(PlannedKernel):
    """AWQ GEMM packed qweight/qzeros/scales through a Triton GEMM (FP16 work input)."""

    backend = BACKEND.AWQ_GEMM_TRITON
    caps = Caps(
        formats={FORMAT.GEMM: 50},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 32, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=True,
        dtypes=frozenset({F16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=32,
        out_divisible=8,
        auto_padding=False,
        sharded_load=True,
        devices=frozenset({DEVICE.CUDA, DEVICE.ROCM}),
        requires_modules=TRITON,
    )


class AwqGEMVLinear(PlannedKernel):
    """AWQ GEMV layout through the native GEMV kernel (GEMMv2 forward above 8 flattened rows)."""

    backend = BACKEND.AWQ_GEMV
    caps = Caps(
        formats={FORMAT.GEMV: 40},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=True,
        dtypes=frozenset({F16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=64,
        auto_padding=False,
        sharded_load=True,
        devices=frozenset({DEVICE.CUDA, DEVICE.ROCM}),
    )

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return gemv_zeros_width_reasons(problem)


class AwqGEMVFastLinear(PlannedKernel):
    """AWQ GEMV_FAST layout (int16 words, scaled negative zeros) through the native fast GEMV kernel."""

    backend = BACKEND.AWQ_GEMV_FAST
    caps = Caps(
        formats={FORMAT.GEMV_FAST: 30},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 16, 32, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=True,
        dtypes=frozenset({F16}),
        pack_dtypes=frozenset({torch.int16}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=False,
        sharded_load=True,
        devices=frozenset({DEVICE.CUDA, DEVICE.ROCM}),
    )

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return gemv_zeros_width_reasons(problem)


class LLMAwqLinear(AwqGEMVFastLinear):
    """Legacy LLM-AWQ layout (GEMV_FAST packing, ``scaled_zeros`` buffer) through the native fast GEMV kernel."""

    backend = BACKEND.AWQ_GEMV_FAST
    caps = AwqGEMVFastLinear.caps.but(formats={FORMAT.LLM_AWQ: 100})


class AwqTorchLinear(PlannedKernel):
    """AWQ GEMM words decoded by portable Torch math (also the bit widths the native INT4 kernels lack)."""

    backend = BACKEND.AWQ_TORCH
    caps = Caps(
        formats={FORMAT.GEMM: 10},
        bits=frozenset({2, 3, 4, 5, 6, 7, 8}),
        group_sizes=frozenset({-1, 16, 32, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=True,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=8,
        auto_padding=False,
        sharded_load=True,
        devices=ALL_DEVICES,
    )
