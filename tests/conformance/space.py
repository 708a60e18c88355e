"""The declared space of every implemented kernel, its valid part, and a deterministic covering sample.

A kernel declares formats x bits x group sizes x desc_act x sym x activation dtypes x pack dtypes in its ``Caps``;
a field that is ``None`` does not apply to its formats and contributes one ``None`` value. Formats with sub-types
no ``Caps`` field names (the GGUF block type, bitsandbytes' nf4 / fp4, the FP8 element and scale rule) expand each
declared combination into its variants, and a combination is *valid* when ``Scheme`` accepts it (``ConfigError``:
input no checkpoint can have, such as 5-bit continuous GPTQ or an AWQ layer with act-order).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields

import torch

from qlinear.enums import DEVICE, FORMAT
from qlinear.kernels.base import PlannedKernel, QuantLinear
from qlinear.kernels.registry import all_kernels


@dataclass(frozen=True)
class Combo:
    """One declared combination for one kernel (``variant``: the family's sub-type, None where it has none)."""

    kernel: type[QuantLinear]
    format: FORMAT
    bits: int
    group_size: int | None
    desc_act: bool | None
    sym: bool | None
    dtype: torch.dtype
    pack_dtype: torch.dtype
    variant: str | None = None

    def label(self) -> str:
        parts = [self.format.value, f"{self.bits}b"]
        if self.group_size is not None:
            parts.append(f"g{self.group_size}")
        if self.desc_act:
            parts.append("act")
        if self.sym is not None:
            parts.append("sym" if self.sym else "asym")
        if self.variant:
            parts.append(self.variant)
        parts += [_short(self.dtype), _short(self.pack_dtype)]
        return "-".join(parts)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def implemented_kernels() -> list[type[QuantLinear]]:
    """``all_kernels()`` minus the declared-only (planned) classes."""
    return [k for k in all_kernels() if k.implemented and not issubclass(k, PlannedKernel) and not k.retired]


def declares_device(kernel: type[QuantLinear], device: str) -> bool:
    return DEVICE(device) in kernel.caps.devices


def _values(field: Iterable | None) -> list:
    return [None] if field is None else sorted(field, key=lambda v: (str(type(v)), str(v)))


def declared(kernel: type[QuantLinear]) -> list[Combo]:
    """The Caps product of ``kernel`` (before variants and validity)."""
    c = kernel.caps
    space = itertools.product(sorted(c.formats, key=lambda f: f.value), _values(c.bits), _values(c.group_sizes),
                              _values(c.desc_act), _values(c.sym), _values(c.dtypes), _values(c.pack_dtypes))
    return [Combo(kernel, *values) for values in space]


class SchemeRefused(ValueError):
    """A combination ``Scheme`` (or the family's scheme rules) refuses: not a checkpoint anyone can have."""


def valid(combos: Sequence[Combo], variants: Callable[[Combo], Sequence[str | None]],
          check: Callable[[Combo], object]) -> list[Combo]:
    """Each combination expanded into its family's variants, kept where ``check`` (which builds the Scheme)
    does not raise ``SchemeRefused``."""
    out = []
    for combo in combos:
        for v in variants(combo):
            c = Combo(**{f.name: getattr(combo, f.name) for f in fields(combo)} | {"variant": v})
            try:
                check(c)
            except SchemeRefused:
                continue
            out.append(c)
    return out


AXES = ("format", "bits", "group_size", "desc_act", "sym", "dtype", "pack_dtype", "variant")


def sample(combos: Sequence[Combo], cap: int, seed: int = 2026) -> list[Combo]:
    """At most ``cap`` combinations, deterministic: greedily the one covering most (axis, value) pairs and
    (axis, axis) value pairs not yet covered, ties broken by a seeded shuffle; all of them when ``cap`` allows."""
    if len(combos) <= cap:
        return list(combos)
    pool = list(combos)
    random.Random(seed).shuffle(pool)
    covered: set[tuple] = set()

    def keys(c: Combo) -> set[tuple]:
        vals = [(a, getattr(c, a)) for a in AXES]
        return set(vals) | {(x, y) for x, y in itertools.combinations(vals, 2)}

    pool_keys = [keys(c) for c in pool]
    chosen: list[Combo] = []
    while pool and len(chosen) < cap:
        best = max(range(len(pool)), key=lambda i: (len(pool_keys[i] - covered), -i))
        covered |= pool_keys.pop(best)
        chosen.append(pool.pop(best))
    return chosen
