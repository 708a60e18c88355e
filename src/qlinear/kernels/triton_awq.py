"""Triton GPU kernels for AWQ GEMM checkpoints (``AwqGEMMTritonLinear``).

The same kernels and runtime layout as ``TritonV2Linear``: ``prepare()`` decodes the AWQ words
(packed along N with the nibble interleave) to the canonical weight once and re-packs them along K,
so the interleave costs nothing per forward. ``state_dict`` stays the AWQ GEMM checkpoint layout.
"""

from __future__ import annotations

from .awq_base import AwqQuantLinear
from .planned.awq import AwqGEMMTritonLinear as _Declared
from .triton_gptq import TritonQuantMixin


class AwqGEMMTritonLinear(TritonQuantMixin, AwqQuantLinear):
    """AWQ GEMM qweight/qzeros/scales run by the Triton kernels; the runtime layout is private."""

    backend = _Declared.backend
    caps = _Declared.caps


KERNELS = (AwqGEMMTritonLinear,)
