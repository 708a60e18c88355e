"""Read a checkpoint's structure from its config and safetensors headers alone, before any tensor data.

A plan says which modules are quantized, each one's resolved ``Scheme`` (shape taken from the
tensors, numbers from the config, GPTQModel ``dynamic`` overrides applied) and where every tensor
lives. All structural problems (missing or extra tensors, shapes or dtypes that disagree with the
config, unknown methods, unsupported formats) are found here and reported together, each naming
the module and the tensor; loading, inspecting and converting all start from a plan. GPTQ and AWQ
modules are planned here; compressed-tensors ones in ``plan_ct`` and FP8 ones in ``plan_fp8``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..ct_config import CompressedTensorsConfig
from ..enums import FORMAT, METHOD
from ..layouts import awq, gptq
from ..spec import ConfigError, QuantizeConfig, fp8_format
from . import plan_bitblas, plan_bnb, plan_ct, plan_fp8, plan_gptq, plan_marlin, plan_mlx, plan_qqq
from .module_plan import ModulePlan
from .safetensors_io import CheckpointError, TensorInfo, read_header

#: Formats whose safetensors checkpoints qlinear reads, per method.
READABLE: Mapping[METHOD, tuple[FORMAT, ...]] = {
    METHOD.GPTQ: (*gptq.GPTQ_LAYOUT_FORMATS, FORMAT.MARLIN, FORMAT.BITBLAS),
    METHOD.AWQ: (*awq.AWQ_LAYOUT_FORMATS, FORMAT.BITBLAS),
    METHOD.FP8: (FORMAT.FP8, FORMAT.HF_FP8),
    METHOD.QQQ: (FORMAT.QQQ,),
    METHOD.BITSANDBYTES: (FORMAT.BITSANDBYTES,),
    METHOD.COMPRESSED_TENSORS: (FORMAT.PACK_QUANTIZED, FORMAT.NAIVE_QUANTIZED, FORMAT.INT_QUANTIZED,
                                FORMAT.FLOAT_QUANTIZED, FORMAT.NVFP4_PACK_QUANTIZED, FORMAT.MXFP4_PACK_QUANTIZED)}
#: Methods planned by a module of their own, ``checkpoint/<module>.py``, which exposes
#: ``plan_modules(groups, raw, where) -> (config, modules, unused, errors)`` (``groups``: module -> leaf -> tensor).
FAMILY_PLANNERS: Mapping[METHOD, str] = {
    METHOD.EXL2: "plan_exl2", METHOD.EXL3: "plan_exl3", METHOD.VPTQ: "plan_vptq", METHOD.PAROQUANT: "plan_paro",
    METHOD.MLX: "plan_mlx"}
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
CONFIG_FILES = ("quantize_config.json", "quant_config.json")


__all__ = ["READABLE", "CheckpointPlan", "ModulePlan", "plan_checkpoint"]


@dataclass(frozen=True)
class CheckpointPlan:
    """A checkpoint directory's structure: config, quantized modules and every other tensor."""

    root: Path
    files: tuple[Path, ...]
    config: QuantizeConfig | CompressedTensorsConfig
    config_source: str
    quant_config: Mapping[str, Any]  # the quantization config as written
    model_config: Mapping[str, Any] | None  # config.json without quantization_config
    modules: Mapping[str, ModulePlan]
    other: Mapping[str, TensorInfo]
    #: Tensors that belong to no layer qlinear serves and to no model weight (compressed-tensors KV-cache scales).
    unused: Mapping[str, TensorInfo] = dataclasses.field(default_factory=dict)


def _refuse_pickle(p: Path) -> CheckpointError:
    return CheckpointError(f"{p}: refused: {p.suffix} checkpoints are Python pickles, and loading one can run "
                           "arbitrary code from the file; qlinear reads safetensors only (convert it once, in an "
                           "environment you trust, with safetensors.torch.save_file)")


def _read_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{p}: cannot read JSON ({err})") from None


