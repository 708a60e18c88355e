"""Writing ParoQuant modules: same-format copies (checked) and the config paroquant and GPTQModel read.

A ParoQuant weight multiplies rotated inputs (channel scales and ``krot`` rounds of pairwise rotations, applied
before the product), so no GPTQ/AWQ layout holds what the layer computes: conversions to or from another format
are refused, naming the reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from .canonical import ConversionError
from .checkpoint.config_write import quantization_config
from .enums import FORMAT
from .layouts import awq, paroquant
from .layouts.tensors import check_against
from .spec import Scheme

ALLOWED = {"scales": awq.SCALE_DTYPES, "theta": paroquant.ROTATION_DTYPES,
           "channel_scales": paroquant.ROTATION_DTYPES}


def convert_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme, to: FORMAT | str,
                    pack_dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], Scheme]:
    """The module's tensors for a ``paroquant`` checkpoint (validated copies); any other pair of formats refused."""
    to = FORMAT(to)
    if scheme.format is not FORMAT.PAROQUANT or to is not FORMAT.PAROQUANT:
        raise ConversionError(f"cannot convert {scheme.format.value} to {to.value}: ParoQuant codes multiply rotated "
                              "inputs (channel scales, then krot rounds of pairwise rotations) and no other format "
                              "holds that transform; only paroquant -> paroquant copies are lossless")
    if pack_dtype not in (None, torch.int32):
        raise ConversionError(f"cannot write paroquant with pack_dtype {pack_dtype}: its AWQ GEMM words are int32")
    expected = paroquant.checkpoint_shapes(scheme)
    what = f"paroquant K={scheme.in_features} N={scheme.out_features} gs={scheme.group_size}"
    try:
        check_against(tensors, {n: (shape, ALLOWED.get(n, (dt,))) for n, (shape, dt) in expected.items()}, what)
        paroquant.check_rotation(tensors["pairs"], tensors["theta"], tensors["channel_scales"], scheme.group_size)
    except ValueError as err:
        raise ConversionError(f"cannot write paroquant: {err}") from None
    out = {name: tensors[name].detach().cpu() for name in expected}
    if tensors.get("bias") is not None:
        out["bias"] = tensors["bias"].detach().cpu()
    return out, scheme


def paro_config(schemes: Mapping[str, Scheme], version: str, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The GPTQModel-style config of these modules (bits, group size, ``format: paroquant``, ``dynamic`` rules for
    modules unlike the rest) with the one ``krot`` every module has; modules with different rotation counts
    cannot share a config."""
    counts = Counter(paroquant.params_of(s).krot for s in schemes.values())
    if len(counts) > 1:
        raise ConversionError(f"cannot write paroquant: the modules have different rotation counts "
                              f"({', '.join(f'krot {k}: {c} modules' for k, c in sorted(counts.items()))}), "
                              "and a ParoQuant config names one krot")
    base = quantization_config({n: replace(s, layout_params=None) for n, s in schemes.items()}, version, meta)
    return {**base, "krot": next(iter(counts))}
