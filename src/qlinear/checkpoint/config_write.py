"""The quantization configs qlinear writes: GPTQModel's (GPTQ, AWQ, and the formats built on its config), and those
of compressed-tensors and FP8 checkpoints.

compressed-tensors: one config group per distinct scheme, targeting its modules by exact name (a class
target such as ``Linear`` would also claim the model's unquantized linear layers), each group with its own
``format`` (the model-wide one is that format, or ``mixed-precision``), ``quantization_status:
compressed`` and the layout's version (0.18+, the dense bit stream qlinear writes). FP8: GPTQModel's
``FP8Config`` fields, or transformers' ``FineGrainedFP8Config`` ones.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..activations import ActQuant, ActScales
from ..enums import FORMAT, METHOD
from ..spec import QuantizeConfig, Scheme
from .safetensors_io import CheckpointError

#: compressed-tensors version whose layouts qlinear writes (dense pack-quantized bit stream, no weight_g_idx
#: readers required; 0.18 still reads g_idx).
CT_LAYOUT_VERSION = "0.18.0"


def _strategy(s: Scheme) -> tuple[str, dict[str, Any]]:
    block = s.scale_block or (1, s.group_size)
    k = s.in_features
    if s.per_tensor_scale:
        return "tensor", {"group_size": None}
    if block == (1, k):
        return "channel", {"group_size": None}
    if block[0] == 1:
        return ("tensor_group" if s.format is FORMAT.NVFP4_PACK_QUANTIZED else "group"), {"group_size": block[1]}
    return "block", {"group_size": None, "block_structure": list(block)}


def weight_args(s: Scheme) -> dict[str, Any]:
    strategy, extra = _strategy(s)
    out: dict[str, Any] = {"num_bits": s.bits, "type": "int" if s.element is None else "float",
                           "symmetric": s.sym, "strategy": strategy, "dynamic": False,
                           "actorder": "group" if s.desc_act else None, **extra}
    if s.format is FORMAT.NVFP4_PACK_QUANTIZED:
        out.update(scale_dtype="torch.float8_e4m3fn", zp_dtype="torch.float8_e4m3fn")
    elif s.format is FORMAT.MXFP4_PACK_QUANTIZED:
        out.update(scale_dtype="torch.uint8", zp_dtype="torch.uint8")
    return out


def input_args(a: ActQuant) -> dict[str, Any]:
    dynamic = {ActScales.DYNAMIC: True, ActScales.STATIC: False, ActScales.LOCAL: "local"}[a.scales]
    out: dict[str, Any] = {"num_bits": a.bits, "type": "int" if a.element is None else "float", "symmetric": True,
                           "strategy": a.strategy.value, "dynamic": dynamic, "group_size": a.group_size}
    if a.element is not None and a.bits == 4:
        out.update(scale_dtype="torch.float8_e4m3fn", zp_dtype="torch.float8_e4m3fn")
    return out


def ct_config(schemes: Mapping[str, Scheme]) -> dict[str, Any]:
    """A compressed-tensors ``quantization_config`` for these modules (see the module docstring)."""
    groups: dict[str, dict[str, Any]] = {}
    keys: dict[str, str] = {}
    for name, s in schemes.items():
        if s.method is not METHOD.COMPRESSED_TENSORS:
            raise CheckpointError(f"{name}: {s.format.value} is not a compressed-tensors format")
        scheme = {"weights": weight_args(s),
                  "input_activations": None if s.activations is None else input_args(s.activations),
                  "output_activations": None, "format": s.format.value}
        key = repr(sorted(scheme.items(), key=str))
        if key not in keys:
            keys[key] = f"group_{len(groups)}"
            groups[keys[key]] = {"targets": [], **scheme}
        groups[keys[key]]["targets"].append(name)
    formats = {g["format"] for g in groups.values()}
    return {"quant_method": "compressed-tensors", "format": formats.pop() if len(formats) == 1 else "mixed-precision",
            "quantization_status": "compressed", "config_groups": groups, "ignore": [],
            "kv_cache_scheme": None, "global_compression_ratio": None, "version": CT_LAYOUT_VERSION}


def fp8_config(schemes: Mapping[str, Scheme]) -> dict[str, Any]:
    """GPTQModel's (``fp8``) or transformers' (``hf_fp8``) FP8 config; every module must share it."""
    first_name, first = next(iter(schemes.items()))
    for name, s in schemes.items():
        if (s.format, s.element, s.scale_block, s.activations) != (first.format, first.element,
                                                                   _block_of(first, s), first.activations):
            raise CheckpointError(f"{name}: its FP8 scheme differs from {first_name}'s; an FP8 config states one for "
                                  "all modules (write a compressed-tensors format to mix them)")
    block = first.scale_block
    if first.format is FORMAT.HF_FP8:
        return {"quant_method": "fp8", "fmt": "e4m3" if first.element.value.endswith("e4m3fn") else "e5m2",
                "activation_scheme": "dynamic", "weight_block_size": list(block)}
    method = "tensor" if first.per_tensor_scale else ("row" if block == (1, first.in_features) else "block")
    return {"quant_method": "fp8", "bits": 8, "format": first.element.value, "checkpoint_format": "fp8",
            "weight_scale_method": method, "weight_block_size": list(block) if method == "block" else None,
            "weight_scale_semantics": "inverse", "group_size": -1, "desc_act": False, "sym": True}


def _block_of(first: Scheme, s: Scheme) -> tuple[int, int] | None:
    """``s``'s block, stated in ``first``'s terms where the two are the same strategy on different shapes."""
    if first.per_tensor_scale:
        return (s.out_features, s.in_features) if s.scale_block == (s.out_features, s.in_features) else s.scale_block
    if first.scale_block == (1, first.in_features):
        return (1, first.in_features) if s.scale_block == (1, s.in_features) else s.scale_block
    return s.scale_block


def quantization_config(schemes: Mapping[str, Scheme], version: str,
                        meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The quantization config GPTQModel writes, with a ``dynamic`` rule for each module unlike the rest.

    ``meta`` (a source checkpoint's) is kept, with ``qlinear:<version>`` appended to ``meta.quantizer``:
    the provenance stays true, and GPTQModel reads asymmetric v1 (``gptq``) files only when it finds
    ``gptqmodel:>=0.9`` there (older AutoGPTQ v1 files could hold the zero-point borrow bug).
    """
    def key(s: Scheme) -> tuple[int, int, bool, bool]:
        return s.bits, -1 if s.channelwise else s.group_size, s.sym, s.desc_act

    if not schemes:
        raise CheckpointError("nothing to save: no quantized modules")
    first = next(iter(schemes.values()))
    bits, group_size, sym, desc_act = Counter(map(key, schemes.values())).most_common(1)[0][0]
    base = QuantizeConfig(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, method=first.method,
                          checkpoint_format=first.format, pack_dtype=first.pack_dtype)
    dynamic = {}
    for name, s in schemes.items():
        if base.scheme(s.in_features, s.out_features) != s:
            b, g, y, d = key(s)
            dynamic[f"+:^{re.escape(name)}$"] = {"bits": b, "group_size": g, "sym": y, "desc_act": d}
    fmt, method = first.format.value, first.method.value
    out: dict[str, Any] = {"bits": bits, "group_size": group_size, "desc_act": desc_act,
                           "lm_head": any(n.split(".")[-1] == "lm_head" for n in schemes),
                           "method": method, "quant_method": method, "format": fmt, "checkpoint_format": fmt,
                           "pack_dtype": str(first.pack_dtype).removeprefix("torch.")}
    if first.method is METHOD.AWQ:
        out.update(zero_point=not sym, version=fmt)
    else:
        out["sym"] = sym
    if first.format is FORMAT.MARLIN:  # AutoGPTQ 0.7 (its last release) reads this flag, not checkpoint_format
        out["is_marlin_format"] = True
    if dynamic:
        out["dynamic"] = dynamic
    meta = dict(meta or {})
    quantizer = meta.get("quantizer") or []
    quantizer = [quantizer] if isinstance(quantizer, str) else list(quantizer)
    meta["quantizer"] = [*(q for q in quantizer if not str(q).startswith("qlinear:")), f"qlinear:{version}"]
    out["meta"] = meta
    return out