def find_tensors(path: Path) -> tuple[Path, tuple[Path, ...], dict[str, TensorInfo]]:
    """The checkpoint's root directory, its safetensors files and every tensor they list (index-aware)."""
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory")
    if path.is_file():
        if path.suffix in PICKLE_SUFFIXES:
            raise _refuse_pickle(path)
        if path.suffix.lower() == ".gguf":
            raise CheckpointError(f"{path}: GGUF files load with load_checkpoint() and show with inspect, but their "
                                  "blocks are not integer-affine weights: no conversion to other formats")
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{path}: not a .safetensors file or a checkpoint directory")
        root, files, index = path.parent, (path,), None
    else:
        root = path
        indexes = sorted(path.glob("*.safetensors.index.json"))
        preferred = [p for p in indexes if p.name == "model.safetensors.index.json"]
        index = (preferred or indexes or [None])[0]
        if index is not None:
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index}: no weight_map object")
            files = tuple(sorted({path / f for f in weight_map.values()}))
            for f in files:
                if not f.is_file():
                    names = sorted(k for k, v in weight_map.items() if path / v == f)
                    raise CheckpointError(f"{index}: shard {f.name} is missing; it should hold {len(names)} tensors "
                                          f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})")
        elif (path / "model.safetensors").is_file():
            files = (path / "model.safetensors",)
        else:
            files = tuple(sorted(path.glob("*.safetensors")))
        if not files:
            pickles = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
            if pickles:
                raise _refuse_pickle(pickles[0])
            raise CheckpointError(f"{path}: no .safetensors files in this directory")
    tensors: dict[str, TensorInfo] = {}
    for f in files:
        header, _ = read_header(f)
        for name, info in header.items():
            if name in tensors:
                raise CheckpointError(f"{name}: in both {tensors[name].file.name} and {f.name}")
            tensors[name] = info
    if index is not None:
        for name, fname in weight_map.items():
            if name not in tensors or tensors[name].file != path / fname:
                raise CheckpointError(f"{index}: tensor {name!r} is mapped to {fname} but that file does not hold it")
        tensors = {k: v for k, v in tensors.items() if k in weight_map}
    return root, files, tensors


def read_quant_config(root: Path) -> tuple[dict[str, Any], str, dict[str, Any] | None]:
    """The quantization config as written (quantize_config.json first, then config.json's), its source and
    config.json without it."""
    model_config = _read_json(root / "config.json") if (root / "config.json").is_file() else None
    if model_config is not None and not isinstance(model_config, dict):
        raise CheckpointError(f"{root / 'config.json'}: expected a JSON object")
    # mlx-lm writes "quantization" (newer versions a copy as quantization_config too) and no quant_method
    if model_config is not None and plan_mlx.is_mlx_quantization(model_config.get("quantization")) \
            and not any((root / name).is_file() for name in CONFIG_FILES):
        base = {k: v for k, v in model_config.items() if k not in ("quantization", "quantization_config")}
        return dict(model_config["quantization"]), plan_mlx.SOURCE, base
    raw, source = None, ""
    for name in CONFIG_FILES:
        if (root / name).is_file():
            raw, source = _read_json(root / name), name
            break
    if raw is None and model_config is not None and "quantization_config" in model_config:
        raw, source = model_config["quantization_config"], "config.json quantization_config"
    if raw is None:
        raise CheckpointError(f"{root}: no quantization config: neither {' nor '.join(CONFIG_FILES)} nor a "
                              "quantization_config in config.json (is this a quantized checkpoint?)")
    if not isinstance(raw, dict):
        raise CheckpointError(f"{root}/{source}: expected a JSON object, got {type(raw).__name__}")
    base = None if model_config is None else {k: v for k, v in model_config.items() if k != "quantization_config"}
    return raw, source, base


def config_method(raw: Mapping[str, Any], where: str) -> METHOD | None:
    """The config's quant_method (None when it names none: GPTQ/AWQ configs of older tools)."""
    method = raw.get("quant_method")
    if method is None:
        return None
    try:
        method = METHOD(method)
    except ValueError:
        raise CheckpointError(f"{where}: unknown quant_method {raw['quant_method']!r}; qlinear knows "
                              f"{', '.join(m.value for m in METHOD)}") from None
    if method not in READABLE and not _family_built(method):
        raise CheckpointError(f"{where}: unsupported format: quant_method {method.value!r} checkpoints "
                              f"are not read yet; qlinear reads {_readable()}")
    return method


