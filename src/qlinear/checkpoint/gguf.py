"""GGUF files as layers: every quantized 2-D ``*.weight`` becomes a selected GGUF kernel (via ``qlinear.gguf_file``).

Float tensors (F32, F16, BF16: norms, often embeddings and the output head) are not quantized modules,
just as a safetensors checkpoint's float tensors are not: they are left out, as with safetensors.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..enums import BACKEND
from ..kernels.base import QuantLinear
from ..layouts.gguf import GGMLType
from ..select import NoKernelError
from .safetensors_io import CheckpointError

FLOAT_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})


def load_gguf_layers(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
                     backend: BACKEND | str = BACKEND.AUTO,
                     affine_runtime: bool | None = None) -> dict[str, QuantLinear]:
    """``{tensor name without ".weight": prepared layer}`` for every quantized 2-D weight of a GGUF file
    (``affine_runtime``: see ``GGUFFile.linear``)."""
    from ..gguf_file import read_gguf

    f = read_gguf(path)
    out: dict[str, QuantLinear] = {}
    for name, t in f.layers().items():
        if t.type in FLOAT_TYPES:
            continue
        try:
            out[name] = f.linear(name, backend=str(BACKEND(backend).value), device=device, dtype=dtype,
                                 affine_runtime=affine_runtime)
        except NoKernelError as err:
            raise CheckpointError(f"{name}: {err}") from err
    return out
