"""How a checkpoint quantizes a layer's inputs at run time (W8A8, W4A8, W4A4), and that quantization itself.

An ``ActQuant`` is part of a layer's ``Scheme``: it is what the numbers mean, not a kernel choice. A kernel
that multiplies quantized activations natively (an FP8 tensor-core GEMM) realises it inside; every other
kernel gets the inputs through ``quantize_dequantize`` first, so a W8A8 checkpoint computes the same
thing on any device. The arithmetic is compressed-tensors' own (``forward_quantize``), operation by
operation in the activation dtype: symmetric ``scale = amax / (range / 2)`` (E4M3: 448; int8: 127.5),
a zero scale replaced by the dtype's eps, ``q = round(clamp(x / scale))`` and ``q * scale``; NVFP4's group
scales ``e4m3(global * amax / 6)`` divided by the global scale in float32.

The one knowing departure: compressed-tensors reduces a 2-D input's "token" strategy over the whole
tensor (its reduction keeps dims 0 and 1); qlinear, like vLLM, scales every row of the flattened input.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from .floats import Element, decode, encode


class ActStrategy(str, Enum):
    """Which inputs share one activation scale."""

    TOKEN = "token"
    TENSOR = "tensor"
    GROUP = "group"
    TENSOR_GROUP = "tensor_group"  # NVFP4: group scales under a per-tensor global scale


class ActScales(str, Enum):
    """Where the activation scales come from."""

    DYNAMIC = "dynamic"  # computed from each input
    STATIC = "static"  # one calibrated ``input_scale`` tensor in the checkpoint
    LOCAL = "local"  # NVFP4: group scales computed per input under a calibrated ``input_global_scale``


@dataclass(frozen=True)
class ActQuant:
    """Activation quantization of one layer: element (None = integer), bits, strategy, scale source."""

    bits: int
    element: Element | None
    strategy: ActStrategy
    scales: ActScales
    group_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", ActStrategy(self.strategy))
        object.__setattr__(self, "scales", ActScales(self.scales))
        if self.element is not None:
            object.__setattr__(self, "element", Element(self.element))
        problem = unsupported(self)
        if problem:
            raise ValueError(f"activation quantization {self.describe()}: {problem}")

    def describe(self) -> str:
        kind = f"int{self.bits}" if self.element is None else f"{self.element.value}"
        group = f" group {self.group_size}" if self.group_size else ""
        return f"{kind} per-{self.strategy.value}{group} {self.scales.value}"

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """Checkpoint tensors this activation quantization reads (calibrated scales)."""
        return {ActScales.STATIC: ("input_scale",), ActScales.LOCAL: ("input_global_scale",)}.get(self.scales, ())


def unsupported(act: ActQuant) -> str:
    """Why ``act`` cannot be realised here, or ''."""
    if act.element is None:
        if act.bits != 8:
            return f"integer activations of {act.bits} bits are not implemented (int8 is)"
        if act.strategy not in (ActStrategy.TOKEN, ActStrategy.TENSOR):
            return "int8 activations are realised per token or per tensor only"
        return ""
    if act.element is Element.E2M1:
        if act.strategy is not ActStrategy.TENSOR_GROUP or act.group_size != 16 or act.scales is not ActScales.LOCAL:
            return "FP4 activations are realised as NVFP4 only (groups of 16, local scales under a global one)"
        return ""
    if act.element is not Element.E4M3:
        return "FP8 activations are realised in E4M3 only"
    if act.strategy is ActStrategy.GROUP and not act.group_size:
        return "a group strategy needs a group size"
    if act.strategy is ActStrategy.TENSOR_GROUP or act.scales is ActScales.LOCAL:
        return "FP8 activations take dynamic or static scales per token, tensor or group"
    if act.scales is ActScales.STATIC and act.strategy is not ActStrategy.TENSOR:
        return "static FP8 activation scales are per tensor"
    return ""


def _amax(xs: torch.Tensor, act: ActQuant) -> torch.Tensor:
    """Per-scale-unit absolute maximum, shaped to broadcast against ``xs`` (``[M, K]`` or ``[M, G, g]``)."""
    a = xs.abs()
    if act.strategy is ActStrategy.TOKEN:
        return a.amax(dim=-1, keepdim=True)
    if act.strategy is ActStrategy.TENSOR:
        return a.amax().reshape((1,) * xs.dim())
    return a.amax(dim=-1, keepdim=True)


def quantize_dequantize(x: torch.Tensor, act: ActQuant, input_scale: torch.Tensor | None = None,
                        input_global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` as the checkpoint's activation quantization sees it (in x.dtype; see the module docstring)."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k)
    grouped = act.strategy in (ActStrategy.GROUP, ActStrategy.TENSOR_GROUP)
    if grouped and k % act.group_size:
        raise ValueError(f"input: {k} features are not a multiple of the activation group size {act.group_size}")
    xs = x2.reshape(x2.shape[0], -1, act.group_size) if grouped else x2
    if act.element is Element.E2M1:
        return _nvfp4(xs, input_global_scale).reshape(x.shape)
    half_range = 127.5 if act.element is None else act.element.max
    lo, hi = (-128.0, 127.0) if act.element is None else (-act.element.max, act.element.max)
    if act.scales is ActScales.STATIC:
        if input_scale is None:
            raise ValueError("input_scale: this layer's activations have a static scale, but none was loaded")
        scale = input_scale.to(x.dtype).reshape((1,) * xs.dim())
    else:
        scale = _amax(xs, act) / torch.tensor(half_range, dtype=x.dtype)
        scale = torch.where(scale == 0, torch.finfo(x.dtype).eps, scale)
    y = torch.clamp(xs / scale, lo, hi)
    q = torch.round(y) if act.element is None else y.to(torch.float8_e4m3fn).to(x.dtype)
    return (q * scale).reshape(x.shape)


def _nvfp4(xs: torch.Tensor, input_global_scale: torch.Tensor | None) -> torch.Tensor:
    """NVFP4 activations (groups of 16): ``s = e4m3(global * amax / 6)`` (0 -> 0.125), ``e2m1(x / (s / global))``."""
    if input_global_scale is None:
        raise ValueError("input_global_scale: NVFP4 activations need the calibrated global scale, none was loaded")
    g = input_global_scale.to(torch.float32).reshape(1)
    local = g * (xs.abs().amax(dim=-1, keepdim=True) / torch.tensor(6.0, dtype=xs.dtype))
    s8 = local.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)
    scale = torch.where(s8 == 0, 0.125, s8) / g
    q = decode(encode(torch.clamp(xs / scale, -6.0, 6.0), Element.E2M1), Element.E2M1)
    return (q * scale).to(xs.dtype)
