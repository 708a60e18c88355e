"""Build a ready layer from a bitsandbytes canonical weight (``BnbWeight`` / ``BnbInt8Weight``): choose a kernel, load,
prepare. The sibling of ``build.create_float_layer``."""

from __future__ import annotations

import torch

from .bnb_weight import BnbInt8Weight, BnbWeight
from .caps import Problem
from .enums import BACKEND
from .kernels.base import QuantLinear
from .layouts.bnb import scheme_of
from .select import select
from .target import Target


def create_bnb_layer(w: BnbWeight | BnbInt8Weight, *, backend: BACKEND | str = BACKEND.AUTO,
                     device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
                     bias: torch.Tensor | None = None) -> QuantLinear:
    """A prepared layer holding ``w`` as bitsandbytes' checkpoint tensors, on ``device`` for ``dtype`` activations.

    Raises ``NoKernelError`` (with the explain table) when no kernel can run it there."""
    if not isinstance(w, (BnbWeight, BnbInt8Weight)):
        raise TypeError(f"expected a BnbWeight or BnbInt8Weight, got {type(w).__name__}")
    scheme = scheme_of(w)
    target = Target.here(device)
    choice = select(Problem(scheme, dtype), target, backend)
    layer = choice.kernel(scheme, bias=bias is not None, dtype=dtype)
    layer.load_bnb(w, bias)
    layer = layer.to(target.devices[0].torch_device)
    layer.prepare()
    layer.choice = choice
    return layer
