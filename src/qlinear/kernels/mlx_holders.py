"""The MLX checkpoint holders of the integer-affine formats: a checkpoint held in Torch until it moves to MLX.

GPTQModel's ``*MlxQuantLinear`` classes hold one method's tensors (AUTO priority 0, MPS) and raise in forward;
converting the model gives MLX modules. Each holder here keeps its format's buffers (the bases the exact Torch
kernels use: GPTQ v1/v2/planar, AWQ GEMM/GEMV/GEMV_FAST/LLM-AWQ, BitBLAS), refuses a Torch forward saying what to
do instead, and ``to_mlx()`` returns the MLX module holding the same weight exactly (``mlx_module.py``): mlx's
own ``QuantizedLinear``, or for groups of 16 two group-32 products over the even and odd half-groups. A weight
MLX cannot hold exactly (act-order, 7-bit codes, a ``-scale * zero`` float16 cannot represent) is refused by
``mlx_convert.from_affine``, naming the first group.

The Marlin holders stay declared only: a Marlin-format module is re-encoded to GPTQ/AWQ words at load
(``checkpoint/plan_marlin.py``), and those words reach ``MlxQuantLinear`` / ``AwqMlxQuantLinear``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..caps import Caps, Problem
from ..enums import BACKEND, METHOD
from ..target import Target
from .awq_base import AwqQuantLinear
from .bitblas import BitblasQuantLinear
from .gptq_base import GPTQQuantLinear
from .planned import mlx as declared


class MlxHolder:
    """Mixin: the checkpoint buffers come from the format's base class; this adds the MLX side."""

    backend: ClassVar[BACKEND] = BACKEND.MLX
    caps: ClassVar[Caps]
    raw_packing = False  # a holder is loaded from a checkpoint or ``load_affine``, never packed for

    def forward(self, x: torch.Tensor) -> Any:
        raise RuntimeError(f"{type(self).__name__} holds a {self.scheme.format.value} checkpoint for MLX and does "
                           "not run in Torch: call .to_mlx() and run the MLX module it returns, or build this "
                           "layer with a Torch backend (qlinear.create_layer picks one)")

    def to_mlx(self) -> Any:
        """The MLX module with this layer's weight, exactly (needs the ``mlx`` package)."""
        import importlib.util

        if importlib.util.find_spec("mlx") is None:
            raise ImportError(f"{type(self).__name__}.to_mlx needs the mlx package (pip install mlx; on Linux its CPU "
                              "build: pip install mlx mlx-cpu)")
        from ..mlx_convert import from_affine
        from ..mlx_module import group16_linear, quantized_linear

        bias = getattr(self, "bias", None)
        q = self.affine()
        if q.group_size == 16:
            return group16_linear(q, bias)
        return quantized_linear(from_affine(q), bias)


class MlxQuantLinear(MlxHolder, GPTQQuantLinear):
    """Holds GPTQ / GPTQ_V2 / GPTQ_P tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly."""

    caps = declared.MlxQuantLinear.caps


class AwqMlxQuantLinear(MlxHolder, AwqQuantLinear):
    """Holds AWQ GEMM tensors for MLX: to_mlx() gives mlx's QuantizedLinear (groups of 16: two products), exactly."""

    caps = declared.AwqMlxQuantLinear.caps


class AwqGemvMlxQuantLinear(MlxHolder, AwqQuantLinear):
    """Holds AWQ GEMV tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly (no Torch forward)."""

    caps = declared.AwqGemvMlxQuantLinear.caps

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return declared.AwqGemvMlxQuantLinear.runtime_reasons(problem, target)


class AwqGemvFastMlxQuantLinear(MlxHolder, AwqQuantLinear):
    """Holds AWQ GEMV_FAST tensors for MLX: to_mlx() gives mlx's QuantizedLinear (groups of 16: two products)."""

    caps = declared.AwqGemvFastMlxQuantLinear.caps

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return declared.AwqGemvFastMlxQuantLinear.runtime_reasons(problem, target)


class LLMAwqMlxQuantLinear(MlxHolder, AwqQuantLinear):
    """Holds LLM-AWQ tensors for MLX: to_mlx() gives mlx's QuantizedLinear (groups of 16: two products), exactly."""

    caps = declared.LLMAwqMlxQuantLinear.caps

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return declared.LLMAwqMlxQuantLinear.runtime_reasons(problem, target)


class GPTQBitBLASMlxQuantLinear(MlxHolder, BitblasQuantLinear):
    """Holds GPTQ BitBLAS tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly (no Torch forward)."""

    caps = declared.GPTQBitBLASMlxQuantLinear.caps
    method = METHOD.GPTQ


class AWQBitBLASMlxQuantLinear(MlxHolder, BitblasQuantLinear):
    """Holds AWQ BitBLAS tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly (no Torch forward)."""

    caps = declared.AWQBitBLASMlxQuantLinear.caps
    method = METHOD.AWQ


KERNELS = (MlxQuantLinear, AwqMlxQuantLinear, AwqGemvMlxQuantLinear, AwqGemvFastMlxQuantLinear, LLMAwqMlxQuantLinear,
           GPTQBitBLASMlxQuantLinear, AWQBitBLASMlxQuantLinear)
