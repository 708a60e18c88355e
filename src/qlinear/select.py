"""The selector: which kernel runs a layer, and exactly why every other one cannot.

``select()`` keeps every candidate's verdict; ``Choice.explain()`` prints them all in order, and
``NoKernelError`` carries the same table when nothing fits. AUTO considers only positive
priorities; an explicit backend gets the same validation and the same kind of answer.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import torch

from .caps import Problem
from .enums import BACKEND
from .kernels.base import QuantLinear
from .kernels.registry import all_kernels
from .target import Target


@dataclass(frozen=True)
class Verdict:
    """One kernel's answer for one problem: its priority for the format and every reason it cannot run."""

    kernel: type[QuantLinear]
    priority: int | None
    reasons: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class Choice:
    """The outcome of a selection: the chosen kernel (or None) and every verdict behind it."""

    kernel: type[QuantLinear] | None
    problem: Problem
    target: Target
    requested: BACKEND
    verdicts: tuple[Verdict, ...]
    others: int = 0
    note: str = ""  # how the layer reached this kernel when not as stored (e.g. re-encoded at load)
    runs: str = ""  # how the chosen kernel runs the layer here (its paths by M), from ``describe_runs``

    @property
    def backend(self) -> BACKEND | None:
        return None if self.kernel is None else self.kernel.backend

    def headline(self) -> str:
        s, p = self.problem.scheme, self.problem
        group = "channelwise" if s.channelwise else f"g{s.group_size}"
        extra = "".join([" desc_act" if s.desc_act else "", " training" if p.training else "",
                         f" adapter={p.adapter}" if p.adapter else ""])
        act = "" if s.activations is None else f" activations={s.activations.describe()}"
        if s.element is not None:
            return (f"{s.format.value} {s.element.value} block={s.scale_block or (1, s.group_size)}{act} "
                    f"in={s.in_features} out={s.out_features} dtype={str(p.dtype).removeprefix('torch.')} "
                    f"on {self.target}; backend={self.requested.value}")
        extra += act
        if s.qtype:
            return (f"{s.format.value} {s.qtype} ({s.bits}-bit) in={s.in_features} out={s.out_features} "
                    f"dtype={str(p.dtype).removeprefix('torch.')} on {self.target}; backend={self.requested.value}")
        return (f"{s.format.value} {s.bits}-bit {group} {'sym' if s.sym else 'asym'}{extra} "
                f"pack={str(s.pack_dtype).removeprefix('torch.')} in={s.in_features} out={s.out_features} "
                f"dtype={str(p.dtype).removeprefix('torch.')} on {self.target}; backend={self.requested.value}")

    def explain(self, width: int | None = 100) -> str:
        """Every candidate in selection order with its verdict; the chosen one is marked ``*``.

        Reasons wrap at ``width`` columns; ``None`` keeps each reason on one line (errors and logs)."""
        lines = [self.headline()]
        lines.append(f"chosen: {self.kernel.__name__} ({self.kernel.backend.value})" if self.kernel
                     else "chosen: none (no kernel can run this layer here)")
        for label, text in (("runs", self.runs), ("note", self.note)):
            if text:
                lines += textwrap.wrap(f"{label}: {text}", width or 1 << 30, subsequent_indent="      ")
        rows = [(("*" if v.kernel is self.kernel else " "), "-" if v.priority is None else str(v.priority),
                 v.kernel.backend.value, v.kernel.__name__, v) for v in self.verdicts]
        wb = max([len(r[2]) for r in rows] + [7])
        wc = max([len(r[3]) for r in rows] + [5])
        lines.append(f"    {'prio':>4}  {'backend':<{wb}}  {'class':<{wc}}  verdict")
        indent = 4 + 4 + 2 + wb + 2 + wc + 2
        room = max(30, width - indent) if width else 1 << 30
        for mark, prio, backend, name, v in rows:
            verdict: list[str] = []
            for i, reason in enumerate(v.reasons or ("ok",)):
                text = ("no: " if i == 0 and not v.ok else "    " if not v.ok else "") + reason
                verdict += textwrap.wrap(text, room, break_long_words=False, break_on_hyphens=False,
                                         subsequent_indent="      " if not v.ok else "")
            lines.append(f"  {mark} {prio:>4}  {backend:<{wb}}  {name:<{wc}}  {verdict[0]}")
            lines += [" " * indent + w for w in verdict[1:]]
        if self.others:
            lines.append(f"  ({self.others} other kernels do not declare format {self.problem.scheme.format.value})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "problem": self.headline(),
            "chosen": None if self.kernel is None else {"class": self.kernel.__name__,
                                                        "backend": self.kernel.backend.value},
            "note": self.note,
            "runs": self.runs,
            "candidates": [{"class": v.kernel.__name__, "backend": v.kernel.backend.value, "priority": v.priority,
                            "ok": v.ok, "reasons": list(v.reasons)} for v in self.verdicts],
        }


class NoKernelError(RuntimeError):
    """No kernel can run the layer; the message is the full explain table."""

    def __init__(self, choice: Choice) -> None:
        self.choice = choice
        super().__init__("no kernel can run this layer\n" + choice.explain(width=None))


def _verdict(kernel: type[QuantLinear], problem: Problem, target: Target, auto: bool) -> Verdict:
    prio = kernel.caps.priority(problem.scheme.format)
    reasons = list(kernel.reasons(problem, target))
    if auto and not kernel.caps.auto_selectable:
        reasons.insert(0, "excluded from selection (not a linear-layer backend)")
    elif auto and prio == 0:
        reasons.insert(0, f"explicit only (AUTO priority 0 for {problem.scheme.format.value})")
    elif auto:
        reasons += kernel.auto_reasons(problem, target)
    return Verdict(kernel, prio, tuple(reasons))


def select(problem: Problem, target: Target, backend: BACKEND | str = BACKEND.AUTO) -> Choice:
    """Choose a kernel for ``problem`` on ``target``; raise ``NoKernelError`` (with the table) if none fits."""
    backend = BACKEND(backend)
    fmt = problem.scheme.format
    kernels = all_kernels()
    if backend is BACKEND.AUTO:
        pool = [k for k in kernels if k.caps.priority(fmt) is not None]
        pool.sort(key=lambda k: -(k.caps.priority(fmt) or 0))
        verdicts = tuple(_verdict(k, problem, target, auto=True) for k in pool)
    else:
        pool = [k for k in kernels if k.backend is backend]
        pool.sort(key=lambda k: k.caps.priority(fmt) is None)
        verdicts = tuple(_verdict(k, problem, target, auto=False) for k in pool)
    chosen = next((v.kernel for v in verdicts if v.ok), None)
    runs = chosen.describe_runs(problem, target) if chosen is not None else ""
    choice = Choice(chosen, problem, target, backend, verdicts, others=len(kernels) - len(pool), runs=runs)
    if chosen is None:
        raise NoKernelError(choice)
    return choice


def explain(problem: Problem, target: Target, backend: BACKEND | str = BACKEND.AUTO) -> Choice:
    """Like ``select`` but never raises: the Choice's kernel is None when nothing fits."""
    try:
        return select(problem, target, backend)
    except NoKernelError as err:
        return err.choice


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bf16"``, ``"bfloat16"``, ``"torch.float16"`` ... -> torch dtype (activation dtypes only)."""
    if isinstance(name, torch.dtype):
        return name
    aliases = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32"}
    key = name.strip().lower().removeprefix("torch.")
    key = aliases.get(key, key)
    if key not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"unknown activation dtype {name!r}; expected one of float16, bfloat16, float32")
    return getattr(torch, key)
