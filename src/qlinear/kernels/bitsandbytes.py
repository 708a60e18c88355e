"""``BitsAndBytesLinear``: the reference's bitsandbytes kernel, running the bitsandbytes package's own functions.

The buffers are the checkpoint's (``BnbQuantLinear``); ``prepare()`` builds bitsandbytes' ``QuantState`` from
them with its own ``QuantState.from_dict``. A 4-bit forward is ``bitsandbytes.matmul_4bit`` (on CUDA, its GEMV
kernel for one row). An 8-bit forward is the reference's LLM.int8 path without outliers:
activations quantized to int8 per row (``int8_vectorwise_quant``), ``int8_linear_matmul``, then
``int8_mm_dequant``. bitsandbytes is imported only when a layer runs (it imports Triton where installed).

On the CPU, bitsandbytes 0.50's 4-bit matmul dequantizes the whole weight into the activation dtype (the same
values as ``BitsAndBytesTorchLinear``'s tiles) and calls ``F.linear``; but its CPU dequantize kernel applies
the wrong absmax to blocks that straddle rows (0.50.2: where ``in_features`` is even and not a multiple of the
blocksize), so such layers are refused on the CPU (``runtime_reasons``). The 8-bit path quantizes the activations,
so it is not the checkpoint's weight times the input: AUTO passes it over for ``BitsAndBytesTorchLinear``
(``auto_reasons``); an explicit ``backend="bitsandbytes"`` still runs it.
"""

from __future__ import annotations

from importlib import import_module, metadata
from typing import Any

import torch

from ..caps import Problem
from ..enums import DEVICE
from ..layouts import bnb
from ..target import Target
from .bnb_base import BnbQuantLinear
from .planned.other import BitsAndBytesLinear as _Declared

PIN = "bitsandbytes==0.50.2"
#: The oldest bitsandbytes whose functions this kernel calls (the reference's minimum).
MINIMUM = (0, 49)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def package() -> Any:
    """The bitsandbytes package, or ImportError naming the install command."""
    try:
        return import_module("bitsandbytes")
    except ImportError as err:
        raise ImportError(f"BitsAndBytesLinear needs the bitsandbytes package: pip install {PIN}") from err


class BitsAndBytesLinear(BnbQuantLinear):
    """bitsandbytes 4-bit codes plus QuantState, or INT8 state, run by the bitsandbytes package (CPU, CUDA)."""

    backend = _Declared.backend
    caps = _Declared.caps.but(requires_modules={"bitsandbytes": PIN})

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        if not target.has_module("bitsandbytes"):
            return []  # the declaration already says so, with the install command
        try:
            found = metadata.version("bitsandbytes")
        except metadata.PackageNotFoundError:
            return []
        if _version(found) < MINIMUM:
            return [f"bitsandbytes {found} is older than {'.'.join(map(str, MINIMUM))}: pip install {PIN}"]
        return []

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        out = cls.runtime_target_reasons(target)
        s = problem.scheme
        cpu = any(d.kind is DEVICE.CPU for d in target.devices)
        if cpu and s.bits == 4 and s.in_features % 2 == 0 and s.in_features % s.blocksize:
            out.append(f"bitsandbytes' CPU 4-bit dequantize (0.50.2) scales absmax blocks that straddle rows with the "
                       f"wrong absmax: in_features {s.in_features} is not a multiple of blocksize {s.blocksize}")
        return out

    @classmethod
    def auto_reasons(cls, problem: Problem, target: Target) -> list[str]:
        s = problem.scheme
        if s.bits == 8:
            return ["quantizes the activations to int8 per row (LLM.int8 without outliers, the reference's path): "
                    "not the checkpoint's exact weight times the input; AUTO prefers bitsandbytes_torch"]
        if all(d.kind is DEVICE.CPU for d in target.devices):
            from . import native_lut4

            if not native_lut4.unavailable_reason(s.in_features, s.blocksize, problem.dtype):
                return ["AUTO prefers bitsandbytes_torch with qlinear's native LUT4 kernel on this CPU: bitsandbytes "
                        "0.50.2's CPU matmul_4bit measured 75 ms at 4096x14336 M=1 against 3.2 ms (dense bf16 "
                        "10 ms; benchmarks/results/cpu_bnb_2026-12-04.md)"]
        return []

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        s = problem.scheme
        how = ("bitsandbytes.matmul_4bit on a QuantState built from the checkpoint tensors" if s.bits == 4 else
               "int8_vectorwise_quant of the activations, int8_linear_matmul, int8_mm_dequant (no outliers)")
        return f"{bnb.describe(s)}: {how}"

    def prepare(self) -> None:
        super().prepare()  # validates the buffers
        if self.scheme.bits == 4:
            functional = import_module("bitsandbytes.functional")
            state = {leaf.removeprefix("weight."): t for leaf, t in self.checkpoint_dict().items() if leaf != "weight"}
            self._quant_state = functional.QuantState.from_dict(state, device=self.weight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        bnb = package()
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.scheme.bits == 4:
            y = bnb.matmul_4bit(x2, self.weight.t(), quant_state=self._quant_state, bias=bias)
        else:
            f = bnb.functional
            xq, x_stats, _ = f.int8_vectorwise_quant(x2.to(torch.float16), threshold=0.0)
            acc = f.int8_linear_matmul(xq, self.weight)
            y = f.int8_mm_dequant(acc, x_stats, self.SCB, bias=None if bias is None else bias.to(torch.float16))
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


KERNELS = (BitsAndBytesLinear,)
