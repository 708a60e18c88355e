"""Where a layer will run: its devices (each ordinal checked on its own), platform and installed extras.

A ``Target`` is a value. ``Target.here(...)`` reads the live machine; tests build fake ones (a CUDA
sm_90 box, a CPU without AVX512) so the selector's answers can be checked anywhere. Runtime facts
(is a module importable, does a torch op exist) are read per call, never cached process-wide.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .enums import DEVICE, PLATFORM


@dataclass(frozen=True)
class DeviceInfo:
    """One device: its family, ordinal, and for GPUs the compute capability."""

    kind: DEVICE
    index: int | None = None
    capability: tuple[int, int] | None = None
    name: str = ""
    cpu_flags: frozenset[str] = frozenset()

    def __str__(self) -> str:
        where = self.kind.value if self.index is None else f"{self.kind.value}:{self.index}"
        if self.capability is not None:
            where += f" (sm_{self.capability[0]}{self.capability[1]})"
        return where

    @property
    def torch_device(self) -> torch.device:
        kind = "cuda" if self.kind is DEVICE.ROCM else self.kind.value
        return torch.device(kind if self.index is None else f"{kind}:{self.index}")


@dataclass(frozen=True)
class Target:
    """The devices a layer must run on (all of them, for sharded or replicated layers) and the host."""

    devices: tuple[DeviceInfo, ...]
    platform: PLATFORM = PLATFORM.LINUX
    modules: Mapping[str, bool] | None = field(default=None, compare=False)
    ops: Mapping[str, bool] | None = field(default=None, compare=False)

    def has_module(self, name: str) -> bool:
        """Is the Python module importable (without importing it)? Fakes answer from ``modules``."""
        if self.modules is not None:
            return bool(self.modules.get(name, False))
        return importlib.util.find_spec(name) is not None

    def has_op(self, qualified: str) -> bool:
        """Does ``torch.ops.<namespace>.<name>`` exist? Fakes answer from ``ops``."""
        if self.ops is not None:
            return bool(self.ops.get(qualified, False))
        namespace, _, name = qualified.partition(".")
        return hasattr(getattr(torch.ops, namespace), name)

    def __str__(self) -> str:
        return ", ".join(str(d) for d in self.devices) + f" on {self.platform.value}"

    @classmethod
    def here(cls, devices: str | torch.device | int | Sequence[str | torch.device | int] = "cpu") -> Target:
        """Describe the live machine's devices named in ``devices`` (each ordinal is checked)."""
        if isinstance(devices, (str, torch.device, int)):
            devices = [devices]
        return cls(devices=tuple(probe_device(d) for d in devices), platform=current_platform())

    @classmethod
    def fake_cuda(cls, capability: tuple[int, int] = (9, 0), count: int = 1, name: str = "fake GPU",
                  modules: Mapping[str, bool] | None = None, ops: Mapping[str, bool] | None = None) -> Target:
        """A CUDA machine that does not exist, for checking the selector's answers anywhere."""
        devs = tuple(DeviceInfo(DEVICE.CUDA, i, capability, name) for i in range(count))
        return cls(devs, PLATFORM.LINUX, modules=dict(modules or {}), ops=dict(ops or {}))

    @classmethod
    def fake_cpu(cls, cpu_flags: frozenset[str] = frozenset(), modules: Mapping[str, bool] | None = None,
                 ops: Mapping[str, bool] | None = None) -> Target:
        """A CPU host that does not exist (flags, modules and torch ops as given)."""
        return cls((DeviceInfo(DEVICE.CPU, None, None, "fake CPU", frozenset(cpu_flags)),), PLATFORM.LINUX,
                   modules=dict(modules or {}), ops=dict(ops or {}))


def current_platform() -> PLATFORM:
    for p in PLATFORM:
        if sys.platform.startswith(p.value):
            return p
    return PLATFORM.LINUX


class DeviceError(ValueError):
    """A device that does not exist here, or is named in a way torch cannot parse."""


def probe_device(spec: str | torch.device | int) -> DeviceInfo:
    """Read one device of the live machine; raises ``DeviceError`` for ordinals that do not exist."""
    try:
        dev = torch.device(f"cuda:{spec}" if isinstance(spec, int) else spec)
    except (RuntimeError, TypeError) as err:
        raise DeviceError(f"cannot parse device {spec!r}: {err}") from None
    if dev.type == "cpu":
        return DeviceInfo(DEVICE.CPU, None, None, "cpu", cpu_flags())
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {dev} requested but this torch sees no CUDA device")
        index = torch.cuda.current_device() if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device cuda:{index} does not exist (this machine has {torch.cuda.device_count()})")
        kind = DEVICE.ROCM if torch.version.hip else DEVICE.CUDA
        return DeviceInfo(kind, index, torch.cuda.get_device_capability(index), torch.cuda.get_device_name(index))
    if dev.type in ("xpu", "mps"):
        return DeviceInfo(DEVICE(dev.type), dev.index, None, dev.type)
    raise DeviceError(f"device type {dev.type!r} is not one qlinear kernels run on (cpu, cuda, xpu, mps)")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The host CPU's feature flags (``/proc/cpuinfo`` on Linux; empty elsewhere). Read once, on first use."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()
