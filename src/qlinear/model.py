"""Whole-model helpers: swap every ``nn.Linear`` of a model for a quantized, packed qlinear layer.

Data-free (RTN) on purpose: it needs no calibration set, so any model can be tried in seconds and the
kernels, formats and selector get exercised on real weight distributions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .activations import ActQuant
from .affine import quantize_rtn
from .build import create_layer
from .enums import BACKEND
from .kernels.base import QuantLinear

#: ``progress(done, total, name)`` is called after each layer is replaced.
Progress = Callable[[int, int, str], None]


def linear_names(model: nn.Module) -> list[str]:
    """Qualified names of the plain ``nn.Linear`` modules of ``model``, in definition order."""
    return [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name]


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    """Put ``module`` at the dotted path ``name`` inside ``model``."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


def quantize_linears(model: nn.Module, *, bits: int, group_size: int, sym: bool = True, format: str = "gptq_v2",
                     backend: str | BACKEND = "auto", device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32, desc_act: bool = False, clip_search: bool = False,
                     skip: tuple[str, ...] = (), progress: Progress | None = None) -> dict[str, QuantLinear]:
    """Replace every ``nn.Linear`` in ``model`` (in place) by ``create_layer(quantize_rtn(weight))``.

    Each layer goes through the selector on its own, so layers of different shapes may get different
    kernels; the returned mapping (module name -> layer) keeps each layer's ``.choice`` for reporting.
    ``dtype`` is the activation dtype the kernels will be chosen for. The rest of the model is left
    untouched: move/cast it yourself. Raises ``NoKernelError`` (with the explain table) if a layer
    has no kernel. Modules named in ``skip`` stay as they are.
    """
    names = [n for n in linear_names(model) if n not in skip]
    done: dict[str, QuantLinear] = {}
    for i, name in enumerate(names):
        lin = model.get_submodule(name)
        assert isinstance(lin, nn.Linear)
        q = quantize_rtn(lin.weight.detach(), bits=bits, group_size=group_size, sym=sym, desc_act=desc_act,
                         clip_search=clip_search)
        bias = None if lin.bias is None else lin.bias.detach()
        layer = create_layer(q, format=format, backend=backend, device=device, dtype=dtype, bias=bias)
        set_submodule(model, name, layer)
        done[name] = layer
        if progress is not None:
            progress(i + 1, len(names), name)
    return done


def move_unquantized(model: nn.Module, device: str | torch.device, dtype: torch.dtype) -> nn.Module:
    """Move/cast every parameter and floating buffer *outside* the QuantLinear layers.

    ``model.to(dtype)`` would also cast the packed layers' float16 scales and bias, which are checkpoint
    tensors and must keep their layout; this leaves them alone.
    """
    quant = {id(m) for q in model.modules() if isinstance(q, QuantLinear) for m in q.modules()}
    for m in model.modules():
        if id(m) in quant:
            continue
        for k, p in m._parameters.items():
            if p is not None:
                m._parameters[k] = nn.Parameter(p.detach().to(device=device, dtype=dtype), requires_grad=False)
        for k, b in m._buffers.items():
            if b is not None:
                m._buffers[k] = b.to(device=device, dtype=dtype if b.is_floating_point() else b.dtype)
    return model


def quantize_linears_float(model: nn.Module, *, kind: str, format: str | None = None,
                           activations: ActQuant | None = None, backend: str | BACKEND = "auto",
                           device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                           skip: tuple[str, ...] = (), progress: Progress | None = None) -> dict[str, QuantLinear]:
    """Replace every ``nn.Linear`` (but ``skip``) by a float-quantized layer, in place, like ``quantize_linears``.

    ``kind``: ``fp8`` (E4M3, one scale per output channel), ``fp8-block`` (128x128 blocks), ``nvfp4`` or
    ``mxfp4`` (``float_quant``). ``format`` defaults to the one its producers write (compressed-tensors').
    ``activations``: a dynamic activation quantization the layers realise (W8A8); None keeps weight-only.
    """
    from .build import create_float_layer
    from .float_quant import quantize_fp8, quantize_mxfp4, quantize_nvfp4

    makers = {"fp8": quantize_fp8, "fp8-block": lambda w: quantize_fp8(w, block=(128, 128)),
              "nvfp4": quantize_nvfp4, "mxfp4": quantize_mxfp4}
    if kind not in makers:
        raise ValueError(f"kind: expected one of {', '.join(makers)}, got {kind!r}")
    names = [n for n in linear_names(model) if n not in skip]
    done: dict[str, QuantLinear] = {}
    for i, name in enumerate(names):
        lin = model.get_submodule(name)
        assert isinstance(lin, nn.Linear)
        bias = None if lin.bias is None else lin.bias.detach()
        layer = create_float_layer(makers[kind](lin.weight.detach()), format=format, backend=backend, device=device,
                                   dtype=dtype, bias=bias, activations=activations)
        set_submodule(model, name, layer)
        done[name] = layer
        if progress is not None:
            progress(i + 1, len(names), name)
    return done
