"""Plan the modules of an EXL2 checkpoint (exllamav2's ``quant_method: "exl2"`` in config.json).

A quantized module holds ``q_weight``, ``q_invperm``, ``q_scale``, ``q_scale_max``, ``q_groups`` (and
optionally ``q_perm`` and ``bias``; ``layouts/exl2.py``). Its shape comes from ``q_invperm`` (K) and
``q_weight`` (N, as stored: exllamav2 pads N to a multiple of 32 when quantizing). The per-group bit widths
and row counts are in the *contents* of ``q_groups``, so that small tensor is read here (the only one).

The config's ``bits`` is the model's average width (a float such as 4.65); each layer's own widths are in
its ``Exl2Params``, and ``Scheme.bits`` is the layer's widest group. ``head_bits`` covers ``lm_head``,
which exllamav2 quantizes like every other linear layer, so it is planned the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..enums import FORMAT, METHOD
from ..layouts import exl2
from ..spec import ConfigError, QuantizeConfig, Scheme
from .module_plan import ModulePlan, checked_plan
from .safetensors_io import CheckpointError, TensorInfo, read_tensor

MARKERS = frozenset({"q_weight", "q_groups"})


def read_config(raw: Mapping[str, Any], where: str) -> QuantizeConfig:
    """The checkpoint's config; ``bits`` (the average, a float) is kept in ``extra`` with the rest."""
    if raw.get("quant_method") != METHOD.EXL2.value:
        raise CheckpointError(f"{where}: quant_method {raw.get('quant_method')!r} is not exl2")
    bits = raw.get("bits")
    if bits is not None and (not isinstance(bits, (int, float)) or not 2 <= bits <= 8):
        raise CheckpointError(f"{where}: bits {bits!r}: expected the average bit width, a number in 2..8")
    try:
        return QuantizeConfig(bits=8, group_size=-1, method=METHOD.EXL2, checkpoint_format=FORMAT.EXL2,
                              extra=dict(raw))
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{where}: {err}") from None


def plan_module(name: str, leaves: Mapping[str, TensorInfo], where: str) -> ModulePlan:
    """Resolve and check one EXL2 module; raises listing every problem, each naming the tensor."""
    qw, inv, qg = leaves.get("q_weight"), leaves.get("q_invperm"), leaves.get("q_groups")
    for leaf, info, want in (("q_weight", qw, "a 2-D [rows, out_features] int32"),
                             ("q_invperm", inv, "a 1-D [in_features] integer"),
                             ("q_groups", qg, "a 1-D [2 * groups] int16")):
        if info is None or len(info.shape) != (2 if leaf == "q_weight" else 1):
            found = "nothing" if info is None else info.describe()
            raise CheckpointError(f"{name}.{leaf}: expected {want} tensor, found {found}")
    k, n = inv.shape[0], qw.shape[1]
    try:
        params = exl2.params_from(read_tensor(qg), qw.shape[0], k, stored_perm="q_perm" in leaves)
        scheme = Scheme(bits=params.max_bits, group_size=-1, in_features=k, out_features=n, method=METHOD.EXL2,
                        format=FORMAT.EXL2, layout_params=params)
        expected = exl2.checkpoint_shapes(params, n)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: in_features {k} (q_invperm), out_features {n} (q_weight): {err}") from None
    widths = "/".join(str(b) for b in sorted(set(params.group_bits), reverse=True))
    what = f"exl2 {widths}-bit groups, in_features {k} out_features {n}, from {where}"
    spec = {leaf: (shape, exl2.INDEX_DTYPES if leaf in ("q_invperm", "q_perm") else (dtype,))
            for leaf, (shape, dtype) in expected.items()}
    return checked_plan(name, leaves, scheme, spec, what)


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], raw: Mapping[str, Any], where: str
                 ) -> tuple[QuantizeConfig, dict[str, ModulePlan], dict[str, TensorInfo], list[str]]:
    """The config, every EXL2 module, no set-aside tensors, and every problem found."""
    config = read_config(raw, where)
    modules: dict[str, ModulePlan] = {}
    errors: list[str] = []
    for mod in sorted(m for m, leaves in groups.items() if MARKERS & leaves.keys()):
        try:
            modules[mod] = plan_module(mod, groups[mod], where)
        except CheckpointError as err:
            errors.append(str(err))
    return config, modules, {}, errors


__all__ = ["plan_modules", "read_config"]
