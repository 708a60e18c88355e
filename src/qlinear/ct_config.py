"""compressed-tensors quantization configs (``quant_method: compressed-tensors``, written by llm-compressor).

A config maps module *targets* to schemes: ``config_groups`` (each with ``targets``, ``weights``,
``input_activations`` and, in newer versions, its own storage ``format``), an ``ignore`` list, a
model-wide ``format`` (or ``mixed-precision``), and the writing package's ``version``. Matching follows
compressed-tensors (``utils/match.py``): an ignore entry or target is an exact module name, a regex
``re:<pattern>`` (``re.match``, anchored at the start), or a class name (``Linear``: every linear module;
a checkpoint names no classes, so every module holding quantized tensors is taken to be one). A module's
group is its most specific match: exact name, then regex, then class. A group written as a preset name
with a list of targets (``"W4A16": ["Linear"]``) expands to that preset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .activations import ActQuant, ActScales, ActStrategy
from .enums import FORMAT, METHOD
from .floats import Element
from .spec import ConfigError, Scheme

#: Formats qlinear reads; the rest (sparse, marlin-24, dense) are refused by name.
READ_FORMATS = frozenset({"pack-quantized", "naive-quantized", "int-quantized", "float-quantized",
                          "nvfp4-pack-quantized", "mxfp4-pack-quantized"})
#: The version that replaced padded int32 words by one dense bit stream in pack-quantized.
DENSE_PACKING_FROM = (0, 18)

_INT = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
_TOKEN8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
_F8 = {"num_bits": 8, "type": "float", "symmetric": True}
_FP4 = {"num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group"}
#: The presets of compressed-tensors' ``quant_scheme.py`` that checkpoints name (weights, input activations).
PRESETS: Mapping[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "W4A16": (_INT, None),
    "W4A16_ASYM": ({**_INT, "symmetric": False}, None),
    "W8A16": ({**_INT, "num_bits": 8}, None),
    "W8A8": ({**_INT, "num_bits": 8, "strategy": "channel", "group_size": None}, _TOKEN8),
    "INT8": ({**_INT, "num_bits": 8, "strategy": "channel", "group_size": None}, _TOKEN8),
    "W4A8": (_INT, _TOKEN8),
    "W4AFP8": (_INT, {**_F8, "strategy": "token", "dynamic": True}),
    "FP8": ({**_F8, "strategy": "tensor"}, {**_F8, "strategy": "tensor", "dynamic": False}),
    "FP8_DYNAMIC": ({**_F8, "strategy": "channel"}, {**_F8, "strategy": "token", "dynamic": True}),
    "FP8_BLOCK": ({**_F8, "strategy": "block", "block_structure": [128, 128]},
                  {**_F8, "strategy": "group", "group_size": 128, "dynamic": True}),
    "NVFP4A16": (_FP4, None),
    "NVFP4": (_FP4, {**_FP4, "dynamic": "local"}),
    "MXFP4A16": ({**_FP4, "group_size": 32, "strategy": "group", "scale_dtype": "torch.uint8"}, None),
}


@dataclass(frozen=True)
class QuantArgs:
    """One ``QuantizationArgs`` as a config writes it, checked."""

    num_bits: int
    type: str  # "int" or "float"
    symmetric: bool
    strategy: str  # tensor, channel, group, block, token, tensor_group
    group_size: int | None
    block_structure: tuple[int, int] | None
    dynamic: str  # "true", "false" or "local"
    actorder: str | None
    scale_dtype: str | None

    @classmethod
    def parse(cls, raw: Any, where: str) -> QuantArgs:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: expected an object of quantization args, got {type(raw).__name__}")
        bits = raw.get("num_bits", 8)
        if not isinstance(bits, int) or isinstance(bits, bool) or not 1 <= bits <= 8:
            raise ConfigError(f"{where}.num_bits: expected an integer in 1..8, got {bits!r}")
        kind = str(raw.get("type", "int")).lower()
        if kind not in ("int", "float"):
            raise ConfigError(f"{where}.type: expected 'int' or 'float', got {raw.get('type')!r}")
        group = raw.get("group_size")
        if group is not None and (not isinstance(group, int) or isinstance(group, bool) or group < -1 or group == 0):
            raise ConfigError(f"{where}.group_size: expected a positive integer, -1 or null, got {group!r}")
        strategy = raw.get("strategy")
        if strategy is None:  # compressed-tensors infers it from group_size
            strategy = "tensor" if group is None else ("channel" if group == -1 else "group")
        strategy = str(strategy).lower()
        if strategy not in ("tensor", "channel", "group", "block", "token", "tensor_group", "attn_head"):
            raise ConfigError(f"{where}.strategy: unknown strategy {raw.get('strategy')!r}")
        if strategy in ("group", "tensor_group") and not (isinstance(group, int) and group > 0):
            raise ConfigError(f"{where}: strategy {strategy} needs a positive group_size, got {group!r}")
        block = raw.get("block_structure")
        if isinstance(block, str):
            block = [int(v) for v in block.split("x")] if re.fullmatch(r"\d+x\d+", block) else block
        if strategy == "block":
            if not (isinstance(block, (list, tuple)) and len(block) == 2 and all(isinstance(b, int) and b > 0
                                                                               for b in block)):
                raise ConfigError(f"{where}.block_structure: strategy block needs [rows, cols], got {block!r}")
            block = (int(block[0]), int(block[1]))
        else:
            block = None
        dyn = raw.get("dynamic", False)
        dynamic = "local" if str(dyn).lower() == "local" else ("true" if dyn is True else "false")
        if dyn not in (True, False) and dynamic != "local":
            raise ConfigError(f"{where}.dynamic: expected true, false or 'local', got {dyn!r}")
        actorder = raw.get("actorder")
        actorder = None if actorder in (None, False) else str(actorder).lower()
        if actorder is not None and actorder not in ("group", "dynamic", "weight", "static"):
            raise ConfigError(f"{where}.actorder: unknown activation ordering {raw.get('actorder')!r}")
        scale = raw.get("scale_dtype")
        return cls(bits, kind, bool(raw.get("symmetric", True)), strategy, group, block, dynamic, actorder,
                   None if scale is None else str(scale).removeprefix("torch."))


@dataclass(frozen=True)
class Group:
    """One config group: its targets, weight and input-activation args, and its storage format (if written)."""

    name: str
    targets: tuple[str, ...]
    weights: QuantArgs | None
    inputs: QuantArgs | None
    format: str | None


def _version(raw: Any) -> tuple[int, int] | None:
    m = re.match(r"\s*(\d+)\.(\d+)", str(raw)) if raw is not None else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def _match(name: str, target: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def _hit(kind: str, name: str, target: str) -> bool:
    if kind == "exact":
        return not target.startswith("re:") and target == name
    if kind == "regex":
        return target.startswith("re:") and re.match(target[3:], name) is not None
    return target == "Linear"


def _is_class(target: str) -> bool:
    return not target.startswith("re:") and "." not in target and target[:1].isupper()


@dataclass(frozen=True)
class CompressedTensorsConfig:
    """A parsed compressed-tensors quantization config (see the module docstring)."""

    groups: tuple[Group, ...]
    ignore: tuple[str, ...]
    format: str
    version: tuple[int, int] | None
    raw: Mapping[str, Any]

    @classmethod
    def from_hf_config(cls, raw: Mapping[str, Any], source: str = "quantization_config") -> CompressedTensorsConfig:
        if "quantization_config" in raw:
            raw = raw["quantization_config"]
        if str(raw.get("quant_method", "")).lower().replace("_", "-") != "compressed-tensors":
            raise ConfigError(f"{source}: quant_method is {raw.get('quant_method')!r}, not 'compressed-tensors'")
        for key, why in (("sparsity_config", "sparse (2:4 or bitmask) weights"),
                         ("transform_config", "Hadamard / rotation transforms (SpinQuant, QuIP)")):
            if raw.get(key):
                raise ConfigError(f"{source}: {key} is set: {why} are not implemented; qlinear reads dense "
                                  "quantized weights only")
        fmt = str(raw.get("format", "dense"))
        groups_raw = raw.get("config_groups")
        if not isinstance(groups_raw, Mapping) or not groups_raw:
            raise ConfigError(f"{source}: config_groups must be a non-empty object, got {groups_raw!r}")
        groups = tuple(_group(name, g, f"{source}.config_groups.{name}") for name, g in groups_raw.items())
        ignore = raw.get("ignore") or []
        if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
            raise ConfigError(f"{source}.ignore: expected a list of module names or 're:' patterns, got {ignore!r}")
        return cls(groups, tuple(ignore), fmt, _version(raw.get("version")), dict(raw))

    def ignored(self, name: str) -> bool:
        return any(_match(name, i) or (_is_class(i) and i == "Linear") for i in self.ignore)

    def group_for(self, name: str) -> Group | None:
        """The most specific group targeting module ``name`` (exact, then regex, then class), or None."""
        if self.ignored(name):
            return None
        for kind in ("exact", "regex", "class"):
            for g in self.groups:
                if any(_hit(kind, name, t) for t in g.targets):
                    return g
        return None

    def module_format(self, group: Group) -> str:
        """The storage format of a group's modules (its own, the model's, or inferred as compressed-tensors does)."""
        fmt = group.format or (self.format if self.format != "mixed-precision" else None)
        if fmt is None:
            fmt = infer_format(group)
        if fmt not in READ_FORMATS:
            raise ConfigError(f"config group {group.name!r}: format {fmt!r} is not read by qlinear (it reads "
                              f"{', '.join(sorted(READ_FORMATS))})")
        return fmt

    def scheme(self, group: Group, in_features: int, out_features: int) -> Scheme:
        """The layer scheme of a module of ``group`` with this shape."""
        w = group.weights
        if w is None:
            raise ConfigError(f"config group {group.name!r} quantizes no weights")
        fmt = FORMAT(self.module_format(group))
        where = f"config group {group.name!r}"
        if w.strategy in ("token", "attn_head"):
            raise ConfigError(f"{where}: weight strategy {w.strategy} is not a weight layout")
        block = {"tensor": (out_features, in_features), "channel": (1, in_features),
                 "group": (1, w.group_size), "tensor_group": (1, w.group_size)}.get(w.strategy, w.block_structure)
        element = None
        if w.type == "float":
            if w.num_bits not in (4, 8):
                raise ConfigError(f"{where}: float weights of {w.num_bits} bits (FP6?) are not implemented")
            element = Element.E4M3 if w.num_bits == 8 else Element.E2M1
            if not w.symmetric:
                raise ConfigError(f"{where}: asymmetric float weights are not implemented")
        desc_act = w.actorder in ("group", "dynamic")
        return Scheme(bits=w.num_bits, group_size=min(block[1], in_features), in_features=in_features,
                      out_features=out_features, sym=w.symmetric, desc_act=desc_act,
                      method=METHOD.COMPRESSED_TENSORS, format=fmt, element=element, scale_block=block,
                      per_tensor_scale=w.strategy == "tensor",
                      activations=act_quant(group.inputs, where),
                      legacy_packing=self.version is not None and self.version < DENSE_PACKING_FROM)


def infer_format(group: Group) -> str:
    """compressed-tensors' own priority list (``compressors/format.py``) for a group without a format."""
    w, a = group.weights, group.inputs
    if w is None:
        return "dense"
    if w.type == "float" and w.num_bits == 4:
        return "mxfp4-pack-quantized" if w.group_size == 32 else "nvfp4-pack-quantized"
    if w.type == "int" and a is not None:
        return "int-quantized"
    if w.type == "int":
        return "pack-quantized"
    return "float-quantized" if a is not None else "naive-quantized"


