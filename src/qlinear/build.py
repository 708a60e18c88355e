"""Build a ready layer from a canonical weight: pack it in a format, choose a kernel, prepare it."""

from __future__ import annotations

import torch

from .affine import AffineWeight
from .caps import Problem
from .enums import BACKEND, FORMAT
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
