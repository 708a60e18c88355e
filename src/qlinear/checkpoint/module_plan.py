"""One quantized module of a checkpoint as planned from headers: its scheme and where its tensors live.

Shared by the planners of each checkpoint family (GPTQ/AWQ in ``plan``, compressed-tensors in ``plan_ct``,
FP8 in ``plan_fp8``), with the one check they all run on a module's tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from ..spec import Scheme
from .safetensors_io import CheckpointError, TensorInfo


@dataclass(frozen=True)
class ModulePlan:
    """One quantized module: its scheme and its tensors (leaf name -> where it lives)."""

    name: str
    scheme: Scheme
    tensors: Mapping[str, TensorInfo]

    @property
    def has_bias(self) -> bool:
        return "bias" in self.tensors


def leaf_errors(name: str, leaves: Mapping[str, TensorInfo],
                expected: Mapping[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]], what: str,
                optional: Iterable[str] = ("bias",)) -> list[str]:
    """Every missing, unexpected or misshapen tensor of module ``name``, each naming the tensor.

    ``expected``: leaf -> (shape, allowed dtypes); ``optional`` leaves may be absent (bias, activation
    scales); ``what`` says what the config asks for, for the messages.
    """
    optional = set(optional)
    errors = [f"{name}.{leaf}: missing ({what})" for leaf in expected if leaf not in leaves]
    errors += [f"{name}.{leaf}: unexpected tensor in a quantized module ({what})"
               for leaf in sorted(leaves) if leaf not in expected and leaf not in optional]
    for leaf, (shape, dtypes) in expected.items():
        info = leaves.get(leaf)
        if info is not None and (info.shape != tuple(shape) or info.dtype not in dtypes):
            names = " or ".join(str(d) for d in dtypes)
            errors.append(f"{name}.{leaf}: found {info.describe()}, but the config says shape {list(shape)} "
                          f"dtype {names} ({what})")
    return errors


def bias_errors(name: str, leaves: Mapping[str, TensorInfo], out_features: int) -> list[str]:
    bias = leaves.get("bias")
    if bias is not None and (bias.shape != (out_features,) or bias.dtype is None or not bias.dtype.is_floating_point):
        return [f"{name}.bias: found {bias.describe()}, expected a floating tensor of shape [{out_features}]"]
    return []


def checked_plan(name: str, leaves: Mapping[str, TensorInfo], scheme: Scheme,
                 expected: Mapping[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]], what: str,
                 optional: Iterable[str] = ("bias",)) -> ModulePlan:
    """The module's plan, or one ``CheckpointError`` listing every missing, unexpected or misshapen tensor (the
    ``leaf_errors`` and ``bias_errors`` checks every planner runs)."""
    problems = leaf_errors(name, leaves, expected, what, optional) + bias_errors(name, leaves, scheme.out_features)
    if problems:
        raise CheckpointError("\n".join(problems))
    return ModulePlan(name, scheme, dict(leaves))
