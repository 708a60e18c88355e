"""Plan the modules of a VPTQ checkpoint (``quant_method: vptq`` as Microsoft VPTQ writes it).

The config names every quantized module's ``VQuantLinear`` arguments: ``config_for_layers`` by full module name, or
``shared_layer_config`` by the module's last name component (``q_proj``) for every layer alike. Per layer:
``in_features``, ``out_features``, ``vector_lens`` / ``num_centroids`` / ``num_res_centroids`` (each ``[outlier,
main]``, ``-1`` off), ``group_num``, ``group_size``, ``outlier_size``, ``enable_norm``, ``enable_perm``,
``is_indice_packed`` (must be true: the released checkpoints pack their codes), ``indices_as_float`` (must be
false), ``vector_quant_dim`` (``out``) and ``bias`` (the tensors decide, as in transformers' VPTQ loader, which
takes it from the model; a ``bias: true`` without the tensor is refused). Tensors (``layouts/vptq.py``):
``indices``, ``perm``, ``outlier_indices``, ``weight_scale``, ``weight_bias``, ``bias`` and the codebooks
``centroids.weight``, ``res_centroids.weight``, ``outlier_centroids.weight``; the codebooks' dtype is the layer's.
transformers' ``VptqLayerConfig`` may omit ``in_features``/``out_features`` (it takes them from the model); such
entries are refused, naming the key.

GPTQModel's own VPTQ config (``vector_lens`` etc. at the top level, no per-layer entries) records no layer shapes,
which its packed tensors do not determine either (``indices`` rounds ``out_features`` up to the vector length), so
it is refused with that reason; ``VPTQLinear`` runs GPTQModel's tensors when given their ``VptqParams``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..enums import FORMAT, METHOD
from ..layouts import vptq
from ..spec import QuantizeConfig, Scheme
from .module_plan import ModulePlan, bias_errors, leaf_errors
from .safetensors_io import CheckpointError, TensorInfo

TABLES = ("centroids", "res_centroids", "outlier_centroids")
KNOWN = {"in_features", "out_features", "vector_lens", "num_centroids", "num_res_centroids", "group_num",
         "group_size", "outlier_size", "indices_as_float", "enable_norm", "enable_perm", "is_indice_packed", "bias",
         "vector_quant_dim", "enable_proxy_error"}


def _int(entry: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where}: {key}: expected an integer, found {value!r}")
    return value


def _pair(entry: Mapping[str, Any], key: str, where: str, default: list[int] | None = None) -> tuple[int, int]:
    value = entry.get(key, default)
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise CheckpointError(f"{where}: {key}: expected [outlier, main], two integers, found {value!r}")
    return int(value[0]), int(value[1])


def _bool(entry: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    value = entry.get(key, default)
    if not isinstance(value, bool):
        raise CheckpointError(f"{where}: {key}: expected true or false, found {value!r}")
    return value


def layer_scheme(entry: Mapping[str, Any], codebook_dtype: torch.dtype, where: str) -> Scheme:
    """One ``config_for_layers`` entry as a Scheme with its ``VptqParams``."""
    if not isinstance(entry, Mapping):
        raise CheckpointError(f"{where}: expected a JSON object of VQuantLinear arguments, found {entry!r}")
    unknown = sorted(set(entry) - KNOWN)
    if unknown:
        raise CheckpointError(f"{where}: unknown VQuantLinear argument(s) {', '.join(unknown)}")
    if not _bool(entry, "is_indice_packed", where, False):
        raise CheckpointError(f"{where}: is_indice_packed false (int16 codes with separate res_indices) is not read; "
                              "the released VPTQ checkpoints pack their codes")
    if _bool(entry, "indices_as_float", where, False):
        raise CheckpointError(f"{where}: indices_as_float true is not read (packed checkpoints store int32 codes)")
    if entry.get("vector_quant_dim", "out") != "out":
        raise CheckpointError(f"{where}: vector_quant_dim {entry['vector_quant_dim']!r}: VPTQ implements 'out' only")
    k, n = _int(entry, "in_features", where), _int(entry, "out_features", where)
    vo, v = _pair(entry, "vector_lens", where)
    co, c = _pair(entry, "num_centroids", where)
    _, r = _pair(entry, "num_res_centroids", where, [-1, -1])
    os_ = _int(entry, "outlier_size", where, 0)
    outlier = vo > 1 and co > 0  # VQuantLinear's own rule
    if os_ > 0 and not outlier:
        raise CheckpointError(f"{where}: outlier_size {os_} without an outlier codebook (vector_lens[0] {vo}, "
                              f"num_centroids[0] {co})")
    if outlier and os_ == 0:
        raise CheckpointError(f"{where}: an outlier codebook with outlier_size 0 is not read")
    try:
        params = vptq.VptqParams(vector_len=v, num_centroids=c, group_num=_int(entry, "group_num", where),
                                 group_size=_int(entry, "group_size", where), num_res_centroids=r,
                                 outlier_size=os_, outlier_vector_len=vo, outlier_num_centroids=co,
                                 enable_norm=_bool(entry, "enable_norm", where, False),
                                 enable_perm=_bool(entry, "enable_perm", where, False),
                                 codebook_dtype=codebook_dtype, aux_dtype=torch.int16)
        scheme = Scheme(bits=params.nominal_bits(), group_size=-1, in_features=k, out_features=n,
                        method=METHOD.VPTQ, format=FORMAT.VPTQ, layout_params=params)
        errors = vptq.shape_errors(params, k, n)
    except ValueError as err:
        raise CheckpointError(f"{where}: {err}") from None
    if errors:
        raise CheckpointError(f"{where}: " + "; ".join(errors))
    return scheme


def module_leaves(name: str, groups: Mapping[str, Mapping[str, TensorInfo]]) -> dict[str, TensorInfo]:
    """The module's own tensors plus its codebooks' (``centroids.weight`` ...)."""
    leaves = dict(groups.get(name, {}))
    for table in TABLES:
        for leaf, info in groups.get(f"{name}.{table}", {}).items():
            leaves[f"{table}.{leaf}"] = info
    return leaves


def plan_module(name: str, leaves: Mapping[str, TensorInfo], entry: Mapping[str, Any], where: str) -> ModulePlan:
    cb = leaves.get("centroids.weight")
    if cb is None or cb.dtype not in vptq.FLOAT_DTYPES:
        found = "nothing" if cb is None else cb.describe()
        raise CheckpointError(f"{name}.centroids.weight: expected a float16/bfloat16/float32 codebook, found {found}")
    scheme = layer_scheme(entry, cb.dtype, f"{where} ({name})")
    expected = vptq.checkpoint_shapes(scheme)
    what = f"{vptq.describe(scheme)}, in_features {scheme.in_features} out_features {scheme.out_features}"
    problems = leaf_errors(name, leaves, expected, what) + bias_errors(name, leaves, scheme.out_features)
    if entry.get("bias") is True and "bias" not in leaves:  # a bias tensor the config omits is used, as
        problems.append(f"{name}.bias: missing (the config says bias true)")  # transformers' loader does
    if problems:
        raise CheckpointError("\n".join(problems))
    return ModulePlan(name, scheme, dict(leaves))


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], raw: Mapping[str, Any], where: str
                 ) -> tuple[QuantizeConfig, dict[str, ModulePlan], dict[str, TensorInfo], list[str]]:
    """The config, every VPTQ module, no set-aside tensors, and every problem found (each naming the module)."""
    per_layer, shared = raw.get("config_for_layers", {}), raw.get("shared_layer_config", {})
    if not per_layer and not shared:
        why = (" (GPTQModel's VPTQ config: it records no layer shapes, and the packed tensors round out_features "
               "up to the vector length)" if "vector_lens" in raw else "")
        raise CheckpointError(f"{where}: a VPTQ config needs config_for_layers or shared_layer_config{why}")
    for key, value in (("config_for_layers", per_layer), ("shared_layer_config", shared)):
        if not isinstance(value, Mapping):
            raise CheckpointError(f"{where}: {key}: expected a JSON object, found {type(value).__name__}")
    entries: dict[str, Mapping[str, Any]] = dict(per_layer)
    for mod, leaves in groups.items():
        tail = mod.rpartition(".")[2]
        if mod not in entries and tail in shared and "indices" in leaves:
            entries[mod] = shared[tail]
    modules: dict[str, ModulePlan] = {}
    errors: list[str] = []
    for name, entry in sorted(entries.items()):
        leaves = module_leaves(name, groups)
        if not leaves:
            errors.append(f"{name}: named in {where} but the checkpoint has no tensors for it")
            continue
        try:
            modules[name] = plan_module(name, leaves, entry, where)
        except CheckpointError as err:
            errors.append(str(err))
    stray = sorted(m for m, leaves in groups.items() if "indices" in leaves and m not in entries)
    errors += [f"{m}.indices: a VPTQ module the config does not describe ({where})" for m in stray]
    bits = max((mp.scheme.bits for mp in modules.values()), default=2)
    config = QuantizeConfig(bits=bits, group_size=-1, method=METHOD.VPTQ, checkpoint_format=FORMAT.VPTQ,
                            extra=dict(raw))
    return config, modules, {}, errors


__all__ = ["layer_scheme", "plan_modules"]
