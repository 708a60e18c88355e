"""EXL2 layers whose runtime replaces the file's ``q_weight`` (``Exl2TritonLinear``, ``Exl2CpuLinear``).

Their runtimes keep every code, so ``q_weight`` is dropped once they are built and rebuilt from them, word for
word, whenever read or saved (``resident_codes.CodesInRuntime``); this base says which names the file has.
"""

from __future__ import annotations

import torch

from ..layouts import exl2
from .exl2 import Exl2TorchLinear, exl2_params
from .resident_codes import CodesInRuntime


class Exl2ReplacedWeight(CodesInRuntime, Exl2TorchLinear):
    """Base of the EXL2 layers whose runtime stands in for ``q_weight`` once prepared."""

    codes_buffer = "q_weight"

    def checkpoint_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return exl2.checkpoint_shapes(exl2_params(self.scheme), self.out_features)

    def checkpoint_names(self) -> tuple[str, ...]:
        return (*self.checkpoint_shapes(), "bias")