def _family_built(method: METHOD) -> bool:
    name = FAMILY_PLANNERS.get(method)
    return name is not None and importlib.util.find_spec(f"{__package__}.{name}") is not None


def read_config(root: Path) -> tuple[QuantizeConfig, str, dict[str, Any], dict[str, Any] | None]:
    """A GPTQ/AWQ checkpoint's config (see ``read_quant_config``), as a ``QuantizeConfig``."""
    raw, source, base = read_quant_config(root)
    config_method(raw, f"{root}/{source}")
    try:
        config = QuantizeConfig.from_hf_config(raw)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{root}/{source}: {err}") from None
    if config.checkpoint_format not in READABLE.get(config.method, ()):
        raise CheckpointError(f"{root}/{source}: unsupported format: {config.method.value} checkpoint_format "
                              f"{config.checkpoint_format.value!r}; qlinear reads {_readable()}")
    return config, source, raw, base


def _readable() -> str:
    return "; ".join(f"{m.value}: {', '.join(f.value for f in fs)}" for m, fs in READABLE.items())


def plan_checkpoint(path: str | Path) -> CheckpointPlan:
    """The structure of a safetensors checkpoint (file or directory); raises listing every problem found."""
    root, files, tensors = find_tensors(Path(path))
    raw, source, model_config = read_quant_config(root)
    where = f"{root}/{source}"
    marlin = plan_marlin.is_marlin_config(raw)  # vLLM's quant_method 'marlin' is no method qlinear knows
    method = None if marlin else METHOD.MLX if source == plan_mlx.SOURCE else config_method(raw, where)
    groups: dict[str, dict[str, TensorInfo]] = {}
    for full, info in tensors.items():
        mod, _, leaf = full.rpartition(".")
        groups.setdefault(mod, {})[leaf] = info
    unused: dict[str, TensorInfo] = {}
    try:
        if marlin:
            config = plan_marlin.read_config(raw, where)
            modules, unused, errors = plan_marlin.plan_modules(groups, config, where)
        elif method is METHOD.COMPRESSED_TENSORS:
            config: QuantizeConfig | CompressedTensorsConfig = CompressedTensorsConfig.from_hf_config(raw, where)
            modules, unused, errors = plan_ct.plan_modules(groups, config, where)
        elif method is METHOD.BITSANDBYTES:  # leaves with dots (weight.absmax): planned from the flat list
            config, modules, errors = plan_bnb.plan_modules(tensors, raw, where)
        elif method in FAMILY_PLANNERS:
            planner = importlib.import_module(f"{__package__}.{FAMILY_PLANNERS[method]}")
            config, modules, unused, errors = planner.plan_modules(groups, raw, where)
        elif method is METHOD.QQQ:
            config, source, raw, model_config = read_config(root)
            modules, errors = plan_qqq.plan_modules(groups, config, source)
        elif method is METHOD.FP8:
            fmt = fp8_format(raw, where)
            config = QuantizeConfig(bits=8, group_size=-1, method=METHOD.FP8, checkpoint_format=fmt, extra=raw)
            modules, errors = plan_fp8.plan_modules(groups, raw, where)
        else:
            config, source, raw, model_config = read_config(root)
            plan_one = plan_bitblas.plan_module if config.checkpoint_format is FORMAT.BITBLAS else plan_gptq.plan_module
            modules, errors = plan_gptq.plan_marked(groups, config, source, plan_gptq.MARKERS, plan_one)
    except ConfigError as err:
        raise CheckpointError(f"{where}: {err}" if not str(err).startswith(str(root)) else str(err)) from None
    if errors:
        raise CheckpointError(f"{root}: {len(errors)} quantized module(s) do not match the config:\n"
                              + "\n".join(errors))
    claimed = {f"{m}.{leaf}" for m, mp in modules.items() for leaf in mp.tensors}
    other = {k: v for k, v in tensors.items() if k not in claimed and k not in unused}
    return CheckpointPlan(root, files, config, source, raw, model_config, modules, other, unused)
