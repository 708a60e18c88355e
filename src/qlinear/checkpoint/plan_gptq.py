"""Planning GPTQ- and AWQ-layout modules from headers: GPTQModel's ``dynamic`` per-module rules, the shapes the
tensors imply, and the one loop every GPTQ-family planner (GPTQ / AWQ, QQQ, Marlin) runs over a checkpoint.

Kept apart from ``plan`` (which dispatches on the config's method) so the family planners import it without a
circle back to the dispatcher.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import torch

from ..enums import FORMAT, METHOD
from ..layouts import awq, gptq
from ..spec import ConfigError, QuantizeConfig
from .module_plan import ModulePlan, bias_errors
from .safetensors_io import CheckpointError, TensorInfo

#: Leaf names that mark a module as quantized (``scales`` alone does not: plenty of float modules have one).
MARKERS = frozenset({"qweight", "qzeros", "g_idx", "scaled_zeros"})
PlanOne = Callable[[str, Mapping[str, TensorInfo], QuantizeConfig, str], ModulePlan]


def module_config(config: QuantizeConfig, name: str) -> QuantizeConfig | None:
    """``config`` with GPTQModel's ``dynamic`` rule for ``name`` applied (first match wins; ``-:`` = not quantized)."""
    rules = config.extra.get("dynamic") or {}
    if not isinstance(rules, Mapping):
        raise CheckpointError(f"dynamic: expected an object mapping module patterns to overrides, found {rules!r}")
    for pattern, override in rules.items():
        raw = pattern[2:] if pattern.startswith(("-:", "+:")) else pattern
        try:
            hit = re.match(raw, name)
        except re.error as err:
            raise CheckpointError(f"dynamic rule {pattern!r}: not a valid regular expression ({err})") from None
        if not hit:
            continue
        if pattern.startswith("-:"):
            return None
        if override is not None and not isinstance(override, Mapping):
            raise CheckpointError(f"dynamic rule {pattern!r}: expected an object of overrides, found {override!r}")
        fields = {k: override[k] for k in ("bits", "group_size", "sym", "desc_act") if k in (override or {})}
        try:
            return dataclasses.replace(config, **fields)
        except (ConfigError, ValueError) as err:
            raise CheckpointError(f"{name}: dynamic rule {pattern!r}: {err}") from None
    return config


def _dim(info: TensorInfo, rank: int, axis: int, what: str) -> int:
    if len(info.shape) != rank:
        raise CheckpointError(f"{info.name}: expected a {rank}-D tensor {what}, found {info.describe()}")
    return info.shape[axis]


def _infer_shape(fmt: FORMAT, t: Mapping[str, TensorInfo]) -> tuple[int, int]:
    """(in_features, out_features) read off the tensors that carry them without ambiguity."""
    if fmt in gptq.GPTQ_LAYOUT_FORMATS:
        return _dim(t["g_idx"], 1, 0, "[in_features]"), _dim(t["scales"], 2, 1, "[groups, out_features]")
    if fmt is FORMAT.GEMM:
        return _dim(t["qweight"], 2, 0, "[in_features, packed]"), _dim(t["scales"], 2, 1, "[groups, out_features]")
    if fmt is FORMAT.GEMV:
        return 8 * _dim(t["qweight"], 2, 1, "[out_features, in_features/8]"), _dim(t["qweight"], 2, 0, "")
    return _dim(t["qweight"], 2, 1, "[out_features/4, in_features]"), _dim(t["scales"], 2, 1, "[rows, out_features]")


def _required(config: QuantizeConfig) -> tuple[str, ...]:
    if config.method is METHOD.GPTQ:
        return ("qweight", "qzeros", "scales", "g_idx")
    return ("qweight", awq.zeros_name(config.checkpoint_format), "scales")


def plan_module(name: str, leaves: Mapping[str, TensorInfo], config: QuantizeConfig, source: str) -> ModulePlan:
    """Resolve and check one quantized module; raises listing every problem, each naming the tensor."""
    fmt, need = config.checkpoint_format, _required(config)
    what = f"a {config.method.value} {fmt.value} module needs {', '.join(need)} (+ optional bias)"
    errors = [f"{name}.{leaf}: missing ({what})" for leaf in need if leaf not in leaves]
    errors += [f"{name}.{leaf}: unexpected tensor in a quantized module ({what})"
               for leaf in sorted(leaves) if leaf not in need and leaf != "bias"]
    if errors:
        raise CheckpointError("\n".join(errors))
    k, n = _infer_shape(fmt, leaves)
    try:
        scheme = config.scheme(k, n)
        shapes = (gptq if config.method is METHOD.GPTQ else awq).checkpoint_shapes(scheme)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: in_features {k}, out_features {n} (from the tensors) with the config in "
                              f"{source}: {err}") from None
    desc = (f"{fmt.value} {scheme.bits}-bit group_size {config.group_size} pack_dtype "
            f"{str(scheme.pack_dtype).removeprefix('torch.')} in_features {k} out_features {n}, from {source}")
    for leaf, (shape, dtype) in shapes.items():
        info = leaves[leaf]
        ok = (dtype, torch.bfloat16) if leaf == "scales" and fmt is FORMAT.GEMM else (dtype,)
        if info.shape != shape or info.dtype not in ok:
            errors.append(f"{name}.{leaf}: found {info.describe()}, but the config says shape {list(shape)} "
                          f"dtype {' or '.join(map(str, ok))} ({desc})")
    errors += bias_errors(name, leaves, n)
    if errors:
        raise CheckpointError("\n".join(errors))
    return ModulePlan(name, scheme, dict(leaves))


def quantized_config(config: QuantizeConfig, name: str, source: str, what: str = "quantized") -> QuantizeConfig:
    """``module_config``, raising when a ``-:`` rule says a module that holds ``what`` tensors is not quantized."""
    cfg = module_config(config, name)
    if cfg is None:
        raise CheckpointError(f"{name}: holds {what} tensors but a '-:' dynamic rule in {source} says it is not "
                              "quantized")
    return cfg


def plan_marked(groups: Mapping[str, Mapping[str, TensorInfo]], config: QuantizeConfig, source: str,
                markers: frozenset[str], plan_one: PlanOne, what: str = "quantized"
                ) -> tuple[dict[str, ModulePlan], list[str]]:
    """Every module holding one of ``markers``, planned by ``plan_one`` under its dynamic rule, and every problem
    found (GPTQ / AWQ here; QQQ shares it)."""
    modules: dict[str, ModulePlan] = {}
    errors: list[str] = []
    for mod in sorted(m for m, leaves in groups.items() if markers & leaves.keys()):
        try:
            modules[mod] = plan_one(mod, groups[mod], quantized_config(config, mod, source, what), source)
        except CheckpointError as err:
            errors.append(str(err))
    return modules, errors


