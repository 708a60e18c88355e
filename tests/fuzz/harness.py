"""Run a reader over many inputs and classify each outcome: accepted, refused with a qlinear error, or a failure.

A failure is anything else: an exception that is not one of qlinear's own refusals (a ``ValueError`` raised by
qlinear's code, or of a type qlinear defines, whose message names the file, tensor or field), an input that takes
longer than the time bound (a SIGALRM interrupts real hangs), or Python-tracked allocations beyond the memory bound
(twice the input's size plus a fixed allowance: a length field must never size an allocation).
"""

from __future__ import annotations

import signal
import time
import traceback
import tracemalloc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import qlinear

SLACK_BYTES = 4 << 20  # interpreter, numpy and torch bookkeeping that does not scale with the input


QLINEAR_SRC = Path(qlinear.__file__).resolve().parent


class Hang(Exception):
    """Raised by the alarm inside a reader that ran past the time bound."""


def qlinear_error(err: BaseException) -> bool:
    """One of qlinear's own refusals: a ``ValueError`` with a message, of a type defined in qlinear or raised by
    qlinear's own code (not by torch, numpy or json underneath it)."""
    if not isinstance(err, ValueError) or not str(err):
        return False
    if type(err).__module__.startswith("qlinear"):
        return True
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and Path(frames[-1].filename).is_relative_to(QLINEAR_SRC)


@dataclass
class Report:
    """What a fuzz run found; ``failures`` holds (input index, kind, detail) for each failing input."""

    reader: str
    inputs: int = 0
    accepted: int = 0
    refused: int = 0
    failures: list[tuple[int, str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        kinds: dict[str, int] = {}
        for _, kind, _ in self.failures:
            kinds[kind] = kinds.get(kind, 0) + 1
        found = ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) or "0 failures"
        return (f"{self.reader}: {self.inputs} inputs in {self.seconds:.1f} s: {self.accepted} accepted, "
                f"{self.refused} refused with a qlinear error, {found}")


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _attempt(read: Callable[[Any], object], item: Any, seconds: float) -> tuple[str, str, int, float]:
    """One call: its outcome ("accepted", "refused", "hang", "foreign exception"), a detail, the peak of
    Python-tracked allocations during it and its duration."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    signal.setitimer(signal.ITIMER_REAL, seconds)
    t0 = time.perf_counter()
    outcome, detail = "accepted", ""
    try:
        read(item)
    except Hang:
        outcome, detail = "hang", f"over {seconds} s"
    except Exception as err:  # classifying every exception is the point
        if qlinear_error(err):
            outcome = "refused"
        else:
            frame = traceback.extract_tb(err.__traceback__)[-1]
            outcome = "foreign exception"
            detail = (f"{type(err).__module__}.{type(err).__name__}: {str(err)[:200]} (at {frame.filename}:"
                      f"{frame.lineno})")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return outcome, detail, tracemalloc.get_traced_memory()[1] - base, time.perf_counter() - t0


def run(reader: str, inputs: Iterable[tuple[Any, int]], read: Callable[[Any], object], *,
        seconds_per_input: float = 2.0) -> Report:
    """Call ``read`` on each ``(input, size_in_bytes)``; classify every outcome into the report.

    An input over the memory bound is read a second time and counts as a failure only if it is over again: a
    first use of a code path may import a module or fill a cache once, which is not an allocation the input sized.
    """
    report = Report(reader)
    start = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    try:
        for i, (item, size) in enumerate(inputs):
            report.inputs += 1
            bound = 2 * size + SLACK_BYTES
            outcome, detail, peak, took = _attempt(read, item, seconds_per_input)
            if peak > bound:
                peak = _attempt(read, item, seconds_per_input)[2]
            if outcome == "accepted":
                report.accepted += 1
            elif outcome == "refused":
                report.refused += 1
            else:
                report.failures.append((i, outcome, detail))
            if peak > bound:
                report.failures.append((i, "over memory", f"{peak} bytes allocated for a {size}-byte input"))
            if took > seconds_per_input and outcome != "hang":
                report.failures.append((i, "hang", f"{took:.2f} s"))
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGALRM, old)
    report.seconds = time.perf_counter() - start
    return report
