"""Plan the quantized modules of a compressed-tensors checkpoint from its config and safetensors headers.

Each module holding compressed-tensors weight tensors is matched to its config group (``ct_config``), its
shape read off the tensors (for ``pack-quantized`` from the 2-value ``weight_shape`` tensor, the only
data read while planning), and every tensor checked against what the group's scheme says. KV-cache
scales (``k_scale``, ``v_scale`` of attention modules) belong to attention, not to a linear layer:
they are listed as unused and never loaded.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..ct_config import CompressedTensorsConfig
from ..enums import FORMAT
from ..layouts import ct_int, float_layouts
from ..spec import ConfigError, Scheme
from .module_plan import ModulePlan, checked_plan
from .safetensors_io import CheckpointError, TensorInfo, read_tensor

#: Leaf names that mark a module as compressed-tensors quantized.
MARKERS = frozenset({"weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "weight_g_idx"})
#: Attention-side scales of a ``kv_cache_scheme``: not part of any linear layer.
KV_CACHE_LEAVES = frozenset({"k_scale", "v_scale", "q_scale", "kv_cache_scale"})
ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _shape(name: str, fmt: FORMAT, leaves: Mapping[str, TensorInfo]) -> tuple[int, int]:
    """(out_features, in_features) of a module, from the tensor that states them."""
    if fmt is FORMAT.PACK_QUANTIZED:
        info = leaves.get("weight_shape")
        if info is None or info.shape != (2,) or info.dtype not in (torch.int64, torch.int32):
            found = "missing" if info is None else info.describe()
            raise CheckpointError(f"{name}.weight_shape: expected int64 [2] (out, in) for pack-quantized, {found}")
        n, k = (int(v) for v in read_tensor(info).tolist())
        return n, k
    key = "weight_packed" if fmt in float_layouts.FP4_FORMATS else "weight"
    info = leaves.get(key)
    if info is None or len(info.shape) != 2:
        found = "missing" if info is None else info.describe()
        raise CheckpointError(f"{name}.{key}: expected a 2-D tensor for {fmt.value}, {found}")
    n, k = info.shape
    return n, 2 * k if fmt in float_layouts.FP4_FORMATS else k


def _legacy_from_shape(scheme: Scheme, leaves: Mapping[str, TensorInfo], cfg: CompressedTensorsConfig) -> Scheme:
    """Without a version, tell the pre-0.18 padded words from the dense stream by the packed width."""
    if cfg.version is not None or scheme.format is not FORMAT.PACK_QUANTIZED or 32 % scheme.bits == 0:
        return scheme
    cols = leaves["weight_packed"].shape[-1] if "weight_packed" in leaves else None
    k, b = scheme.in_features, scheme.bits
    if cols == ct_int.words_along(k, b, True) != ct_int.words_along(k, b, False):
        from dataclasses import replace

        return replace(scheme, legacy_packing=True)
    return scheme


def plan_module(name: str, leaves: Mapping[str, TensorInfo], cfg: CompressedTensorsConfig, source: str) -> ModulePlan:
    """Resolve and check one module; raises listing every problem, each naming the tensor."""
    group = cfg.group_for(name)
    if group is None:
        why = "it is in the ignore list" if cfg.ignored(name) else "no config group targets it"
        raise CheckpointError(f"{name}: holds quantized tensors ({', '.join(sorted(MARKERS & leaves.keys()))}) but "
                              f"{why} in {source}")
    try:
        fmt = FORMAT(cfg.module_format(group))
        n, k = _shape(name, fmt, leaves)
        scheme = _legacy_from_shape(cfg.scheme(group, k, n), leaves, cfg)
        layout = ct_int if scheme.element is None else float_layouts
        if scheme.element is None and fmt not in ct_int.INT_FORMATS:
            raise ConfigError(f"format {fmt.value} holds float codes but group {group.name!r} quantizes to int")
        expected = dict(layout.checkpoint_shapes(scheme))
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: {source}: {err}") from None
    act = scheme.activations
    for leaf in () if act is None else act.tensor_names:
        expected[leaf] = ((1,), ACT_DTYPES)
    what = (f"config group {group.name!r}: {fmt.value} {scheme.bits}-bit "
            f"{scheme.element.value if scheme.element else 'int'} block {scheme.scale_block}"
            f"{'' if act is None else ', activations ' + act.describe()}, in {source}")
    return checked_plan(name, leaves, scheme, expected, what)


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], cfg: CompressedTensorsConfig,
                 source: str) -> tuple[dict[str, ModulePlan], dict[str, TensorInfo], list[str]]:
    """Every quantized module, the KV-cache scales set aside (full name -> info), and every problem found."""
    modules: dict[str, ModulePlan] = {}
    unused: dict[str, TensorInfo] = {}
    errors: list[str] = []
    for mod, leaves in sorted(groups.items()):
        for leaf in KV_CACHE_LEAVES & leaves.keys():
            unused[f"{mod}.{leaf}"] = leaves[leaf]
        if not MARKERS & leaves.keys():
            continue
        try:
            modules[mod] = plan_module(mod, leaves, cfg, source)
        except CheckpointError as err:
            errors.append(str(err))
    return modules, unused, errors
