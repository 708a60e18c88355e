"""Plan the modules of an mlx-lm checkpoint (MLX affine quantization; ``layouts/mlx.py``).

mlx-lm writes its config in ``config.json`` as ``"quantization": {"group_size": 64, "bits": 4, "mode": "affine"}``
(and, since 0.2x, the same dict again as ``quantization_config``). There is no ``quant_method``. A key naming a
module path overrides the defaults for that module, with a dict (``bits``, ``group_size``, ``mode``) or ``false``
(the module stays dense). A module is quantized when it stores ``scales`` (mlx-lm's own rule), and then holds
``weight`` (uint32 words), ``scales``, ``biases`` and optionally ``bias``. Modes other than ``affine`` (mxfp4,
nvfp4, mxfp8) are refused with the reason. Quantized embeddings (``embed_tokens``) are planned like any other
module: their weight is the ``[vocab, hidden]`` matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..enums import FORMAT, METHOD
from ..layouts import mlx
from ..spec import ConfigError, QuantizeConfig
from .module_plan import ModulePlan, bias_errors, leaf_errors
from .safetensors_io import CheckpointError, TensorInfo

#: Where ``read_quant_config`` says an mlx-lm config came from.
SOURCE = "config.json quantization"
TOP_KEYS = ("group_size", "bits", "mode")
#: Keys only GPTQ-family configs have: a dict holding one is not mlx-lm's.
GPTQ_KEYS = frozenset({"quant_method", "desc_act", "sym", "zero_point", "w_bit", "q_group_size", "checkpoint_format",
                       "version", "pack_dtype", "static_groups", "true_sequential"})


def is_mlx_quantization(raw: object) -> bool:
    """Does ``raw`` look like mlx-lm's ``quantization`` dict (bits and group_size, none of GPTQ's keys)?"""
    return isinstance(raw, Mapping) and "bits" in raw and "group_size" in raw and not GPTQ_KEYS & set(raw)


def _params(entry: Mapping[str, Any], where: str, default: tuple[int, int] | None = None) -> tuple[int, int]:
    mode = entry.get("mode", "affine")
    if mode != "affine":
        raise ConfigError(f"{where}: mode {mode!r}: qlinear reads MLX's affine quantization only (mxfp4 / nvfp4 / "
                          "mxfp8 checkpoints store no biases and other element formats)")
    bits = entry.get("bits", default[0] if default else None)
    gs = entry.get("group_size", default[1] if default else None)
    for name, v in (("bits", bits), ("group_size", gs)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{where}: {name} must be an integer; got {v!r}")
    errors = [e for e in mlx.params_errors(bits, gs, gs) if not e.startswith("in_features")]
    if errors:
        raise ConfigError(f"{where}: " + "; ".join(errors))
    return bits, gs


def read_config(raw: Mapping[str, Any], where: str) -> tuple[QuantizeConfig, dict[str, tuple[int, int] | None]]:
    """The model-wide config and the per-module overrides (module path -> (bits, group_size), or None: dense)."""
    bits, gs = _params(raw, where)
    overrides: dict[str, tuple[int, int] | None] = {}
    for key, value in raw.items():
        if key in TOP_KEYS:
            continue
        if value is False:
            overrides[key] = None
        elif isinstance(value, Mapping):
            overrides[key] = _params(value, f"{where} [{key!r}]", (bits, gs))
        elif value is not True:
            raise ConfigError(f"{where}: key {key!r}: expected a module override (a dict or false), got {value!r}")
    config = QuantizeConfig(bits=bits, group_size=gs, sym=False, method=METHOD.MLX, checkpoint_format=FORMAT.MLX,
                            extra=dict(raw))
    return config, overrides


def plan_module(name: str, leaves: Mapping[str, TensorInfo], bits: int, gs: int, where: str) -> ModulePlan:
    """Resolve and check one MLX module; raises listing every problem, each naming the tensor."""
    w, s = leaves.get("weight"), leaves.get("scales")
    if w is None or len(w.shape) != 2 or s is None or len(s.shape) != 2:
        found = ", ".join(f"{leaf} {info.describe()}" for leaf, info in sorted(leaves.items()))
        raise CheckpointError(f"{name}: expected a 2-D uint32 weight and 2-D scales (an MLX quantized linear or "
                              f"embedding; 3-D expert stacks are not served), found {found}")
    n, k = w.shape[0], w.shape[1] * 32 // bits
    what = f"mlx {bits}-bit group_size {gs}, from {where}"
    if (w.shape[1] * 32) % bits or k % gs:
        raise CheckpointError(f"{name}.weight: {w.shape[1]} words per row are not a whole number of {gs}-wide groups "
                              f"of {bits}-bit codes ({what})")
    scheme = mlx.scheme_for(bits, gs, k, n)
    problems = leaf_errors(name, leaves, mlx.checkpoint_shapes(scheme), what) + bias_errors(name, leaves, n)
    if not problems and leaves["biases"].dtype != leaves["scales"].dtype:
        problems.append(f"{name}.biases: found {leaves['biases'].describe()}, expected the scales' dtype "
                        f"{leaves['scales'].dtype} ({what})")
    if problems:
        raise CheckpointError("\n".join(problems))
    return ModulePlan(name, scheme, dict(leaves))


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], raw: Mapping[str, Any], where: str
                 ) -> tuple[QuantizeConfig, dict[str, ModulePlan], dict[str, TensorInfo], list[str]]:
    """Every quantized module (those storing ``scales``), and every problem found (each naming the module)."""
    config, overrides = read_config(raw, where)
    modules: dict[str, ModulePlan] = {}
    errors: list[str] = []
    for name in sorted(groups):
        leaves = groups[name]
        override = overrides.get(name, (config.bits, config.group_size))
        if "scales" not in leaves:
            if name in overrides and override is not None and "weight" in leaves:
                errors.append(f"{name}: {where} quantizes this module ({override[0]}-bit, group_size {override[1]}) "
                              "but the checkpoint stores no scales for it")
            continue
        if override is None:
            errors.append(f"{name}: {where} says this module stays dense (false) but the checkpoint stores scales")
            continue
        try:
            modules[name] = plan_module(name, leaves, *override, where)
        except CheckpointError as err:
            errors.append(str(err))
    return config, modules, {}, errors
