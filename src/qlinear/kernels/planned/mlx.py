"""MLX checkpoint holders: Torch modules that hold one method's checkpoint tensors until the model is converted to
MLX modules (their forward never runs in Torch). All have AUTO priority 0, MPS devices, macOS, float16, and need the
``mlx`` package. Declared from the reference's tables. Pure class definitions."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...caps import Caps, Problem
from ...enums import BACKEND, DEVICE, FORMAT, PLATFORM
from ...target import Target
from ..base import PlannedKernel
from .awq import gemv_zeros_width_reasons

BOTH = frozenset({False, True})
NO = frozenset({False})
YES = frozenset({True})
G32 = (-1, 32, 64, 128)
G16 = (-1, 16, 32, 64, 128)
INT32 = (torch.int32,)
INT16 = (torch.int16,)
ANY_INT = (torch.int8, torch.int16, torch.int32, torch.int64)


def holder(formats: Mapping[FORMAT, int], bits: tuple[int, ...], groups: tuple[int, ...] | None,
           desc_act: frozenset[bool] | None, sym: frozenset[bool] | None, pack: tuple[torch.dtype, ...],
           in_div: int, out_div: int) -> Caps:
    """One MLX holder's declaration: the per-class columns; everything else is common to the holders."""
    return Caps(
        formats=formats,
        bits=frozenset(bits),
        group_sizes=None if groups is None else frozenset(groups),
        desc_act=desc_act,
        sym=sym,
        training=False,
        dtypes=frozenset({torch.float16}),
        pack_dtypes=frozenset(pack),
        in_divisible=in_div,
        out_divisible=out_div,
        auto_padding=False,
        sharded_load=True,
        devices=frozenset({DEVICE.MPS}),
        platforms=frozenset({PLATFORM.DARWIN}),
        requires_modules={"mlx": "mlx"},
    )


class _MlxHolder(PlannedKernel):
    """Common base: every holder claims the MLX backend."""

    backend = BACKEND.MLX


class AWQBitBLASMlxQuantLinear(_MlxHolder):
    """Holds an AWQ BitBLAS checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.BITBLAS: 0}, (2, 3, 4, 5, 6, 7, 8), G32, BOTH, BOTH, INT32, 16, 16)


class AWQMarlinMlxQuantLinear(_MlxHolder):
    """Holds an AWQ Marlin checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.MARLIN: 0}, (4, 8), G32, BOTH, BOTH, INT32, 8, 8)


class AwqGemvFastMlxQuantLinear(_MlxHolder):
    """Holds an AWQ GEMV_FAST checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.GEMV_FAST: 0}, (4,), G16, BOTH, BOTH, INT16, 64, 8)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return gemv_zeros_width_reasons(problem)


class AwqGemvMlxQuantLinear(_MlxHolder):
    """Holds an AWQ GEMV checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.GEMV: 0}, (4,), (-1, 64, 128), BOTH, BOTH, INT32, 32, 64)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return gemv_zeros_width_reasons(problem)


class AwqMlxQuantLinear(_MlxHolder):
    """Holds an AWQ GEMM checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.GEMM: 0}, (2, 3, 4, 5, 6, 7, 8), G16, NO, BOTH, INT32, 8, 8)


class BitsAndBytesMlxQuantLinear(_MlxHolder):
    """Holds a bitsandbytes checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.BITSANDBYTES: 0}, (4, 8), None, None, None, ANY_INT, 1, 1)


class FP8MlxQuantLinear(_MlxHolder):
    """Holds an FP8 checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.FP8: 0}, (8,), None, None, None, ANY_INT, 1, 1)


class GGUFMlxQuantLinear(_MlxHolder):
    """Holds a GGUF checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.GGUF: 0}, (1, 2, 4, 5, 6, 8), None, None, None, (torch.int8, torch.int16, torch.int32),
                  32, 8)


class GPTQBitBLASMlxQuantLinear(_MlxHolder):
    """Holds a GPTQ BitBLAS checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.BITBLAS: 0}, (2, 4, 8), G32, NO, BOTH, INT32, 32, 32)


class GPTQMarlinMlxQuantLinear(_MlxHolder):
    """Holds a GPTQ Marlin checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.MARLIN: 0}, (4, 8), G32, NO, YES, INT32, 32, 32)


class LLMAwqMlxQuantLinear(_MlxHolder):
    """Holds an LLM-AWQ checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.LLM_AWQ: 0}, (4,), G16, BOTH, BOTH, INT16, 64, 8)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return gemv_zeros_width_reasons(problem)


class MlxQuantLinear(_MlxHolder):
    """Holds a GPTQ / GPTQ_V2 / GPTQ_P checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.GPTQ: 0, FORMAT.GPTQ_V2: 0, FORMAT.GPTQ_P: 0}, (2, 3, 4, 5, 6, 7, 8),
                  (-1, 16, 32, 64, 128, 256, 512, 1024), NO, BOTH, INT32, 32, 32)


class ParoMlxQuantLinear(_MlxHolder):
    """Holds a ParoQuant checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.PAROQUANT: 0}, (4,), G16, BOTH, YES, INT32, 32, 8)


class QQQMlxQuantLinear(_MlxHolder):
    """Holds a QQQ checkpoint for conversion to an MLX quantized module."""

    caps = holder({FORMAT.QQQ: 0}, (4,), (-1, 128), BOTH, YES, INT32, 64, 64)
