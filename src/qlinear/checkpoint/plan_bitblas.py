"""Plan the modules of a GPTQModel BitBLAS checkpoint (``checkpoint_format``/``format`` ``bitblas``, quant_method
gptq or awq) from its headers: ``qweight`` int8 ``[N, K*bits/8]``, ``scales`` ``[N, G]``, ``qzeros`` int8
``[G, N*bits/8]`` (``[0]`` or absent for symmetric GPTQ) and an optional ``bias`` (``layouts/bitblas.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..layouts import bitblas
from ..spec import ConfigError, QuantizeConfig
from .module_plan import ModulePlan, checked_plan
from .safetensors_io import CheckpointError, TensorInfo


def plan_module(name: str, leaves: Mapping[str, TensorInfo], config: QuantizeConfig, source: str) -> ModulePlan:
    """Resolve and check one BitBLAS module; raises listing every problem, each naming the tensor."""
    for leaf in ("qweight", "scales"):
        if leaf not in leaves:
            raise CheckpointError(f"{name}.{leaf}: missing (a bitblas module needs qweight, scales, qzeros "
                                  f"(+ optional bias))")
        if len(leaves[leaf].shape) != 2:
            raise CheckpointError(f"{name}.{leaf}: expected a 2-D tensor, found {leaves[leaf].describe()}")
    n, packed = leaves["qweight"].shape
    k = packed * 8 // config.bits if config.bits in bitblas.BITBLAS_BITS else packed
    cfg = dataclasses.replace(config, desc_act=False)  # GPTQModel forces desc_act off for BitBLAS (no g_idx)
    try:
        scheme = cfg.scheme(k, n)
    except (ConfigError, ValueError) as err:
        raise CheckpointError(f"{name}: in_features {k}, out_features {n} (from qweight) with the config in "
                              f"{source}: {err}") from None
    problems = bitblas.layout_errors(scheme)
    if problems:
        raise CheckpointError("\n".join(f"{name}: {p} (config in {source})" for p in problems))
    expected = {leaf: (shape, (dtype, *(bitblas.SCALE_DTYPES[1:] if leaf == "scales" else ())))
                for leaf, (shape, dtype) in bitblas.checkpoint_shapes(scheme).items()}
    optional = ("bias",)
    if not bitblas.zeros_stored(scheme):
        optional, expected = ("bias", "qzeros"), {k: v for k, v in expected.items() if k != "qzeros" or
                                                  "qzeros" in leaves}
    what = (f"a {scheme.method.value} bitblas {scheme.bits}-bit group_size {config.group_size} sym {scheme.sym} "
            f"module needs qweight int8 [{n}, {packed}], scales [{n}, {scheme.num_groups}]"
            f"{', qzeros int8' if bitblas.zeros_stored(scheme) else ''} (+ optional bias), from {source}")
    return checked_plan(name, leaves, scheme, expected, what, optional)


__all__ = ["plan_module"]
