"""Plan the modules of an FP8 checkpoint (``quant_method: fp8``): GPTQModel's and transformers' fine-grained FP8.

Both store ``weight`` in an FP8 dtype and a float32 ``weight_scale_inv``, with opposite meanings:

* GPTQModel (``FP8Config``: ``format`` = the FP8 dtype name, ``weight_scale_method`` tensor/row/block,
  ``weight_block_size``, ``weight_scale_semantics: inverse``): ``w = weight / weight_scale_inv``;
  weight-only. Per-module ``dynamic`` rules may override those three fields.
* transformers' ``FineGrainedFP8Config`` (DeepSeek-V3 style: ``fmt``, ``weight_block_size``,
  ``activation_scheme``): ``w = weight * weight_scale_inv`` per block; ``activation_scheme: dynamic``
  quantizes inputs to E4M3 per token in groups of the block's width.

A config naming either GPTQModel field is read as GPTQModel's; one naming ``activation_scheme`` or ``fmt``
(and neither GPTQModel field) as transformers'; anything else is refused as ambiguous.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..activations import ActQuant, ActScales, ActStrategy
from ..enums import FORMAT, METHOD
from ..floats import Element
from ..layouts import float_layouts
from ..spec import ConfigError, Scheme, fp8_format
from .module_plan import ModulePlan, bias_errors, leaf_errors
from .safetensors_io import TensorInfo

MARKERS = frozenset({"weight_scale_inv"})


def _fields(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The config's FP8 fields with GPTQModel's first matching ``dynamic`` rule for module ``name`` applied."""
    fields = dict(raw)
    for pattern, override in (raw.get("dynamic") or {}).items():
        body = pattern[2:] if pattern.startswith(("-:", "+:")) else pattern
        if re.match(body, name):
            if pattern.startswith("-:"):
                raise ConfigError(f"{name}: holds FP8 tensors but the dynamic rule {pattern!r} says it is not "
                                  "quantized")
            fields.update({k: v for k, v in (override or {}).items()
                           if k in ("format", "fmt", "weight_scale_method", "weight_block_size")})
            break
    return fields


def _element(value: Any, source: str) -> Element:
    name = "float8_e4m3fn" if value in (None, "", "fp8") else str(value).lower()
    if "e8m0" in name:
        raise ConfigError(f"{source}: FP8 format {value!r} (E8M0 weights) is dequant-only in GPTQModel; not read")
    try:
        element = Element(name)
    except ValueError:
        raise ConfigError(f"{source}: unknown FP8 format {value!r}; expected float8_e4m3fn or float8_e5m2") from None
    if element is Element.E2M1:
        raise ConfigError(f"{source}: {value!r} is not an FP8 format")
    return element


def _block(value: Any, source: str) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) and v > 0 for v in value)):
        raise ConfigError(f"{source}: weight_block_size must be [rows, cols] positive, got {value!r}")
    return int(value[0]), int(value[1])


def fp8_scheme(fmt: FORMAT, raw: Mapping[str, Any], name: str, out_features: int, in_features: int,
               source: str) -> Scheme:
    """The scheme of module ``name`` (shape ``[out_features, in_features]``) under an FP8 config."""
    f = _fields(raw, name)
    element = _element(f.get("fmt") if fmt is FORMAT.HF_FP8 else f.get("format", f.get("fmt")), source)
    block = _block(f.get("weight_block_size"), source)
    act, method = None, "block"
    if fmt is FORMAT.FP8:
        method = str(f.get("weight_scale_method") or ("block" if block else "row")).lower()
        if method not in ("tensor", "row", "block") or (method == "block") != (block is not None):
            raise ConfigError(f"{source}: weight_scale_method {method!r} with weight_block_size {block}; expected "
                              "tensor, row, or block with a block size")
        block = {"tensor": (out_features, in_features), "row": (1, in_features)}.get(method, block)
        if method == "block" and (out_features % block[0] or in_features % block[1]):
            raise ConfigError(f"{source}: GPTQModel FP8 blocks {block} must divide the weight [{out_features}, "
                              f"{in_features}]")
    else:
        block = block or (128, 128)
        scheme = str(f.get("activation_scheme", "dynamic")).lower()
        if scheme != "dynamic":
            raise ConfigError(f"{source}: activation_scheme {scheme!r}; only 'dynamic' is implemented")
        act = ActQuant(bits=8, element=Element.E4M3, strategy=ActStrategy.GROUP, scales=ActScales.DYNAMIC,
                       group_size=block[1])
    return Scheme(bits=8, group_size=min(block[1], in_features), in_features=in_features, out_features=out_features,
                  method=METHOD.FP8, format=fmt, element=element, scale_block=block, activations=act,
                  per_tensor_scale=fmt is FORMAT.FP8 and method == "tensor")


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], raw: Mapping[str, Any],
                 source: str) -> tuple[dict[str, ModulePlan], list[str]]:
    """Every FP8 module of the checkpoint, and every problem found (each naming the module and tensor)."""
    fmt = fp8_format(raw, source)
    modules: dict[str, ModulePlan] = {}
    errors: list[str] = []
    for mod, leaves in sorted(groups.items()):
        if not MARKERS & leaves.keys():
            continue
        weight = leaves.get("weight")
        if weight is None or len(weight.shape) != 2:
            errors.append(f"{mod}.weight: expected a 2-D FP8 tensor beside weight_scale_inv, found "
                          f"{'nothing' if weight is None else weight.describe()}")
            continue
        n, k = weight.shape
        try:
            scheme = fp8_scheme(fmt, raw, mod, n, k, source)
            expected = float_layouts.checkpoint_shapes(scheme)
        except (ConfigError, ValueError) as err:
            errors.append(f"{mod}: {err}")
            continue
        what = f"{fmt.value} {scheme.element.value} block {scheme.scale_block}, from {source}"
        problems = leaf_errors(mod, leaves, expected, what) + bias_errors(mod, leaves, n)
        if problems:
            errors += problems
        else:
            modules[mod] = ModulePlan(mod, scheme, dict(leaves))
    return modules, errors