def act_quant(args: QuantArgs | None, where: str) -> ActQuant | None:
    """The ``ActQuant`` of a group's input_activations (None: weight-only)."""
    if args is None:
        return None
    if not args.symmetric:
        raise ConfigError(f"{where}: asymmetric input activations are not implemented")
    element = None if args.type == "int" else (Element.E4M3 if args.num_bits == 8 else Element.E2M1)
    scales = {"true": ActScales.DYNAMIC, "false": ActScales.STATIC, "local": ActScales.LOCAL}[args.dynamic]
    try:
        return ActQuant(bits=args.num_bits, element=element, strategy=ActStrategy(args.strategy), scales=scales,
                        group_size=args.group_size if args.strategy in ("group", "tensor_group") else None)
    except ValueError as err:
        raise ConfigError(f"{where}: input_activations: {err}") from None


def _group(name: str, raw: Any, where: str) -> Group:
    if isinstance(raw, list):  # a preset name mapped to its targets
        preset = PRESETS.get(name.upper())
        if preset is None:
            raise ConfigError(f"{where}: {name!r} is neither a scheme object nor a preset qlinear knows "
                              f"({', '.join(PRESETS)})")
        raw = {"targets": raw, "weights": preset[0], "input_activations": preset[1]}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a scheme object, got {type(raw).__name__}")
    targets = raw.get("targets")
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise ConfigError(f"{where}.targets: expected a non-empty list of names, got {targets!r}")
    weights = None if raw.get("weights") is None else QuantArgs.parse(raw["weights"], f"{where}.weights")
    inputs = (None if raw.get("input_activations") is None
              else QuantArgs.parse(raw["input_activations"], f"{where}.input_activations"))
    if raw.get("output_activations") is not None:
        raise ConfigError(f"{where}.output_activations: output quantization is not implemented")
    return Group(name, tuple(targets), weights, inputs, raw.get("format"))
