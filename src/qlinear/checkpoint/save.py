"""Save quantized layers (or a model holding them) as a checkpoint directory GPTQModel and transformers read.

Every layer is converted to the target format through ``convert.convert_tensors`` (lossless or
refused) *before* anything is written, and a refusal lists every module that cannot be expressed.
The directory is written into a temporary sibling and renamed into place, so a failure at any
point leaves the destination as it was and no half-written directory behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..convert import ConversionError, convert_tensors
from ..enums import FORMAT, METHOD
from ..kernels.base import QuantLinear
from ..mlx_convert import mlx_config
from ..paro_convert import paro_config
from ..spec import Scheme, method_of
from ..version import __version__
from .config_write import ct_config, fp8_config, quantization_config
from .plan_bnb import bnb_config
from .safetensors_io import CheckpointError, write_file

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(value: int | str) -> int:
    """``4GB``, ``500MB``, ``48KiB`` or a byte count -> bytes (decimal units, as transformers reads them)."""
    if isinstance(value, int):
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B)?\s*", value.upper())
    if not m:
        raise ValueError(f"max_shard_size: cannot read {value!r}; use e.g. 4GB, 500MB or a byte count")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def _collect(source: Mapping[str, QuantLinear] | nn.Module) -> tuple[dict[str, QuantLinear], dict[str, torch.Tensor]]:
    """Quantized layers by name, and (for a model) every other tensor of its state dict."""
    if isinstance(source, Mapping):
        bad = [name for name, layer in source.items() if not isinstance(layer, QuantLinear)]
        if bad:
            raise TypeError(f"not QuantLinear layers: {', '.join(bad)}")
        return dict(source), {}
    if isinstance(source, QuantLinear):
        raise TypeError("pass {name: layer} or the model holding the layer, so the layer has a name in the checkpoint")
    if not isinstance(source, nn.Module):
        raise TypeError(f"expected a mapping of name -> QuantLinear or an nn.Module, got {type(source).__name__}")
    layers: dict[str, QuantLinear] = {}
    for name, m in source.named_modules():
        if isinstance(m, QuantLinear) and not any(name.startswith(p + ".") for p in layers):
            layers[name] = m
    other = {k: v for k, v in source.state_dict().items() if k.rpartition(".")[0] not in layers}
    return layers, other


def _layer_tensors(layer: QuantLinear) -> dict[str, torch.Tensor] | None:
    """The layer's checkpoint tensors (its state dict), or None if the kernel released them after prepare()."""
    if layer.checkpoint_released:
        return None
    return {k: v.detach().cpu() for k, v in layer.state_dict().items()}


def convert_modules(modules: Mapping[str, tuple[Mapping[str, torch.Tensor] | None, Scheme]], to: FORMAT | str,
                    pack_dtype: torch.dtype | None = None) -> dict[str, tuple[dict[str, torch.Tensor], Scheme]]:
    """Convert every module or refuse, listing ALL modules that cannot be expressed in ``to`` without loss."""
    to = FORMAT(to)
    out: dict[str, tuple[dict[str, torch.Tensor], Scheme]] = {}
    problems: list[str] = []
    for name, (tensors, scheme) in modules.items():
        if tensors is None:
            problems.append(f"  {name}: its checkpoint tensors were released after prepare(); rebuild the layer "
                            "with them kept to save it")
            continue
        try:
            out[name] = convert_tensors(tensors, scheme, to, pack_dtype)
        except (ConversionError, ValueError) as err:
            problems.append(f"  {name}: {err}")
    if problems:
        raise ConversionError(f"cannot write {to.value}: {len(problems)} of {len(modules)} quantized modules cannot "
                              "be expressed in it without loss; nothing was written:\n" + "\n".join(problems))
    return out


