"""Whole-model helpers: swap every ``nn.Linear`` of a model for a quantized, packed qlinear layer.

Data-free (RTN) on purpose: it needs no calibration set, so any model can be tried in seconds and the
kernels, formats and selector get exercised on real weight distributions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .affine import quantize_rtn
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
    """Replace every ``nn.Linear`` in ``model`` (in place) by ``QuantLinear.create(quantize_rtn(weight))``.

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
        layer = QuantLinear.create(q, format=format, backend=backend, device=device, dtype=dtype, bias=bias)
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
