"""CPU (and XPU) Torch families: ATen int4pack, AVX512-BF16 native INT4, fused INT4, native INT8 and the retired
AWQ INT8 expansion, declared from the reference's tables. Pure class definitions."""

from __future__ import annotations

import torch

from ...caps import Caps, Problem
from ...enums import BACKEND, DEVICE, FORMAT
from ...target import Target
from ..base import PlannedKernel

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
BOTH = frozenset({False, True})
CPU = frozenset({DEVICE.CPU})
INT4PACK_CPU_OPS = ("aten._convert_weight_to_int4pack_for_cpu", "aten._weight_int4pack_mm_for_cpu")


class TorchAtenLinear(PlannedKernel):
    """GPTQ converted to the CPU ATen int4pack ABI plus affine scale/zero offsets."""

    backend = BACKEND.GPTQ_TORCH_ATEN
    caps = Caps(
        formats={FORMAT.GPTQ: 110, FORMAT.GPTQ_V2: 110},
        bits=frozenset({4}),
        group_sizes=frozenset({32, 64, 128, 256}),
        desc_act=BOTH,
        sym=BOTH,
        training=True,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=True,
        sharded_load=True,
        devices=CPU,
        requires_ops=INT4PACK_CPU_OPS,
    )


class TorchAtenAwqLinear(PlannedKernel):
    """AWQ GEMM converted to the CPU ATen int4pack ABI plus affine scale/zero offsets."""

    backend = BACKEND.AWQ_TORCH_ATEN
    caps = TorchAtenLinear.caps.but(formats={FORMAT.GEMM: 110})


def avx512_bf16_reasons(target: Target) -> list[str]:
    """The AVX512-BF16 validators need the ``avx512_bf16`` flag on every CPU the layer runs on."""
    return [f"{dev}: CPU lacks the 'avx512_bf16' flag" for dev in target.devices
            if dev.kind is DEVICE.CPU and "avx512_bf16" not in dev.cpu_flags]


class TorchCpuAvx512Linear(PlannedKernel):
    """GPTQ INT4 repacked to the native AVX512-BF16 CPU layout (int4_qzero_group_scaled_cpu)."""

    backend = BACKEND.GPTQ_TORCH_CPU_AVX512
    caps = Caps(
        formats={FORMAT.GPTQ: 120, FORMAT.GPTQ_V2: 120},
        bits=frozenset({4}),
        group_sizes=frozenset({16, 32, 64, 128, 256, 512}),
        desc_act=BOTH,
        sym=BOTH,
        training=False,
        dtypes=frozenset({BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=2,
        out_divisible=32,
        auto_padding=False,
        sharded_load=True,
        devices=CPU,
    )

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return avx512_bf16_reasons(target)


class TorchCpuAvx512AwqLinear(TorchCpuAvx512Linear):
    """AWQ INT4 repacked to the native AVX512-BF16 CPU layout (int4_qzero_group_scaled_cpu)."""

    backend = BACKEND.AWQ_TORCH_CPU_AVX512
    caps = TorchCpuAvx512Linear.caps.but(formats={FORMAT.GEMM: 120})


class TorchFusedLinear(PlannedKernel):
    """Checkpoint GPTQ converted to Torch's fused INT4 ABI (CPU int4pack; XPU has its own ABI)."""

    backend = BACKEND.GPTQ_TORCH_FUSED
    caps = Caps(
        formats={FORMAT.GPTQ: 50, FORMAT.GPTQ_V2: 50},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 16, 32, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=True,
        dtypes=frozenset({F32, F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=True,
        sharded_load=True,
        devices=frozenset({DEVICE.CPU, DEVICE.XPU}),
        requires_ops=INT4PACK_CPU_OPS,
    )


class TorchFusedAwqLinear(PlannedKernel):
    """AWQ GEMM adapted to Torch's fused INT4 ABI (CPU int4pack; XPU has its own ABI)."""

    backend = BACKEND.AWQ_TORCH_FUSED
    caps = TorchFusedLinear.caps.but(formats={FORMAT.GEMM: 20})


class TorchInt8Linear(PlannedKernel):
    """Native 8-bit GPTQ centered to an INT8 operand plus channel scales for ``_weight_int8pack_mm`` (explicit only)."""

    backend = BACKEND.GPTQ_TORCH_INT8
    caps = Caps(
        formats={FORMAT.GPTQ: 0, FORMAT.GPTQ_V2: 0},
        bits=frozenset({8}),
        group_sizes=frozenset({-1, 16, 32, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=False,
        dtypes=frozenset({F16, BF16, F32}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=True,
        sharded_load=True,
        devices=CPU,
        requires_ops=("aten._weight_int8pack_mm",),
    )


class TorchInt8AwqLinear(PlannedKernel):
    """Retired: persistent AWQ INT4-to-INT8 expansion; no executable runtime layout."""

    backend = BACKEND.AWQ_TORCH_INT8
    retired = ("persistent AWQ INT4-to-INT8 expansion is disabled; use AwqTorchLinear (backend awq_torch) or "
               "TorchAtenAwqLinear (awq_torch_aten) on CPU")
    caps = Caps(
        formats={FORMAT.GEMM: 0},
        bits=frozenset({4}),
        group_sizes=frozenset({-1, 16, 32, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=False,
        dtypes=frozenset({F16, BF16, F32}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=False,
        sharded_load=True,
        devices=CPU,
    )
