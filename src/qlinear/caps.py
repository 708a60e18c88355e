"""Declarations as data: what a kernel says it supports, and the problem it is asked to run.

A kernel's whole declaration is one frozen ``Caps`` value. ``Caps.reasons(problem, target)`` turns
every mismatch into a sentence; kernels add runtime facts (modules, ops, exact device) on top.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import torch

from .enums import ALL_DEVICES, ALL_PLATFORMS, BACKEND, DEVICE, FORMAT, PLATFORM
from .spec import Scheme
from .target import Target

#: Every NVIDIA compute capability a declaration can name (a set, never a "minimum integer").
KNOWN_ARCHS: tuple[tuple[int, int], ...] = (
    (6, 0), (6, 1), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0),
    (10, 0), (10, 3), (11, 0), (12, 0), (12, 1),
)


def archs_from(floor: tuple[int, int]) -> frozenset[tuple[int, int]]:
    """Every known architecture at or above ``floor``: how a 'capability >= x' rule is written as a set."""
    return frozenset(a for a in KNOWN_ARCHS if a >= floor)


def sm(arch: tuple[int, int]) -> str:
    return f"sm_{arch[0]}{arch[1]}"


@dataclass(frozen=True)
class Problem:
    """One layer to run: its scheme plus the activation dtype and how it will be used."""

    scheme: Scheme
    dtype: torch.dtype = torch.float16
    adapter: str | None = None
    training: bool = False
    sharded: bool = False


def _fmt_set(values: Iterable[object]) -> str:
    items = sorted(values, key=lambda v: (str(type(v)), v if isinstance(v, (int, float)) else str(v)))
    return ", ".join(str(v).removeprefix("torch.") for v in items) or "none"


@dataclass(frozen=True)
class Caps:
    """Everything a kernel declares. ``None`` for a field means the field does not apply to its formats
    (GGUF has no group size), never 'anything goes'. Override per field with ``caps.but(...)``."""

    formats: Mapping[FORMAT, int]
    bits: frozenset[int]
    group_sizes: frozenset[int] | None = None
    desc_act: frozenset[bool] | None = frozenset({False, True})
    sym: frozenset[bool] | None = frozenset({False, True})
    devices: frozenset[DEVICE] = ALL_DEVICES
    platforms: frozenset[PLATFORM] = ALL_PLATFORMS
    dtypes: frozenset[torch.dtype] = frozenset({torch.float16, torch.bfloat16})
    pack_dtypes: frozenset[torch.dtype] = frozenset({torch.int32})
    in_divisible: int = 1
    out_divisible: int = 1
    auto_padding: bool = False
    sharded_load: bool = True
    training: bool = False
    adapters: frozenset[str] = frozenset()
    requires_modules: Mapping[str, str] = field(default_factory=dict)
    requires_ops: tuple[str, ...] = ()
    gpu_archs: frozenset[tuple[int, int]] | None = None
    auto_selectable: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "formats", MappingProxyType({FORMAT(k): int(v) for k, v in self.formats.items()}))
        object.__setattr__(self, "requires_modules", MappingProxyType(dict(self.requires_modules)))
        for name in ("bits", "group_sizes", "desc_act", "sym", "devices", "platforms", "dtypes", "pack_dtypes",
                     "adapters", "gpu_archs"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, frozenset):
                object.__setattr__(self, name, frozenset(value))

    def but(self, **changes: object) -> Caps:
        """A copy with some fields replaced: how a subclass narrows or widens an inherited declaration."""
        return replace(self, **changes)

    def priority(self, fmt: FORMAT) -> int | None:
        """AUTO priority for ``fmt`` (positive: AUTO candidate; 0: explicit only), or None if undeclared."""
        return self.formats.get(fmt)

    def reasons(self, problem: Problem, target: Target) -> list[str]:
        """Every way ``problem`` on ``target`` falls outside this declaration (empty list: it fits)."""
        s, out = problem.scheme, []
        if s.format not in self.formats:
            out.append(f"format {s.format.value} not declared (declares {_fmt_set(f.value for f in self.formats)})")
        if s.bits not in self.bits:
            out.append(f"{s.bits}-bit not supported (declares bits {_fmt_set(self.bits)})")
        if self.group_sizes is not None:
            ok = s.group_size in self.group_sizes or (s.channelwise and -1 in self.group_sizes)
            if not ok:
                shown = "-1 (channelwise)" if s.channelwise else str(s.group_size)
                out.append(f"group size {shown} not supported (declares {_fmt_set(self.group_sizes)})")
        if self.desc_act is not None and s.desc_act not in self.desc_act:
            out.append("desc_act (act-order) not supported" if s.desc_act else "requires desc_act")
        if self.sym is not None and s.sym not in self.sym:
            out.append("asymmetric zero points not supported (symmetric only)" if not s.sym
                       else "symmetric weights not supported")
        if problem.dtype not in self.dtypes:
            out.append(f"activation dtype {str(problem.dtype).removeprefix('torch.')} not supported "
                       f"(declares {_fmt_set(self.dtypes)})")
        if s.pack_dtype not in self.pack_dtypes:
            out.append(f"pack dtype {str(s.pack_dtype).removeprefix('torch.')} not supported "
                       f"(declares {_fmt_set(self.pack_dtypes)})")
        if not self.auto_padding:
            if s.in_features % self.in_divisible:
                out.append(f"in_features {s.in_features} not divisible by {self.in_divisible}")
            if s.out_features % self.out_divisible:
                out.append(f"out_features {s.out_features} not divisible by {self.out_divisible}")
        if problem.training and not self.training:
            out.append("training not supported")
        if problem.sharded and not self.sharded_load:
            out.append("sharded loading not supported")
        if problem.adapter is not None and problem.adapter not in self.adapters:
            out.append(f"adapter {problem.adapter!r} not supported (declares {_fmt_set(self.adapters)})")
        return out + self.target_reasons(target)

    def target_reasons(self, target: Target) -> list[str]:
        """Reasons that hold for any layer on ``target``: devices, platform, GPU architecture, extras."""
        out: list[str] = []
        if target.platform not in self.platforms:
            out.append(f"platform {target.platform.value} not supported (declares {_fmt_set(self.platforms)})")
        for dev in target.devices:
            if dev.kind not in self.devices:
                out.append(f"device {dev} not supported (declares {_fmt_set(d.value for d in self.devices)})")
            elif (self.gpu_archs is not None and dev.kind is DEVICE.CUDA
                  and dev.capability not in self.gpu_archs):
                got = sm(dev.capability) if dev.capability else "unknown capability"
                out.append(f"{dev}: {got} not among declared GPU architectures "
                           f"({', '.join(sm(a) for a in sorted(self.gpu_archs))})")
        for module, pip_name in self.requires_modules.items():
            if not target.has_module(module):
                out.append(f"needs Python module {module!r}: pip install {pip_name}")
        for op in self.requires_ops:
            if not target.has_op(op):
                out.append(f"this torch build lacks torch.ops.{op}")
        return out


def caps_table_row(backend: BACKEND, name: str, caps: Caps) -> dict[str, object]:
    """One kernel's declaration as plain data (for ``qlinear backends --json`` and the docs table)."""
    return {
        "backend": backend.value,
        "class": name,
        "formats": {f.value: p for f, p in caps.formats.items()},
        "bits": sorted(caps.bits),
        "group_sizes": None if caps.group_sizes is None else sorted(caps.group_sizes),
        "desc_act": None if caps.desc_act is None else sorted(caps.desc_act),
        "sym": None if caps.sym is None else sorted(caps.sym),
        "devices": sorted(d.value for d in caps.devices),
        "platforms": sorted(p.value for p in caps.platforms),
        "dtypes": sorted(str(d).removeprefix("torch.") for d in caps.dtypes),
        "pack_dtypes": sorted(str(d).removeprefix("torch.") for d in caps.pack_dtypes),
        "in_divisible": caps.in_divisible,
        "out_divisible": caps.out_divisible,
        "auto_padding": caps.auto_padding,
        "sharded_load": caps.sharded_load,
        "training": caps.training,
        "gpu_archs": None if caps.gpu_archs is None else [sm(a) for a in sorted(caps.gpu_archs)],
        "requires": sorted(caps.requires_modules) + [f"torch.ops.{o}" for o in caps.requires_ops],
        "auto_selectable": caps.auto_selectable,
    }
