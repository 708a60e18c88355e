"""The MLX checkpoint holders of the reference: a checkpoint held in Torch until it moves to MLX.

GPTQModel's ``*MlxQuantLinear`` classes hold one method's tensors (AUTO priority 0, MPS) and raise in forward;
converting the model gives MLX modules. Each holder here keeps its format's buffers (the bases the exact Torch
kernels use: GPTQ v1/v2/planar, AWQ GEMM/GEMV/GEMV_FAST/LLM-AWQ, BitBLAS), refuses a Torch forward saying what to
do instead, and ``to_mlx()`` returns the MLX module holding the same weight exactly (``mlx_module.py``): mlx's
own ``QuantizedLinear``, or for groups of 16 two group-32 products over the even and odd half-groups. A weight
MLX cannot hold exactly (act-order, 7-bit codes, a ``-scale * zero`` float16 cannot represent) is refused by
``mlx_convert.from_affine``, naming the first group.

``GGUFMlxQuantLinear`` takes the GGML types with an exact ``scale * code + offset`` form per 32 (or 16) values and
gives them float32 MLX scales and biases: the decoder's own float32 arithmetic.

The Marlin holders take a ``format: marlin`` config's modules as GPTQModel's holders read them (GPTQ v1 or AWQ GEMM
tensors, ``checkpoint/plan_marlin.py``); ``ParoMlxQuantLinear`` puts the ParoQuant input rotation, written in mlx
ops, in front of the AWQ product; ``QQQMlxQuantLinear`` quantizes activations to int8 and sums exactly, as
``QQQTorchLinear`` does. bitsandbytes and FP8 have no exact MLX quantized form: their modules decode the codes
inside each call as the producers dequantize (a transient array) and multiply.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import torch

from ..blockfloat import ScaleRule
from ..caps import Caps, Problem
from ..enums import BACKEND, FORMAT, METHOD
from ..layouts import gguf
from ..layouts.gguf.affine16 import AFFINE16_BITS, affine16
from ..layouts.gguf.affine32 import AFFINE32_BITS, affine32
from ..spec import Scheme
from ..target import Target
from .awq_base import AwqQuantLinear
from .bitblas import BitblasQuantLinear
from .bnb_base import BnbQuantLinear
from .float_base import FloatQuantLinear
from .gguf_torch import GGUFQuantLinear
from .gptq_base import GPTQQuantLinear
from .paro_base import ParoQuantBase
from .planned import mlx as declared
from .planned.awq import gemv_zeros_width_reasons
from .qqq import QQQQuantLinear, int8_cols


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
        return self.mlx_module()

    def mlx_module(self) -> Any:
        """The integer-affine weight as mlx's ``QuantizedLinear`` (groups of 16: ``Group16Linear``)."""
        from ..mlx_convert import from_affine
        from ..mlx_module import group16_linear, quantized_linear

        bias = getattr(self, "bias", None)
        q = self.affine()
        if q.group_size == 16:
            return group16_linear(q, bias)
        return quantized_linear(from_affine(q), bias)


class _GemvZeros:
    """The GEMV-family AWQ layouts' rule on zero-point widths (their declarations' runtime check)."""

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return gemv_zeros_width_reasons(problem)


class MlxQuantLinear(MlxHolder, GPTQQuantLinear):
    """Holds GPTQ / GPTQ_V2 / GPTQ_P tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly."""

    caps = declared.MlxQuantLinear.caps


class AwqMlxQuantLinear(MlxHolder, AwqQuantLinear):
    """Holds AWQ GEMM tensors for MLX: to_mlx() gives mlx's QuantizedLinear (groups of 16: two products), exactly."""

    caps = declared.AwqMlxQuantLinear.caps


class AwqGemvMlxQuantLinear(MlxHolder, _GemvZeros, AwqQuantLinear):
    """Holds AWQ GEMV tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly (no Torch forward)."""

    caps = declared.AwqGemvMlxQuantLinear.caps


class AwqGemvFastMlxQuantLinear(MlxHolder, _GemvZeros, AwqQuantLinear):
    """Holds AWQ GEMV_FAST tensors for MLX: to_mlx() gives mlx's QuantizedLinear (groups of 16: two products)."""

    caps = declared.AwqGemvFastMlxQuantLinear.caps


