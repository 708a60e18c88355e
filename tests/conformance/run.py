"""Run sampled combinations of every implemented kernel and tally them: declared / valid / sampled / executed /
passed / refused here (with the selector's reasons) / failed (raised or mismatched, with the message)."""

from __future__ import annotations

import re
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from qlinear.caps import Problem
from qlinear.kernels.base import QuantLinear
from qlinear.target import Target

from .builders import TOL, Builder, Unavailable, generator, registry
from .known import known
from .space import Combo, declared, declares_device, implemented_kernels, sample, valid

MS = (1, 5)
#: Reasons about the machine that kernels give per problem (``runtime_reasons``) rather than per target: a missing
#: package or compiled op, a CPU flag, a GPU architecture. Any other refusal of a declared combination is a failure.
MACHINE = re.compile(r"pip install|not installed|not loaded|lacks torch\.ops|needs Python module|CPU flag|AVX|AMX"
                     r"|sm_\d+|no CUDA device")


@dataclass
class Tally:
    """One kernel's counts. ``refused``: reason -> combinations the selector (or a missing oracle package)
    refused on this machine; ``failures``: (combination, what went wrong)."""

    kernel: str
    family: str
    declared: int = 0
    valid: int | None = None  # None: no builder yet (the sub-types and validity need the family's rules)
    sampled: int = 0
    executed: int = 0
    passed: int = 0
    refused: Counter = field(default_factory=Counter)
    failures: list[tuple[str, str]] = field(default_factory=list)
    known_failures: int = 0  # of ``failures``: defects listed in known.KNOWN (reported, still failures)
    seconds: float = 0.0

    @property
    def refused_count(self) -> int:
        return sum(self.refused.values())

    def line(self) -> str:
        valid = "no builder yet" if self.valid is None else self.valid
        return (f"{self.kernel}: declared {self.declared} / valid {valid} / sampled {self.sampled} / executed "
                f"{self.executed} / passed {self.passed} / refused here {self.refused_count}"
                + (f" / FAILED {len(self.failures)}" if self.failures else "")
                + (f" ({self.known_failures} known defects)" if self.known_failures else ""))


def seed_of(c: Combo) -> int:
    return zlib.crc32(f"{c.kernel.__name__}:{c.label()}".encode()) % (1 << 30)


def run_combo(c: Combo, builder: Builder, device: str, target: Target) -> tuple[str, str]:
    """('passed' | 'refused' | 'failed', detail) for one combination."""
    k, n = builder.shape(c)
    scheme = builder.scheme(c, k, n)
    reasons = c.kernel.reasons(Problem(scheme, c.dtype), target)
    if reasons:
        machine = c.kernel.target_reasons(target)
        if any(r in machine or MACHINE.search(r) for r in reasons):  # the machine lacks a device, package, op, flag
            return "refused", "; ".join(reasons)
        return "failed", f"declared, but the kernel refuses it on a capable machine: {'; '.join(reasons)}"
    seed = seed_of(c)
    try:
        built = builder.build(c, scheme, device, seed)
        worst = 0.0
        for m in MS:
            x = built.input(m, generator(seed + m), device, c.dtype, k)
            with torch.no_grad():
                y = built.layer(x)
            if y.dtype != c.dtype or y.shape[0] != m:
                return "failed", f"M={m}: output {y.dtype} {tuple(y.shape)}, expected {c.dtype} with {m} rows"
            ref = built.expected(x.cpu())
            got = y.detach().cpu().double().numpy()
            if got.shape != ref.shape or not np.isfinite(got).all():
                return "failed", f"M={m}: output shape {got.shape} (want {ref.shape}) or non-finite values"
            err = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
            worst = max(worst, err)
            tol = built.tol if built.tol is not None else TOL[c.dtype]
            if not err < tol:
                return "failed", f"M={m}: max|y - ref| / max|ref| = {err:.2e} >= {tol:.1e}"
        return "passed", f"{worst:.1e}"
    except Unavailable as why:
        return "refused", str(why)
    except Exception as err:  # a declared combination that raises is a failure: keep the message
        return "failed", f"{type(err).__name__}: {err}"


def tally(kernel: type[QuantLinear], device: str, cap: int | None, builders: dict[str, Builder] | None = None,
          target: Target | None = None) -> Tally:
    """Enumerate, filter, sample (``cap`` None: every valid combination) and run one kernel on ``device``."""
    builders = registry() if builders is None else builders
    target = Target.here(device) if target is None else target
    builder = builders.get(kernel.__name__)
    space = declared(kernel)
    t = Tally(kernel.__name__, builder.family if builder else "?", declared=len(space))
    if builder is None:
        return t
    ok = valid(space, builder.variants, builder.check)
    t.valid = len(ok)
    chosen = ok if cap is None else sample(ok, cap)
    t.sampled = len(chosen)
    start = time.perf_counter()
    for c in chosen:
        status, detail = run_combo(c, builder, device, target)
        if status == "refused":
            t.refused[detail] += 1
            continue
        t.executed += 1
        if status == "passed":
            t.passed += 1
        else:
            t.failures.append((c.label(), detail))
            t.known_failures += known(t.kernel, c.label(), detail) is not None
    t.seconds = time.perf_counter() - start
    return t


def kernels_for(device: str) -> list[type[QuantLinear]]:
    """Implemented kernels that declare ``device``."""
    return [k for k in implemented_kernels() if declares_device(k, device)]
