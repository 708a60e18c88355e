"""Plan the modules of a Marlin-format checkpoint from its config and safetensors headers.

What such checkpoints hold, by producer and reader:

* AutoGPTQ (``MarlinQuantLinear``: 0.7 with ``is_marlin_format: true``, 0.8 with ``checkpoint_format: "marlin"``,
  ``quant_method: "gptq"``) and vLLM's legacy ``marlin`` method (which also accepts ``quant_method: "marlin"`` and
  reads ``group_size`` and ``lm_head``): per module ``B`` int32 ``[K/16, 2N]``, ``s`` float16 ``[G, N]``, optional
  ``bias``; 4-bit, symmetric, no act-order (AutoGPTQ forces ``desc_act`` off for this format, as qlinear does:
  the tiles carry no g_idx). vLLM registers a ``workspace`` parameter that a saved state dict may hold: it is
  scratch, listed as unused and never loaded. Decoded by ``layouts.marlin_weight``.
* GPTQModel 7.7 no longer writes the format ("FORMAT.MARLIN is deprecated for quantization") and reads a
  ``format: marlin`` config through its GPTQ-layout Marlin holder: ``qweight``, ``qzeros`` (v1), ``scales``,
  ``g_idx`` (AWQ: the ``gemm`` tensors). Such modules are planned as ``gptq`` (v1) or ``gemm``, as GPTQModel reads them.

A module is one or the other by its tensor names (``B`` or ``qweight``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..enums import FORMAT, METHOD
from ..layouts import marlin, marlin_weight
from ..spec import ConfigError, QuantizeConfig
from .module_plan import ModulePlan, bias_errors, leaf_errors
from .plan_gptq import MARKERS as LAYOUT_MARKERS
from .plan_gptq import plan_module, quantized_config
from .safetensors_io import CheckpointError, TensorInfo

#: Leaf names that mark a module as a Marlin tile module.
MARKERS = frozenset({"B"})
#: vLLM's Marlin scratch buffer: saved by some state dicts, never part of the weight.
SCRATCH = frozenset({"workspace"})
FORMAT_KEYS = ("checkpoint_format", "format")


def is_marlin_config(raw: Mapping[str, Any]) -> bool:
    """True when a quantization config says Marlin: ``checkpoint_format``/``format`` ``marlin``, ``quant_method``
    ``marlin`` (vLLM's spelling) or ``is_marlin_format: true`` (AutoGPTQ <= 0.7)."""
    named = [str(raw.get(k)).lower() for k in FORMAT_KEYS if raw.get(k)]
    return "marlin" in named or str(raw.get("quant_method", "")).lower() == "marlin" \
        or raw.get("is_marlin_format") is True


def read_config(raw: Mapping[str, Any], where: str) -> QuantizeConfig:
    """The config as a ``QuantizeConfig`` with ``checkpoint_format`` marlin (GPTQ unless ``quant_method: awq``)."""
    named = {str(raw.get(k)).lower() for k in FORMAT_KEYS if raw.get(k)}
    if named - {"marlin"}:
        raise CheckpointError(f"{where}: the config marks a Marlin checkpoint (quant_method "
                              f"{raw.get('quant_method')!r}, is_marlin_format {raw.get('is_marlin_format')!r}) but "
                              f"also names checkpoint_format {', '.join(sorted(named))}; it cannot be both")
    method = METHOD.AWQ if str(raw.get("quant_method", "")).lower() == "awq" else METHOD.GPTQ
    try:
        if method is METHOD.AWQ:
            sym = bool(raw["sym"]) if "sym" in raw else not bool(raw.get("zero_point", True))
        else:
            sym = bool(raw.get("sym", True))
        known = {"bits", "w_bit", "group_size", "q_group_size", "sym", "zero_point", "desc_act", "quant_method",
                 "pack_dtype", *FORMAT_KEYS}
        return QuantizeConfig(bits=int(raw.get("bits", raw.get("w_bit", marlin_weight.LEGACY_BITS))),
                              group_size=int(raw.get("group_size", raw.get("q_group_size", -1))), sym=sym,
                              desc_act=bool(raw.get("desc_act", False)), method=method,
                              checkpoint_format=FORMAT.MARLIN, pack_dtype=raw.get("pack_dtype"),
                              extra={k: v for k, v in raw.items() if k not in known})
    except (ConfigError, ValueError, TypeError) as err:
        raise CheckpointError(f"{where}: {err}") from None


def plan_tile_module(name: str, leaves: Mapping[str, TensorInfo], config: QuantizeConfig,
                     source: str) -> ModulePlan:
    """One module holding Marlin tiles (``B``, ``s``); raises listing every problem, each naming the tensor."""
    if config.method is not METHOD.GPTQ:
        raise CheckpointError(f"{name}: holds Marlin tiles (B) but {source} says quant_method "
                              f"{config.method.value!r}; Marlin tile checkpoints are GPTQ (symmetric, 4-bit)")
    b = leaves["B"]
    if len(b.shape) != 2:
        raise CheckpointError(f"{name}.B: expected a 2-D [in_features/16, out_features*16*bits/32] tensor, "
                              f"found {b.describe()}")
    pf = 32 // config.bits if config.bits in marlin.MARLIN_BITS else 8
    k, n = b.shape[0] * marlin.TILE_K, b.shape[1] * pf // marlin.TILE_K
    cfg = dataclasses.replace(config, desc_act=False)  # no g_idx in the tiles: AutoGPTQ forces this off too
    try:
        scheme = cfg.scheme(k, n)
        shapes = marlin_weight.checkpoint_shapes(scheme)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: in_features {k}, out_features {n} (from B) with the config in {source}: "
                              f"{err}") from None
    expected = {"B": (shapes["B"][0], (torch.int32,)), "s": (shapes["s"][0], (torch.float16, torch.bfloat16))}
    what = (f"a Marlin {scheme.bits}-bit group_size {config.group_size} module needs B, s (+ optional bias), "
            f"in_features {k} out_features {n}, from {source}")
    errors = leaf_errors(name, leaves, expected, what, optional=("bias", *SCRATCH)) + bias_errors(name, leaves, n)
    if errors:
        raise CheckpointError("\n".join(errors))
    return ModulePlan(name, scheme, {leaf: info for leaf, info in leaves.items() if leaf not in SCRATCH})