class LLMAwqMlxQuantLinear(MlxHolder, _GemvZeros, AwqQuantLinear):
    """Holds LLM-AWQ tensors for MLX: to_mlx() gives mlx's QuantizedLinear (groups of 16: two products), exactly."""

    caps = declared.LLMAwqMlxQuantLinear.caps


class GPTQBitBLASMlxQuantLinear(MlxHolder, BitblasQuantLinear):
    """Holds GPTQ BitBLAS tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly (no Torch forward)."""

    caps = declared.GPTQBitBLASMlxQuantLinear.caps
    method = METHOD.GPTQ


class AWQBitBLASMlxQuantLinear(MlxHolder, BitblasQuantLinear):
    """Holds AWQ BitBLAS tensors for MLX: to_mlx() gives mlx's QuantizedLinear, exactly (no Torch forward)."""

    caps = declared.AWQBitBLASMlxQuantLinear.caps
    method = METHOD.AWQ


class _MarlinLayout:
    """A ``format: marlin`` config's modules as GPTQModel's Marlin holders read them: GPTQ v1 (AWQ: GEMM) tensors,
    held under that layout's scheme (``checkpoint/plan_marlin.py``)."""

    layout_format: ClassVar[FORMAT]

    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16) -> None:
        if scheme.format is FORMAT.MARLIN:
            scheme = replace(scheme, format=self.layout_format)
        super().__init__(scheme, bias=bias, dtype=dtype)  # type: ignore[call-arg]


class GPTQMarlinMlxQuantLinear(MlxHolder, _MarlinLayout, GPTQQuantLinear):
    """Holds a GPTQ Marlin-config module (GPTQ v1 tensors) for MLX: to_mlx() gives mlx's QuantizedLinear, exactly."""

    caps = declared.GPTQMarlinMlxQuantLinear.caps
    layout_format = FORMAT.GPTQ


class AWQMarlinMlxQuantLinear(MlxHolder, _MarlinLayout, AwqQuantLinear):
    """Holds an AWQ Marlin-config module (GEMM tensors) for MLX: to_mlx() gives mlx's QuantizedLinear, exactly."""

    caps = declared.AWQMarlinMlxQuantLinear.caps
    layout_format = FORMAT.GEMM


class GGUFMlxQuantLinear(MlxHolder, GGUFQuantLinear):
    """Holds GGUF blocks for MLX: the affine types (Q4_0..Q8_0, K-quants, IQ4) as mlx modules with float32 scales."""

    caps = declared.GGUFMlxQuantLinear.caps
    qtypes = frozenset(gguf.ggml_type(name) for name in (*AFFINE32_BITS, *AFFINE16_BITS))

    def mlx_module(self) -> Any:
        """Per 32 values (16 for Q2_K, Q3_K, Q6_K) the blocks' exact float32 ``scale * code + offset``
        (``layouts/gguf/affine32.py``, ``affine16.py``) as MLX scales and biases: ``mx.dequantize`` then computes
        the decoder's own float32 operations (the same values; a zero may come out +0 where ggml gives -0). Float16
        scales would not do: MLX rounds ``scale * code`` to the scales' dtype, which ggml does not. So the module
        computes in float32 (float16 inputs give float32 outputs)."""
        from ..layouts.mlx import MlxWeight
        from ..mlx_convert import MlxConversionError
        from ..mlx_module import Group16Linear, quantized_linear

        name, k, block = self.qtype.name, self.in_features, self.type_info.block_size
        if k % block:
            raise MlxConversionError(f"in_features: {name} rows of whole {block}-value blocks convert to MLX; got "
                                     f"{k} (a padded last block has no MLX form)")
        blocks = self.blocks().cpu()
        bias = self.bias
        codes, scales, offsets = (affine32 if name in AFFINE32_BITS else affine16)(blocks, name, k)
        if name in AFFINE32_BITS:
            return quantized_linear(MlxWeight(codes, scales, offsets, AFFINE32_BITS[name], 32), bias)
        bits = AFFINE16_BITS[name]
        even, odd = (MlxWeight(codes, scales[:, h::2], offsets[:, h::2], bits, 32) for h in (0, 1))
        return Group16Linear(even, odd, bias)


