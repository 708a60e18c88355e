"""Run a stored layout that no kernel here takes by re-encoding it, in memory and losslessly, to one that is.

AWQ gemv, gemv_fast and llm-awq hold the same integers as AWQ gemm (codes, integer zero points, float16
scales), only arranged for CUDA GEMV kernels; on a CPU nothing runs them. A loader asked for AUTO (or for a
backend that runs the gemm words) re-encodes such a module to gemm through ``convert.convert_tensors``,
which decodes the result again and refuses any difference. Nothing is written; the layer's
``choice.note`` says what happened and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from ..caps import Problem
from ..convert import ConversionError, convert_tensors, target_scheme
from ..enums import BACKEND, FORMAT
from ..select import Choice, NoKernelError, explain
from ..spec import Scheme
from ..target import Target

#: stored format -> the format a loader may re-encode it to when no kernel here runs the stored one. The
#: compressed-tensors integer layouts hold the same numbers as GPTQ v2 (codes ``q + 2**(b-1)``, true zeros,
#: per-group scales, g_idx), so every GPTQ kernel runs them; their float siblings have kernels of their own.
LOAD_REPACKS: dict[FORMAT, FORMAT] = {FORMAT.GEMV: FORMAT.GEMM, FORMAT.GEMV_FAST: FORMAT.GEMM,
                                      FORMAT.LLM_AWQ: FORMAT.GEMM, FORMAT.PACK_QUANTIZED: FORMAT.GPTQ_V2,
                                      FORMAT.NAIVE_QUANTIZED: FORMAT.GPTQ_V2, FORMAT.INT_QUANTIZED: FORMAT.GPTQ_V2,
                                      FORMAT.MARLIN: FORMAT.GPTQ_V2, FORMAT.BITBLAS: FORMAT.GPTQ_V2}


def repacked_scheme(scheme: Scheme, to: FORMAT) -> Scheme:
    """``scheme`` in format ``to`` with that format's own word type."""
    return target_scheme(scheme, to)


def choose(scheme: Scheme, dtype: torch.dtype, target: Target,
           backend: BACKEND | str = BACKEND.AUTO) -> tuple[Choice, Scheme]:
    """The kernel for a stored module and the scheme it will run as (the stored one unless re-encoded).

    Raises ``NoKernelError`` with the stored format's table when neither the stored layout nor its
    re-encoding can run here.
    """
    first = explain(Problem(scheme, dtype), target, backend)
    if first.kernel is not None:
        return first, scheme
    to = LOAD_REPACKS.get(scheme.format) if scheme.element is None else None
    if to is not None:
        alt = repacked_scheme(scheme, to)
        second = explain(Problem(alt, dtype), target, backend)
        if second.kernel is not None:
            blocked = next((f"{v.kernel.__name__}: {v.reasons[0]}" for v in first.verdicts if v.priority),
                           "no kernel takes that layout directly")
            note = (f"stored as {scheme.format.value}, which no kernel runs here ({blocked}); re-encoded to "
                    f"{to.value} in memory at load, losslessly (same codes, integer zeros and scales)")
            if scheme.activations is not None:
                note += f"; inputs quantized as the checkpoint says ({scheme.activations.describe()})"
            return replace(second, note=note), alt
    raise NoKernelError(first)


def repack_tensors(tensors: Mapping[str, torch.Tensor], stored: Scheme, run_as: Scheme) -> dict[str, torch.Tensor]:
    """The module's tensors in ``run_as``'s layout (unchanged when it is the stored one)."""
    if run_as == stored:
        return dict(tensors)
    try:
        out, _ = convert_tensors(tensors, stored, run_as.format, in_memory=True)
    except ConversionError as err:
        raise ValueError(f"cannot run {stored.format.value} as {run_as.format.value}: {err}") from None
    return out