def _holder_config(config: QuantizeConfig) -> QuantizeConfig:
    """GPTQModel's reading of ``format: marlin`` over GPTQ/AWQ tensors: GPTQ v1 (``gptq``) or AWQ ``gemm``."""
    return dataclasses.replace(config, checkpoint_format=FORMAT.GEMM if config.method is METHOD.AWQ else FORMAT.GPTQ)


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], config: QuantizeConfig, source: str
                 ) -> tuple[dict[str, ModulePlan], dict[str, TensorInfo], list[str]]:
    """Every quantized module (tile modules and GPTQ/AWQ-layout ones), vLLM's workspaces set aside (full name ->
    info), and every problem found."""
    modules: dict[str, ModulePlan] = {}
    unused: dict[str, TensorInfo] = {}
    errors: list[str] = []
    for mod, leaves in sorted(groups.items()):
        tiles = bool(MARKERS & leaves.keys())
        if not tiles and not LAYOUT_MARKERS & leaves.keys():
            continue
        try:
            cfg = quantized_config(config, mod, source)
            if tiles:
                unused.update({f"{mod}.{leaf}": leaves[leaf] for leaf in SCRATCH & leaves.keys()})
                modules[mod] = plan_tile_module(mod, leaves, cfg, source)
            else:
                modules[mod] = plan_module(mod, leaves, _holder_config(cfg), source)
        except CheckpointError as err:
            errors.append(str(err))
    return modules, unused, errors