class ParoMlxQuantLinear(MlxHolder, ParoQuantBase):
    """Holds ParoQuant tensors for MLX: to_mlx() gives the input rotation then mlx's QuantizedLinear, exactly."""

    caps = declared.ParoMlxQuantLinear.caps

    def mlx_module(self) -> Any:
        """``RotatedLinear``: this layer's rotation (maps, cos/sin formed per activation dtype as the Torch kernel
        forms them) around the AWQ product's MLX module."""
        from ..layouts import paroquant
        from ..mlx_module import ROTATION_DTYPES, RotatedLinear

        inner = MlxHolder.mlx_module(self)
        self.ensure_prepared()
        plan = self._rotation
        maps = [] if plan.identity else [m.cpu() for m in plan.maps]
        cos_sin = {d: paroquant.cos_sin(self.theta.cpu(), d) for d in ROTATION_DTYPES}
        return RotatedLinear(maps, cos_sin, self.channel_scales.cpu(), inner)


class QQQMlxQuantLinear(MlxHolder, QQQQuantLinear):
    """Holds QQQ tensors for MLX: to_mlx() gives int8 activations times the int8 weight, as QQQTorchLinear computes."""

    caps = declared.QQQMlxQuantLinear.caps

    def mlx_module(self) -> Any:
        """``Int8ActLinear`` over the int8 weight the Torch kernel multiplies (``qqq.int8_cols``)."""
        from ..mlx_module import Int8ActLinear

        self.ensure_prepared()
        k, gs = self.in_features, self.scheme.group_size
        w8 = int8_cols(self._rt_words.cpu(), None if self._rt_sg is None else self._rt_sg.cpu(), k, gs).t()
        return Int8ActLinear(w8.contiguous(), self._rt_sc.cpu(), self.bias)


class BitsAndBytesMlxQuantLinear(MlxHolder, BnbQuantLinear):
    """Holds bitsandbytes tensors for MLX: to_mlx() decodes NF4/FP4 (or LLM.int8) per call as bitsandbytes does."""

    caps = declared.BitsAndBytesMlxQuantLinear.caps

    def mlx_module(self) -> Any:
        """``TableLinear`` (4-bit: the code table times the float32 block absmax) or ``Int8RowLinear``."""
        from ..bnb_weight import BnbInt8Weight, code_table
        from ..mlx_module import Int8RowLinear, TableLinear

        w = self.bnb_weight()
        if isinstance(w, BnbInt8Weight):
            return Int8RowLinear(w.codes, w.scb, self.bias)
        return TableLinear(w.codes, code_table(w.quant_type), w.absmax_values(), w.blocksize, False, self.bias)


class FP8MlxQuantLinear(MlxHolder, FloatQuantLinear):
    """Holds FP8 tensors for MLX: to_mlx() decodes the codes per call (value table, block factors) as the producer."""

    caps = declared.FP8MlxQuantLinear.caps

    def mlx_module(self) -> Any:
        """``TableLinear`` over the float8 value table and the float32 ``[bn, bk]`` block factors."""
        from ..layouts import float_layouts
        from ..mlx_module import TableLinear

        self.ensure_prepared()
        w = self.float_weight()
        codes = self.codes_rows(0, self.out_features).cpu()
        divide = self.rule() is ScaleRule.DIVIDE
        return TableLinear(codes, self._table.cpu(), w.scale_values(), float_layouts.block_of(self.scheme), divide,
                           self.bias)


KERNELS = (MlxQuantLinear, AwqMlxQuantLinear, AwqGemvMlxQuantLinear, AwqGemvFastMlxQuantLinear, LLMAwqMlxQuantLinear,
           GPTQBitBLASMlxQuantLinear, AWQBitBLASMlxQuantLinear, GPTQMarlinMlxQuantLinear, AWQMarlinMlxQuantLinear,
           GGUFMlxQuantLinear, ParoMlxQuantLinear, QQQMlxQuantLinear, BitsAndBytesMlxQuantLinear, FP8MlxQuantLinear)