def config_for(schemes: Mapping[str, Scheme], version: str, meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The quantization config of a checkpoint holding these modules, in their format family's own terms."""
    if not schemes:
        raise CheckpointError("nothing to save: no quantized modules")
    method = method_of(next(iter(schemes.values())).format)
    if method is METHOD.COMPRESSED_TENSORS:
        return ct_config(schemes)
    if method is METHOD.FP8:
        return fp8_config(schemes)
    if method is METHOD.BITSANDBYTES:
        return bnb_config(schemes)
    if method is METHOD.MLX:
        return mlx_config(schemes)
    if method is METHOD.PAROQUANT:
        return paro_config(schemes, version, meta)
    return quantization_config(schemes, version, meta)


def _shards(tensors: Mapping[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        n = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + n > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += n
    return shards


def _write_all(tmp: Path, tensors: Mapping[str, torch.Tensor], quant: Mapping[str, Any],
               config: Mapping[str, Any] | None, limit: int, extra_files: Iterable[str | Path]) -> None:
    shards = _shards(tensors, limit)
    if len(shards) == 1:
        write_file(tmp / "model.safetensors", shards[0])
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards, 1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            total += write_file(tmp / fname, shard)
            weight_map.update(dict.fromkeys(shard, fname))
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    from .plan_mlx import is_mlx_quantization

    if is_mlx_quantization(quant):  # mlx-lm: config.json only, as "quantization" and again as quantization_config
        model = {k: v for k, v in (config or {}).items() if k not in ("quantization", "quantization_config")}
        (tmp / "config.json").write_text(json.dumps({**model, "quantization": quant, "quantization_config": quant},
                                                    indent=4) + "\n")
        config = None
    # compressed-tensors, FP8 and bitsandbytes checkpoints keep their config in config.json only (as their
    # producers write them)
    elif config is None or quant.get("quant_method") not in ("compressed-tensors", "fp8", "bitsandbytes"):
        (tmp / "quantize_config.json").write_text(json.dumps(quant, indent=2) + "\n")
    if config is not None:
        (tmp / "config.json").write_text(json.dumps({**config, "quantization_config": quant}, indent=2) + "\n")
    for f in map(Path, extra_files):
        if (tmp / f.name).exists():
            raise CheckpointError(f"{f}: would overwrite {f.name}, which the checkpoint writes itself")
        shutil.copy2(f, tmp / f.name)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(tensors: Mapping[str, torch.Tensor], quant: Mapping[str, Any], out_dir: str | Path, *,
                     config: Mapping[str, Any] | None = None, extra_files: Iterable[str | Path] = (),
                     max_shard_size: int | str = "4GB", overwrite: bool = False) -> Path:
    """Write a checkpoint directory atomically: into a temporary sibling, then renamed into place."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out}: already exists; pass overwrite=True (--overwrite) to replace it")
    limit = parse_size(max_shard_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        _write_all(tmp, tensors, quant, config, limit, extra_files)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / out.name)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old / out.name, out)
                old.rmdir()
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        _fsync_dir(out.parent)  # the rename itself survives a power cut, not only the files' bytes
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def save_checkpoint(layers_or_model: Mapping[str, QuantLinear] | nn.Module, out_dir: str | Path,
                    format: FORMAT | str = FORMAT.GPTQ_V2, *, pack_dtype: torch.dtype | None = None,
                    config: Mapping[str, Any] | None = None, extra_tensors: Mapping[str, torch.Tensor] | None = None,
                    max_shard_size: int | str = "4GB", overwrite: bool = False) -> Path:
    """Write ``{name: layer}`` (or every QuantLinear of a model, plus its other tensors) as ``format``.

    Writes ``model.safetensors`` (shards + ``model.safetensors.index.json`` past ``max_shard_size``),
    ``quantize_config.json``, and ``config.json`` with ``quantization_config`` when a model config is
    given (``config``, or a transformers model's own ``.config``). Raises ``ConversionError`` listing
    every module that ``format`` cannot hold without loss; nothing is written then.
    """
    layers, other = _collect(layers_or_model)
    converted = convert_modules({n: (_layer_tensors(m), m.scheme) for n, m in layers.items()}, format, pack_dtype)
    tensors = {**other, **(extra_tensors or {})}
    for name, (t, _) in converted.items():
        for leaf, value in t.items():
            tensors[f"{name}.{leaf}"] = value
    quant = config_for({n: s for n, (_, s) in converted.items()}, __version__)
    if config is None and isinstance(layers_or_model, nn.Module) and hasattr(layers_or_model, "config"):
        to_dict = getattr(layers_or_model.config, "to_dict", None)
        config = to_dict() if callable(to_dict) else None
    return write_checkpoint(tensors, quant, out_dir, config=config, max_shard_size=max_shard_size,
                            overwrite=overwrite)


#: Files a checkpoint directory's weights and quantization config live in; everything else is carried over.
_OWN_FILES = re.compile(r".*\.safetensors|.*\.safetensors\.index\.json|config\.json|quantize_config\.json|"
                        r"quant_config\.json|.*\.(bin|pt|pth|ckpt|pkl|pickle|gguf)")


def convert_checkpoint(src: str | Path, dst: str | Path, format: FORMAT | str, *,
                       pack_dtype: torch.dtype | None = None, max_shard_size: int | str = "4GB",
                       overwrite: bool = False) -> Path:
    """Re-encode every quantized module of the checkpoint ``src`` as ``format`` into ``dst``, all or nothing.

    Other tensors are copied unchanged, config.json keeps its model fields with a new
    quantization_config, and the other files of ``src`` (tokenizer, generation config) come along.
    """
    from .load import read_module
    from .plan import plan_checkpoint
    from .safetensors_io import read_tensor

    plan = plan_checkpoint(src)
    sources = {n: read_module(mp) for n, mp in plan.modules.items()}
    converted = convert_modules(sources, format, pack_dtype)
    tensors = {name: read_tensor(info) for name, info in plan.other.items()}
    for name, (t, _) in converted.items():
        tensors.update({f"{name}.{leaf}": value for leaf, value in t.items()})
    if all(s == plan.modules[n].scheme for n, (_, s) in converted.items()):
        quant = dict(plan.quant_config)  # nothing changed: the config as written, so the copy is byte for byte
        tensors.update({name: read_tensor(info) for name, info in plan.unused.items()})
    else:
        meta = plan.quant_config.get("meta")
        quant = config_for({n: s for n, (_, s) in converted.items()}, __version__,
                           meta if isinstance(meta, Mapping) else None)
    carried = [] if Path(src).is_file() else sorted(
        p for p in plan.root.iterdir() if p.is_file() and not _OWN_FILES.fullmatch(p.name))
    return write_checkpoint(tensors, quant, dst, config=plan.model_config, extra_files=carried,
                            max_shard_size=max_shard_size, overwrite=overwrite)
