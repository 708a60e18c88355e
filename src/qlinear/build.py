"""Build a ready layer from a canonical weight: pack it in a format, choose a kernel, prepare it."""

from __future__ import annotations

import torch

from .activations import ActQuant
from .affine import AffineWeight
from .blockfloat import FloatWeight, ScaleRule
from .caps import Problem
from .enums import BACKEND, FORMAT
from .floats import Element
from .kernels.base import QuantLinear
from .select import select
from .spec import Scheme, method_of
from .target import Target


def scheme_of(q: AffineWeight, fmt: FORMAT | str, pack_dtype: torch.dtype | None = None) -> Scheme:
    """The layer scheme a canonical weight implies when written in ``fmt``."""
    fmt = FORMAT(fmt)
    return Scheme(bits=q.bits, group_size=q.group_size, in_features=q.in_features, out_features=q.out_features,
                  sym=q.sym, desc_act=q.desc_act, method=method_of(fmt), format=fmt, pack_dtype=pack_dtype)


def create_layer(q: AffineWeight, *, format: FORMAT | str = FORMAT.GPTQ_V2, backend: BACKEND | str = BACKEND.AUTO,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
                 bias: torch.Tensor | None = None, pack_dtype: torch.dtype | None = None) -> QuantLinear:
    """Pack ``q`` as ``format``, select a kernel for ``device`` and return it prepared on that device.

    ``pack_dtype`` None means the format's own word (int16 for gemv_fast and llm-awq, else int32).

    Raises ``NoKernelError`` (carrying the explain table) when no kernel can run the layer there.
    """
    scheme = scheme_of(q, format, pack_dtype)
    target = Target.here(device)
    choice = select(Problem(scheme, dtype), target, backend)
    layer = choice.kernel(scheme, bias=bias is not None, dtype=dtype)
    layer.load_affine(q, bias)
    layer = layer.to(target.devices[0].torch_device)
    layer.prepare()
    layer.choice = choice
    return layer


def float_scheme_of(w: FloatWeight, fmt: FORMAT | str | None = None, activations: ActQuant | None = None) -> Scheme:
    """The layer scheme a float weight implies in ``fmt`` (default: the format its producers write it in:
    GPTQModel's ``fp8`` for dividing scales, compressed-tensors' naive/float-quantized FP8, NVFP4 or MXFP4)."""
    if fmt is None:
        if w.element is Element.E2M1:
            fmt = FORMAT.NVFP4_PACK_QUANTIZED if w.global_scale is not None else FORMAT.MXFP4_PACK_QUANTIZED
        elif w.rule is ScaleRule.DIVIDE:
            fmt = FORMAT.FP8
        else:
            fmt = FORMAT.NAIVE_QUANTIZED if activations is None else FORMAT.FLOAT_QUANTIZED
    fmt = FORMAT(fmt)
    return Scheme(bits=w.element.bits, group_size=min(w.block[1], w.in_features), in_features=w.in_features,
                  out_features=w.out_features, method=method_of(fmt), format=fmt, element=w.element,
                  scale_block=w.block, activations=activations,
                  per_tensor_scale=w.block == (w.out_features, w.in_features))


def create_float_layer(w: FloatWeight, *, format: FORMAT | str | None = None,
                       backend: BACKEND | str = BACKEND.AUTO, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None,
                       activations: ActQuant | None = None, input_scale: torch.Tensor | None = None,
                       input_global_scale: torch.Tensor | None = None) -> QuantLinear:
    """A prepared layer for a float-quantized weight (``float_quant.quantize_fp8`` / ``quantize_nvfp4`` / ...).

    ``activations``: the activation quantization the layer realises (W8A8, W4A4); static ones need their
    calibrated ``input_scale`` / ``input_global_scale``. Raises ``NoKernelError`` (with the explain table)
    when no kernel can run it on ``device``.
    """
    scheme = float_scheme_of(w, format, activations)
    target = Target.here(device)
    choice = select(Problem(scheme, dtype), target, backend)
    layer = choice.kernel(scheme, bias=bias is not None, dtype=dtype)
    layer.load_float(w, bias)
    with torch.no_grad():
        for name, value in (("input_scale", input_scale), ("input_global_scale", input_global_scale)):
            if name in layer._buffers and value is None:
                raise ValueError(f"{name}: the activation quantization {activations.describe()} is static; pass it")
            if value is not None:
                if name not in layer._buffers:
                    raise ValueError(f"{name}: given, but the layer's activation quantization has no such scale")
                layer._buffers[name] = value.detach().to(torch.float32).reshape(1).clone()
    layer = layer.to(target.devices[0].torch_device)
    layer.prepare()
    layer.choice = choice
    return layer
