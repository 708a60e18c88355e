"""Every kernel class qlinear knows, in the order of the reference's backend table.

Built on first use (importing the family modules is pure class definition: no device, no compiler).
"""

from __future__ import annotations

import functools

from .base import QuantLinear


@functools.cache
def all_kernels() -> tuple[type[QuantLinear], ...]:
    """Implemented kernels first, then those declared from the reference but not built yet."""
    from .planned import PLANNED
    from .torch import TorchLinear, TorchQuantEmbeddings

    built: tuple[type[QuantLinear], ...] = (TorchLinear, TorchQuantEmbeddings)
    names = {k.__name__ for k in built}
    return built + tuple(k for k in PLANNED if k.__name__ not in names)


def kernel_by_name(name: str) -> type[QuantLinear]:
    """Look a kernel class up by its class name (case-insensitive)."""
    for k in all_kernels():
        if k.__name__.lower() == name.lower():
            return k
    raise KeyError(f"no kernel class named {name!r}; known: {', '.join(k.__name__ for k in all_kernels())}")
