"""Plan the modules of a QQQ checkpoint (``quant_method: qqq``: GPTQModel's ``QQQConfig``, format ``qqq``).

Each quantized module stores ``B [K/16, 2N]`` int32, ``s_channel [1, N]`` float32 and, when grouped, ``s_group
[K/gs, N]`` float16 (``layouts/qqq.py``), plus an optional bias. The shape comes from ``B``; a module whose
``group_size`` equals its ``in_features`` is per-channel (GPTQModel packs it so), and then ``s_group`` is the
empty ``[0]`` tensor or absent: GPTQModel 7.7.0 writes it for some such modules and not for others.
GPTQModel's ``dynamic`` per-module overrides apply as for GPTQ.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..enums import METHOD
from ..layouts import qqq
from ..spec import ConfigError, QuantizeConfig
from .module_plan import ModulePlan, checked_plan
from .plan_gptq import plan_marked
from .safetensors_io import CheckpointError, TensorInfo

MARKERS = frozenset({"s_channel"})


def config_errors(config: QuantizeConfig, source: str) -> list[str]:
    """What a QQQ config says that no QQQ checkpoint can hold."""
    out = []
    if config.method is not METHOD.QQQ:
        out.append(f"{source}: quant_method {config.method.value!r} is not qqq")
    if config.bits != 4:
        out.append(f"{source}: QQQ holds 4-bit weights; the config says bits={config.bits}")
    if config.desc_act:
        out.append(f"{source}: QQQ has no act-order (no g_idx); the config says desc_act=True")
    if not config.sym:
        out.append(f"{source}: QQQ weights are symmetric; the config says sym=False")
    return out


def plan_module(name: str, leaves: Mapping[str, TensorInfo], config: QuantizeConfig, source: str) -> ModulePlan:
    """Resolve and check one QQQ module; raises listing every problem, each naming the tensor."""
    b = leaves.get("B")
    if b is None or len(b.shape) != 2 or b.shape[1] % 2:
        found = "nothing" if b is None else b.describe()
        raise CheckpointError(f"{name}.B: expected a 2-D [in_features/16, 2*out_features] int32 tensor beside "
                              f"s_channel, found {found}")
    k, n = 16 * b.shape[0], b.shape[1] // 2
    errors = config_errors(config, f"{name} (from {source})")
    if errors:
        raise CheckpointError("\n".join(errors))
    try:
        scheme = config.scheme(k, n)
        expected = qqq.checkpoint_shapes(scheme)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: in_features {k}, out_features {n} (from B) with the config in {source}: "
                              f"{err}") from None
    gs = "per-channel" if scheme.channelwise else f"group_size {scheme.group_size}"
    what = f"qqq 4-bit {gs} in_features {k} out_features {n}, from {source}"
    if scheme.channelwise and "s_group" not in leaves:
        expected = {leaf: v for leaf, v in expected.items() if leaf != "s_group"}
    return checked_plan(name, leaves, scheme, expected, what)


def plan_modules(groups: Mapping[str, Mapping[str, TensorInfo]], config: QuantizeConfig,
                 source: str) -> tuple[dict[str, ModulePlan], list[str]]:
    """Every QQQ module of the checkpoint, and every problem found (each naming the module and tensor)."""
    return plan_marked(groups, config, source, MARKERS, plan_module, "QQQ")
