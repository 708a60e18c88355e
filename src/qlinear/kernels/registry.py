"""Every kernel class qlinear knows: the implemented ones, then the reference's declared-only ones.

Built on first use (importing the family modules is pure class definition: no device, no compiler).
An implemented family module exposes ``KERNELS``; adding a family is one line in ``FAMILIES``.
An implemented class replaces the declared-only class of the same name.
"""

from __future__ import annotations

import functools
import importlib

from .base import QuantLinear

#: Modules under ``qlinear.kernels`` holding implemented kernels, in AUTO tie-break order.
FAMILIES: tuple[str, ...] = (
    "torch",
    "torch_awq",
    "cpu_int4",
    "cpu_int8",
    "triton_gptq",
    "triton_awq",
    "gguf_torch",
    "gguf_triton",
    "gguf_ggml",
    "torch_float",
    "triton_float",
    "w4a_fp8",
    "torch_bnb",
    "triton_bnb",
    "bitsandbytes",
    "vllm_marlin",
    "qqq",
    "vptq",
    "vptq_cpu",
    "mlx_torch",
    "mlx_cpu",
    "mlx_triton",
    "mlx_holders",
    "paroquant",
    "paro_cpu",
    "exllamav2",
    "exl2",
    "exl2_triton",
    "exl2_cpu",
    "exl3",
    "bitblas",
)


@functools.cache
def all_kernels() -> tuple[type[QuantLinear], ...]:
    """Implemented kernels first, then those declared from the reference but not built yet."""
    from .planned import PLANNED

    built: list[type[QuantLinear]] = []
    for family in FAMILIES:
        built += importlib.import_module(f"{__package__}.{family}").KERNELS
    names = {k.__name__ for k in built}
    return tuple(built) + tuple(k for k in PLANNED if k.__name__ not in names)


def kernel_by_name(name: str) -> type[QuantLinear]:
    """Look a kernel class up by its class name (case-insensitive)."""
    for k in all_kernels():
        if k.__name__.lower() == name.lower():
            return k
    raise KeyError(f"no kernel class named {name!r}; known: {', '.join(k.__name__ for k in all_kernels())}")
