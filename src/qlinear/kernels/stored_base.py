"""The shared base of layers whose checkpoint tensors are kept exactly as stored and are not integer-affine codes
(VPTQ codebooks, EXL3 trellises): checkpoint buffers by their checkpoint names, validated loading, runtime slots."""

from __future__ import annotations

from typing import ClassVar

import torch

from ..spec import Scheme
from .base import QuantLinear


class StoredTensorsLinear(QuantLinear):
    """Subclasses name their runtime slots (``RUNTIME``), what their codes are (``FORM``, for the refusal of an
    affine form), and implement ``tensors()`` and ``validate_tensors()``."""

    RUNTIME: ClassVar[tuple[str, ...]] = ()
    FORM: ClassVar[str] = ""
    raw_packing = False  # the weights come from their producer's checkpoint, not from affine codes

    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16) -> None:
        super().__init__(scheme, bias=bias, dtype=dtype)
        for name in self.RUNTIME:
            self.register_buffer(name, None, persistent=False)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors by their checkpoint names (bias excluded)."""
        raise NotImplementedError

    def validate_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Raise ``ValueError`` naming the tensor unless ``tensors`` fit this layer's scheme."""
        raise NotImplementedError

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [*self.tensors().values(), self.bias]

    def load_tensors(self, tensors: dict[str, torch.Tensor], bias: torch.Tensor | None = None) -> None:
        """Fill the buffers from checkpoint-named tensors (validated first)."""
        self.validate_tensors(tensors)
        self.write_checkpoint({name: tensors[name] for name in self.tensors()}, bias)

    def affine(self) -> object:
        raise ValueError(f"{self.FORM}, not integer-affine codes: no AffineWeight form")
