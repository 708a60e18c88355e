"""Plan the modules of an EXL3 checkpoint (exllamav3's converter: ``quantization_config: {"quant_method": "exl3",
"version", "bits", "head_bits", ...}`` in config.json; GPTQModel writes the same tensors).

``bits`` / ``head_bits`` are the conversion's targets (average bits, possibly fractional: exllamav3 allocates
widths per layer), so each module's width comes from its ``trellis [K/16, N/16, 16*bits]`` int16; the shape from
the same tensor. Beside it: ``suh``/``svh`` float16 (or ``su``/``sv`` int16 sign bitfields), at most one codebook
marker (``mcg`` or ``mul1``, an int32 scalar; none: 3inst) and an optional ``bias`` (``layouts/exl3.py``).
Half-integer rates (exllamav3 >= 1.6, ``16*bits`` an odd multiple of 8) are reported as not supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from ..enums import FORMAT, METHOD
from ..layouts import exl3
from ..layouts.exl3 import Exl3Params
from ..spec import ConfigError, QuantizeConfig
from .module_plan import ModulePlan, checked_plan
from .safetensors_io import CheckpointError, TensorInfo


def read_config(raw: Mapping[str, Any], where: str) -> QuantizeConfig:
    """The checkpoint's config; ``bits`` rounded into 1..8 (the per-module widths come from the tensors)."""
    bits = raw.get("bits")
    if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 < bits <= 8:
        raise CheckpointError(f"{where}: EXL3 bits: expected a number in (0, 8], found {bits!r}")
    head = raw.get("head_bits")
    if head is not None and (isinstance(head, bool) or not isinstance(head, (int, float)) or head <= 0):
        raise CheckpointError(f"{where}: EXL3 head_bits: expected a positive number, found {head!r}")
    try:
        return QuantizeConfig(bits=min(8, max(1, round(bits))), group_size=-1, method=METHOD.EXL3,
                              checkpoint_format=FORMAT.EXL3, pack_dtype=torch.int16, extra=dict(raw))
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{where}: {err}") from None


def module_params(name: str, leaves: Mapping[str, TensorInfo]) -> Exl3Params:
    """Bits, codebook and sign storage of one module, from its tensors' names and the trellis shape."""
    tr = leaves["trellis"]
    if len(tr.shape) != 3 or tr.shape[2] % 8 or tr.dtype != torch.int16:
        raise CheckpointError(f"{name}.trellis: expected an int16 [in_features/16, out_features/16, 16*bits] "
                              f"tensor, found {tr.describe()}")
    if tr.shape[2] % 16:
        raise CheckpointError(f"{name}.trellis: {tr.shape[2] / 16} bits per weight (a half-integer rate of "
                              "exllamav3 >= 1.6) is not supported; integer widths 1..8 are")
    bits = tr.shape[2] // 16
    if not 1 <= bits <= 8:
        raise CheckpointError(f"{name}.trellis: {bits} bits per weight; EXL3 widths are 1..8")
    markers = [m for m in exl3.MARKERS if m in leaves]
    if len(markers) > 1:
        raise CheckpointError(f"{name}: both codebook markers mcg and mul1 present; a module uses one codebook")
    packed = "su" in leaves or "sv" in leaves
    if packed and ("suh" in leaves or "svh" in leaves):
        raise CheckpointError(f"{name}: mixes packed sign vectors (su/sv) with float16 scales (suh/svh); expected "
                              "one pair")
    return Exl3Params(bits, markers[0] if markers else "3inst", packed)


def plan_module(name: str, leaves: Mapping[str, TensorInfo], config: QuantizeConfig, source: str) -> ModulePlan:
    """Resolve and check one EXL3 module; raises listing every problem, each naming the tensor."""
    params = module_params(name, leaves)
    tr = leaves["trellis"]
    k, n = 16 * tr.shape[0], 16 * tr.shape[1]
    shape_problems = exl3.shape_errors(k, n)
    if shape_problems:
        raise CheckpointError(f"{name}.trellis: " + "; ".join(shape_problems))
    try:
        scheme = replace(config.scheme(k, n), bits=params.bits, layout_params=params)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: in_features {k}, out_features {n} (from trellis), {source}: {err}") from None
    what = f"exl3 {params.bits}-bit {params.codebook} in_features {k} out_features {n}, from {source}"
    expected = {leaf: (shape, (dtype,)) for leaf, (shape, dtype) in exl3.checkpoint_shapes(params, k, n).items()}
    return checked_plan(name, leaves, scheme, expected, what)


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], raw: Mapping[str, Any], where: str
                 ) -> tuple[QuantizeConfig, dict[str, ModulePlan], dict[str, TensorInfo], list[str]]:
    """The config, every module holding a ``trellis``, no set-aside tensors, and every problem found."""
    config = read_config(raw, where)
    modules: dict[str, ModulePlan] = {}
    errors: list[str] = []
    for mod in sorted(m for m, leaves in groups.items() if "trellis" in leaves):
        try:
            modules[mod] = plan_module(mod, groups[mod], config, where)
        except CheckpointError as err:
            errors.append(str(err))
    return config, modules, {}, errors


__all__ = ["plan_modules", "read_config"]
