"""Plan the modules of a ParoQuant checkpoint (``quant_method: paroquant``, as paroquant 0.1.16's converter and
GPTQModel 7.7.0 both write it).

paroquant's config holds ``bits``, ``group_size`` and ``krot`` only; GPTQModel's adds ``format: paroquant``,
``sym``, ``desc_act``, its optimiser settings and ``dynamic`` per-module rules (applied as for GPTQ). Each
quantized linear module stores ``qweight``/``qzeros``/``scales`` (AWQ GEMM, 4-bit) and ``theta``/``pairs``/
``channel_scales`` (``layouts/paroquant.py``), plus an optional bias. The shape comes from ``qweight
[K, N/8]``, the rounds from ``theta`` (checked against the config's ``krot``). paroquant's fused MoE experts keep
one rotation per projection beside per-expert codes (``...gate_up_weight_theta``); they are not planned here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..enums import FORMAT, METHOD
from ..layouts import awq, paroquant
from ..spec import ConfigError, QuantizeConfig
from .module_plan import ModulePlan, checked_plan
from .plan_gptq import plan_marked
from .safetensors_io import CheckpointError, TensorInfo

MARKERS = frozenset({"qweight", "theta", "pairs"})
ALLOWED = {"scales": awq.SCALE_DTYPES, "theta": paroquant.ROTATION_DTYPES,
           "channel_scales": paroquant.ROTATION_DTYPES}


def read_config(raw: Mapping[str, Any], where: str) -> QuantizeConfig:
    """The checkpoint's config as a ``QuantizeConfig`` (``krot`` kept in ``extra``)."""
    fmt = raw.get("checkpoint_format") or raw.get("format")
    if fmt is not None and fmt != FORMAT.PAROQUANT.value:
        raise CheckpointError(f"{where}: format {fmt!r} is not a ParoQuant checkpoint format (expected 'paroquant')")
    krot = raw.get("krot", 8)
    try:
        paroquant.ParoParams(krot)
        config = QuantizeConfig(bits=raw.get("bits", 4), group_size=raw.get("group_size", 128),
                                sym=raw.get("sym", True), desc_act=raw.get("desc_act", False),
                                method=METHOD.PAROQUANT, checkpoint_format=FORMAT.PAROQUANT,
                                pack_dtype=raw.get("pack_dtype"),
                                extra={k: v for k, v in raw.items() if k not in ("bits", "group_size", "sym",
                                                                                  "desc_act", "pack_dtype")})
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{where}: {err}") from None
    if config.bits != 4:
        raise CheckpointError(f"{where}: ParoQuant stores 4-bit AWQ GEMM codes; the config says bits={config.bits}")
    return config


def plan_module(name: str, leaves: Mapping[str, TensorInfo], config: QuantizeConfig, source: str) -> ModulePlan:
    """Resolve and check one ParoQuant module; raises listing every problem, each naming the tensor."""
    qw, theta = leaves.get("qweight"), leaves.get("theta")
    if qw is None or len(qw.shape) != 2:
        found = "nothing" if qw is None else qw.describe()
        raise CheckpointError(f"{name}.qweight: expected a 2-D [in_features, out_features/8] int32 tensor beside the "
                              f"rotation, found {found}")
    if theta is None or len(theta.shape) != 2:
        found = "nothing" if theta is None else theta.describe()
        raise CheckpointError(f"{name}.theta: expected a 2-D [krot, in_features/2] float tensor beside qweight, "
                              f"found {found}")
    k, n, krot = qw.shape[0], qw.shape[1] * 8, theta.shape[0]
    want = config.extra.get("krot", 8)
    if krot != want:
        raise CheckpointError(f"{name}.theta: {krot} rotation rounds, but {source} says krot={want}")
    try:
        scheme = config.scheme(k, n)
        scheme = replace(scheme, layout_params=paroquant.ParoParams(krot))
        expected = paroquant.checkpoint_shapes(scheme)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: in_features {k}, out_features {n} (from qweight) with the config in {source}: "
                              f"{err}") from None
    gs = "per-channel" if scheme.channelwise else f"group_size {scheme.group_size}"
    what = f"paroquant 4-bit {gs} krot {krot} in_features {k} out_features {n}, from {source}"
    spec = {leaf: (shape, ALLOWED.get(leaf, (dtype,))) for leaf, (shape, dtype) in expected.items()}
    return checked_plan(name, leaves, scheme, spec, what)


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], raw: Mapping[str, Any], where: str
                 ) -> tuple[QuantizeConfig, dict[str, ModulePlan], dict[str, TensorInfo], list[str]]:
    """The config, every ParoQuant module, no set-aside tensors, and every problem found."""
    config = read_config(raw, where)
    modules, errors = plan_marked(groups, config, where, MARKERS, plan_module, "ParoQuant")
    return config, modules, {}, errors


__all__ = ["plan_modules", "read_config"]
