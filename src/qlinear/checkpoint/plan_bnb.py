"""Plan the modules of a transformers bitsandbytes checkpoint (``quant_method: bitsandbytes``), and write its config.

The config (``BitsAndBytesConfig.to_dict``) says ``load_in_4bit`` or ``load_in_8bit``, ``bnb_4bit_quant_type``
(nf4 / fp4), ``bnb_4bit_use_double_quant``, ``bnb_4bit_quant_storage`` (uint8: the only storage read) and
``llm_int8_skip_modules`` (modules left in float: transformers' rules, a prefix at a module boundary, a regex
with that boundary, or a suffix). A 4-bit module is marked by its ``weight.quant_state.bitsandbytes__<type>``
JSON blob, whose fields (blocksize, shape, nested state) are read while planning: the only tensor data read
here (a few dozen bytes a module). An 8-bit module is marked by ``SCB``. Every tensor is checked against what
the config and the blob say, each problem naming the module and the tensor (``layouts.bnb`` has the table).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..layouts import bnb, bnb_state
from ..spec import ConfigError, QuantizeConfig, Scheme
from .module_plan import ModulePlan, checked_plan
from .safetensors_io import CheckpointError, TensorInfo, read_tensor

BLOB = re.compile(r"^(?P<module>.+)\.weight\.quant_state\.bitsandbytes__(?P<type>\w+)$")
#: Leaves that only a 4-bit module has (a module with one of them but no JSON blob is broken).
FOUR_BIT_LEAVES = ("weight.absmax", "weight.quant_map", "weight.nested_absmax", "weight.nested_quant_map")


def read_config(raw: Mapping[str, Any], source: str) -> QuantizeConfig:
    """The model-wide config (bits from load_in_4bit / load_in_8bit), every field checked."""
    config = QuantizeConfig.from_hf_config(raw)
    if config.bits == 4:
        qt = raw.get("bnb_4bit_quant_type", "fp4")
        if qt not in ("nf4", "fp4"):
            raise ConfigError(f"{source}: bnb_4bit_quant_type {qt!r}; expected 'nf4' or 'fp4'")
        storage = str(raw.get("bnb_4bit_quant_storage", "uint8")).removeprefix("torch.")
        if storage != "uint8":
            raise ConfigError(f"{source}: bnb_4bit_quant_storage {storage!r}: codes stored in {storage} words are not "
                              "read (only uint8, transformers' default)")
    skip = raw.get("llm_int8_skip_modules")
    if skip is not None and not (isinstance(skip, list) and all(isinstance(s, str) for s in skip)):
        raise ConfigError(f"{source}: llm_int8_skip_modules must be a list of module names, got {skip!r}")
    return config


def skipped(name: str, patterns: list[str] | None) -> str | None:
    """The ``llm_int8_skip_modules`` entry that keeps module ``name`` in float, or None (transformers' matching)."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    for key in patterns or ():
        if re.match(rf"(?:{key}){boundary}", name) or name.endswith(key):
            return key
    return None


def _modules(tensors: Mapping[str, TensorInfo], bits: int) -> tuple[dict[str, str | None], list[str]]:
    """Quantized module -> its quant type from the blob name (None for 8-bit), and structural errors."""
    found: dict[str, str | None] = {}
    errors: list[str] = []
    for name in tensors:
        m = BLOB.match(name)
        if m:
            found[m["module"]] = m["type"]
    four = dict(found)
    eight = {name.removesuffix(".SCB"): None for name in tensors if name.endswith(".SCB")}
    for name in tensors:
        for leaf in FOUR_BIT_LEAVES:
            mod = name.removesuffix("." + leaf)
            if name.endswith("." + leaf) and mod not in four:
                errors.append(f"{mod}.{bnb_state.PREFIX}<nf4|fp4>: missing ({name} is a 4-bit bitsandbytes tensor, "
                              "and its module keeps the quant_state JSON there)")
    wrong = eight if bits == 4 else four
    for mod in sorted(wrong):
        kind = "an 8-bit (SCB)" if bits == 4 else "a 4-bit (quant_state)"
        errors.append(f"{mod}: holds {kind} bitsandbytes module, but the config says load_in_{bits}bit")
    return (four if bits == 4 else eight), sorted(set(errors))


def plan_module(name: str, leaves: Mapping[str, TensorInfo], config: QuantizeConfig, quant_type: str | None,
                source: str) -> ModulePlan:
    """Resolve and check one module; raises listing every problem, each naming the tensor."""
    raw = config.extra
    if config.bits == 8:
        weight = leaves.get("weight")
        if weight is None or len(weight.shape) != 2:
            found = "nothing" if weight is None else weight.describe()
            raise CheckpointError(f"{name}.weight: expected an int8 [out_features, in_features] tensor beside SCB, "
                                  f"found {found}")
        scheme = bnb.bnb_scheme(weight.shape[0], weight.shape[1], "int8")
        what, optional = f"bitsandbytes 8-bit (LLM.int8), from {source}", ("bias", "weight_format")
        expected = bnb.checkpoint_shapes(scheme)
    else:
        want = raw.get("bnb_4bit_quant_type", "fp4")
        blob_leaf = bnb_state.blob_name(quant_type)
        try:
            info = bnb_state.parse(read_tensor(leaves[blob_leaf]), f"{name}.{blob_leaf}", quant_type)
        except ValueError as err:
            raise CheckpointError(str(err)) from None
        double = bool(raw.get("bnb_4bit_use_double_quant", False))
        if quant_type != want or info.nested != double:
            raise CheckpointError(f"{name}.{blob_leaf}: {info.describe()}, but {source} says bnb_4bit_quant_type "
                                  f"{want!r}, bnb_4bit_use_double_quant {double}")
        scheme = bnb.bnb_scheme(info.shape[0], info.shape[1], quant_type, info.blocksize, info.nested)
        what, optional = f"bitsandbytes 4-bit {info.describe()}, from {source}", ("bias",)
        expected = bnb.checkpoint_shapes(scheme, info, leaves[blob_leaf].shape[0])
    return checked_plan(name, leaves, scheme, expected, what, optional)


def plan_modules(tensors: Mapping[str, TensorInfo], raw: Mapping[str, Any],
                 source: str) -> tuple[QuantizeConfig, dict[str, ModulePlan], list[str]]:
    """The config, every quantized module and every problem found (each naming the module and the tensor).

    ``tensors`` is the whole checkpoint (full name -> info): a 4-bit module's leaves have dots of their own
    (``weight.absmax``), so modules are found from the markers, not by cutting names at the last dot."""
    config = read_config(raw, source)
    found, errors = _modules(tensors, config.bits)
    skip = raw.get("llm_int8_skip_modules")
    modules: dict[str, ModulePlan] = {}
    for mod, quant_type in sorted(found.items()):
        leaves = {k[len(mod) + 1:]: v for k, v in tensors.items() if k.startswith(mod + ".")}
        try:
            key = skipped(mod, skip)
            if key is not None:
                raise CheckpointError(f"{mod}: holds bitsandbytes tensors but llm_int8_skip_modules entry {key!r} in "
                                      f"{source} keeps it in float")
            modules[mod] = plan_module(mod, leaves, config, quant_type, source)
        except CheckpointError as err:
            errors.append(str(err))
    return config, modules, errors


def bnb_config(schemes: Mapping[str, Scheme]) -> dict[str, Any]:
    """transformers' ``BitsAndBytesConfig`` dict for these modules (every module shares bits, type and double
    quantization; each module's blocksize is in its own JSON blob)."""
    first_name, first = next(iter(schemes.items()))
    for name, s in schemes.items():
        if (s.bits, s.bnb_type, s.double_quant) != (first.bits, first.bnb_type, first.double_quant):
            raise CheckpointError(f"{name}: bitsandbytes {bnb.describe(s)} differs from {first_name}'s "
                                  f"{bnb.describe(first)}; a bitsandbytes config states one type for all modules")
    four = first.bits == 4
    return {"_load_in_4bit": four, "_load_in_8bit": not four, "bnb_4bit_compute_dtype": "float32",
            "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": first.bnb_type if four else "fp4",
            "bnb_4bit_use_double_quant": first.double_quant, "llm_int8_enable_fp32_cpu_offload": False,
            "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0,
            "load_in_4bit": four, "load_in_8bit": not four, "quant_method": "bitsandbytes"}
