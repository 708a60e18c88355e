"""FP8 / FP4 weights times bfloat16 activations in qlinear's native extra (``pip install ./native``), on a CPU.

A stand-in until the extra's ``_float`` module lands: reports it missing, so the torch tiles run.
"""

from __future__ import annotations

import importlib

import torch

from ..caps import Problem
from ..target import Target

INSTALL = "pip install ./native (qlinear's native extra, built for this CPU)"


def module() -> object | None:
    try:
        return importlib.import_module("qlinear_native._float")
    except ImportError:
        return None


def linear(layer: object, x2: torch.Tensor) -> torch.Tensor | None:
    """The native kernel's product, or None when it does not apply (then the torch tiles run)."""
    return None


def describe(problem: Problem, target: Target) -> str:
    return ""
