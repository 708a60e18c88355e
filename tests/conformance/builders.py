"""What a family builder is, and the table of builders by kernel.

A builder knows one format family: the sub-types of a declared combination (``variants``), a layer shape meeting
the kernel's divisibility (``shape``), the ``Scheme`` (raising ``SchemeRefused`` for input no checkpoint can have)
and ``build``: a random layer of exactly that kernel made through the family's public constructor, with its float64
reference weight from an oracle that shares no code with ``src`` (``tests/oracle``, or the producer's own decoder).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from qlinear.kernels.base import QuantLinear
from qlinear.spec import ConfigError, Scheme

from .space import Combo, SchemeRefused

#: max |y - ref| / max |ref| per activation dtype (tests/test_conformance_torch.py's bounds: float32 sums of exact
#: products; float16 / bfloat16 a few roundings of the output and the weight to the activation dtype).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


@dataclass
class Built:
    """A ready layer and what it must compute: ``x @ weight.T`` in float64 unless ``reference`` says otherwise
    (kernels whose defined arithmetic quantizes the activations). ``tol`` replaces TOL (a reason is required)."""

    layer: QuantLinear
    weight: np.ndarray | None
    reference: Callable[[torch.Tensor], np.ndarray] | None = None
    tol: float | None = None
    tol_why: str = ""
    #: ``(m, generator, device) -> input`` for layers that do not take activations (embedding lookups by id).
    make_input: Callable[[int, torch.Generator, str], torch.Tensor] | None = None

    def input(self, m: int, g: torch.Generator, device: str, dtype: torch.dtype, k: int) -> torch.Tensor:
        if self.make_input is not None:
            return self.make_input(m, g, device)
        return torch.randn(m, k, generator=g).to(dtype).to(device)

    def expected(self, x: torch.Tensor) -> np.ndarray:
        if self.reference is not None:
            return self.reference(x)
        return x.double().cpu().numpy() @ self.weight.T


class Unavailable(RuntimeError):
    """The builder cannot run here for a machine reason (an oracle's package is missing): counted as refused."""


class Builder:
    """Base: one variant, ``k_min`` x ``n_min`` layers rounded up to every divisibility the combination needs."""

    family = "?"
    k_min, n_min = 128, 32

    def variants(self, c: Combo) -> Sequence[str | None]:
        return (None,)

    def multiples(self, c: Combo) -> tuple[int, int]:
        """Extra (K, N) multiples the format needs beyond the kernel's declared divisibility."""
        return 1, 1

    def shape(self, c: Combo) -> tuple[int, int]:
        mk, mn = self.multiples(c)
        kd = math.lcm(c.kernel.caps.in_divisible, mk, c.group_size if c.group_size and c.group_size > 0 else 1)
        nd = math.lcm(c.kernel.caps.out_divisible, mn)
        return kd * -(-self.k_min // kd), nd * -(-self.n_min // nd)

    def scheme(self, c: Combo, k: int, n: int) -> Scheme:
        try:
            return self.make_scheme(c, k, n)
        except ConfigError as err:
            raise SchemeRefused(str(err)) from None

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        raise NotImplementedError

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        raise NotImplementedError

    def check(self, c: Combo) -> None:
        """The validity filter: the Scheme of ``c`` at its test shape exists."""
        self.scheme(c, *self.shape(c))


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def as_f64(t: torch.Tensor) -> np.ndarray:
    """A CPU float64 copy (bfloat16 / float8 go through float32, which holds them exactly)."""
    t = t.detach().cpu()
    if t.is_floating_point() and t.dtype not in (torch.float64, torch.float32, torch.float16):
        t = t.float()
    return t.numpy().astype(np.float64)


def rounded(w: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float64 values rounded to ``dtype`` (nearest even) and back: a weight as a producer hands it to the GEMM."""
    return torch.from_numpy(w).to(dtype).double().numpy()


def state(layer: QuantLinear) -> dict[str, np.ndarray]:
    """The layer's checkpoint tensors as CPU numpy arrays (bfloat16 as float32, which holds it exactly)."""
    out = {}
    for name, t in layer.state_dict().items():
        t = t.detach().cpu()
        out[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    return out


def registry() -> dict[str, Builder]:
    """Kernel class name -> builder, for every family with a builder (imported lazily: no work at import)."""
    from . import builders_affine as a
    from . import builders_blocks as b

    table: dict[str, Builder] = {}
    for module in (a, b):
        for builder, names in module.BUILDERS:
            for name in names:
                table[name] = builder
    return table
