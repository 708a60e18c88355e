"""Triton kernels for float-quantized weights on CUDA: ``TritonFP8Linear`` and ``TritonFP4Linear``.

Runtime tensors are the checkpoint buffers themselves (FP8 codes viewed in their torch dtype, FP4 bytes, the
stored block scales) plus small per-block float32 factors; nothing dense is kept. Bodies and launchers live
in ``kernels/triton/fp8mm.py``, ``fp8_w8a8.py`` and ``fp4mm.py``; the variant for a call is chosen there by M.

* FP8 weight-only (W8A16): the codes are decoded in registers and multiplied with the activations in their
  own dtype (float32 accumulation).
* FP8 W8A8, when the checkpoint quantizes activations per token dynamically (``FP8_DYNAMIC``): on sm_89 and
  later the activations are quantized to E4M3 per token and multiplied on FP8 tensor cores; on older GPUs
  (no FP8 MMA) the same quantization is applied and the weight-only kernel runs.
* NVFP4 / MXFP4 weight-only: E2M1 nibbles and block scales decoded in registers (no FP4 tensor cores before
  sm_100). An NVFP4 W4A4 checkpoint's activation quantization runs first (``activations``).
"""

from __future__ import annotations

import torch

from ..activations import ActQuant, ActScales, ActStrategy, quantize_dequantize
from ..blockfloat import ScaleRule
from ..caps import Caps, Problem, archs_from
from ..enums import BACKEND, DEVICE, FORMAT
from ..floats import Element
from ..layouts import float_layouts
from ..target import Target
from .float_base import FloatQuantLinear, fp8_element_reasons

TRITON = {"triton": "triton>=3.4"}
#: FP8 tensor-core MMA (the W8A8 path) exists from Ada (sm_89) on.
FP8_MMA = archs_from((8, 9))


def _is_w8a8(act: ActQuant | None) -> bool:
    return (act is not None and act.element is Element.E4M3 and act.strategy is ActStrategy.TOKEN
            and act.scales is ActScales.DYNAMIC)


class TritonFP8Linear(FloatQuantLinear):
    """FP8 weights on CUDA: weight-only kernels, and W8A8 on FP8 tensor cores for per-token dynamic checkpoints."""

    backend = BACKEND.FP8_TRITON
    caps = Caps(formats={FORMAT.FP8: 60, FORMAT.HF_FP8: 60, FORMAT.FLOAT_QUANTIZED: 60,
                         FORMAT.NAIVE_QUANTIZED: 60},
                bits=frozenset({8}), group_sizes=None, desc_act=None, sym=None, devices=frozenset({DEVICE.CUDA}),
                dtypes=frozenset({torch.float16, torch.bfloat16}), gpu_archs=archs_from((8, 0)),
                requires_modules=TRITON)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return fp8_element_reasons(problem)

    @classmethod
    def realises(cls, act: ActQuant) -> bool:
        return _is_w8a8(act)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        act = problem.scheme.activations
        if not _is_w8a8(act):
            return ""
        caps = {d.capability for d in target.devices if d.kind is DEVICE.CUDA}
        if caps and caps <= FP8_MMA:
            return "W8A8: inputs quantized to E4M3 per token, multiplied on FP8 tensor cores"
        return "W8A8 checkpoint on a GPU without FP8 MMA: inputs quantized per token, then the weight-only kernel"

    def prepare(self) -> None:
        super().prepare()
        s = self._factors
        self._mult = (1.0 / s if self.rule() is ScaleRule.DIVIDE else s).to(torch.float32).contiguous()
        self._block = float_layouts.block_of(self.scheme)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .triton import fp8mm

        self.check_input(x, "cuda")
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features).contiguous()
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if _is_w8a8(self.scheme.activations):
            if torch.cuda.get_device_capability(x.device) in FP8_MMA:
                from .triton import fp8_w8a8

                y = fp8_w8a8.fp8_w8a8_linear(x2, self.weight, self._mult, self._block, bias)
                return y.reshape(*x.shape[:-1], self.out_features)
            x2 = quantize_dequantize(x2, self.scheme.activations)
        y = fp8mm.fp8_linear(x2, self.weight, self._mult, self._block, bias)
        return y.reshape(*x.shape[:-1], self.out_features)


class TritonFP4Linear(FloatQuantLinear):
    """NVFP4 / MXFP4 weights on CUDA, decoded in registers (weight-only)."""

    backend = BACKEND.FP4_TRITON
    caps = Caps(formats={FORMAT.NVFP4_PACK_QUANTIZED: 60, FORMAT.MXFP4_PACK_QUANTIZED: 60}, bits=frozenset({4}),
                group_sizes=None, desc_act=None, sym=None, devices=frozenset({DEVICE.CUDA}),
                dtypes=frozenset({torch.float16, torch.bfloat16}), gpu_archs=archs_from((8, 0)), in_divisible=32,
                requires_modules=TRITON)

    def prepare(self) -> None:
        super().prepare()
        glob = getattr(self, "weight_global_scale", None)
        self._global_mul = 1.0 if glob is None else float(1.0 / glob.float().item())
        self._kind = "nvfp4" if self.scheme.format is FORMAT.NVFP4_PACK_QUANTIZED else "mxfp4"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .triton import fp4mm

        self.check_input(x, "cuda")
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features).contiguous()
        bias = None if self.bias is None else self.bias.to(x.dtype)
        y = fp4mm.fp4_linear(x2, self.weight_packed, self.weight_scale, self._kind, self._global_mul, bias)
        return y.reshape(*x.shape[:-1], self.out_features)


KERNELS = (TritonFP8Linear, TritonFP4Linear)
