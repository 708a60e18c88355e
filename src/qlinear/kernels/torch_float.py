"""Portable exact kernels for float-quantized weights: ``TorchFP8Linear`` (FP8) and ``TorchFP4Linear`` (NVFP4, MXFP4).

Each forward decodes a few output rows at a time into the activation dtype, exactly as the producer
dequantizes (``FloatQuantLinear.decode_rows``), and multiplies them in; no dense weight outlives a tile.
On a CPU with qlinear's native extra (``pip install ./native``), bfloat16 inputs go through its FP8 / FP4
kernels instead: the stored codes times the activations with exact products and float32 sums.
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem
from ..enums import ALL_DEVICES, BACKEND, FORMAT
from ..target import Target
from .float_base import FloatQuantLinear, fp8_element_reasons
from .planned.float_formats import TorchFP8Linear as _DeclaredFP8
from .row_tiles import RowTileForward

#: The reference declares FP8: 15; qlinear also reads the same FP8 weights from transformers' and
#: compressed-tensors' checkpoints (deliberate widening, listed in tests/test_declarations.py).
FP8_FORMATS = {FORMAT.FP8: 15, FORMAT.HF_FP8: 15, FORMAT.FLOAT_QUANTIZED: 15, FORMAT.NAIVE_QUANTIZED: 15}


class _TorchFloat(RowTileForward, FloatQuantLinear):
    """The shared forward: row tiles decoded and multiplied (or the native extra's kernel on CPU)."""

    def _native(self, x2: torch.Tensor) -> torch.Tensor | None:
        from . import native_float

        return native_float.linear(self, x2)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        from . import native_float

        return native_float.describe(problem, target)


class TorchFP8Linear(_TorchFloat):
    """FP8 (E4M3 / E5M2) weight codes with tensor, channel, group or block scales; any device."""

    backend = BACKEND.FP8_TORCH
    caps = _DeclaredFP8.caps.but(formats=FP8_FORMATS)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return fp8_element_reasons(problem)


class TorchFP4Linear(_TorchFloat):
    """NVFP4 / MXFP4 weights (E2M1 codes in 16- or 32-value blocks): the reference's TorchFP4Linear helper."""

    backend = BACKEND.FP4_TORCH
    caps = Caps(formats={FORMAT.NVFP4_PACK_QUANTIZED: 15, FORMAT.MXFP4_PACK_QUANTIZED: 15}, bits=frozenset({4}),
                group_sizes=None, desc_act=None, sym=None, devices=ALL_DEVICES,
                dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
                pack_dtypes=frozenset({torch.int8, torch.int16, torch.int32, torch.int64}), in_divisible=2)


KERNELS = (TorchFP8Linear, TorchFP4Linear)
