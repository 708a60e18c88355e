"""The vocabulary of tensor-parallel cuts, shared by ``shard.py`` (canonical forms) and ``shard_stored.py`` (stored
tensors): the rule a rank's share must follow per dimension, and the error a cut that breaks it raises."""

from __future__ import annotations

from dataclasses import dataclass


class ShardError(ValueError):
    """A layer that cannot be cut as asked; the message names the sizes and the world sizes that would work."""


@dataclass(frozen=True)
class CutRule:
    """What a rank's share must be a multiple of, per dimension, and why (``0``: this dimension cannot be cut).

    ``in_points``: where the unit is not uniform (EXL2's row groups of varying length, VPTQ's outlier columns before
    its groups), the input positions (in stored order, 0 and in_features included) a row cut may fall on."""

    family: str
    out_unit: int
    in_unit: int
    out_why: str
    in_why: str
    in_points: tuple[int, ...] | None = None

    def unit(self, dim: str) -> tuple[int, str]:
        return (self.out_unit, self.out_why) if dim == "out" else (self.in_unit, self.in_why)

    def points(self, dim: str) -> tuple[int, ...] | None:
        return self.in_points if dim == "in" else None


def cuts_evenly(size: int, world: int, unit: int, points: tuple[int, ...] | None = None) -> bool:
    """Whether ``size`` splits into ``world`` equal shares that are multiples of ``unit`` and whose boundaries all
    fall on ``points`` (when given)."""
    if unit <= 0 or size % world or (size // world) % unit:
        return False
    part = size // world
    return points is None or all(r * part in points for r in range(1, world))


def valid_world_sizes(size: int, unit: int, limit: int = 64, points: tuple[int, ...] | None = None) -> list[int]:
    """World sizes up to ``limit`` that split ``size`` evenly into multiples of ``unit`` (on ``points``)."""
    if unit <= 0:
        return [1]
    return [w for w in range(1, min(size, limit) + 1) if cuts_evenly(size, w, unit, points)]
