"""Shared pieces of the reader fuzz tests: the input count, a scratch directory in memory, the seed corpus."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parent / "corpus"


@pytest.fixture
def fuzz_inputs(request: pytest.FixtureRequest) -> int:
    return int(request.config.getoption("--fuzz-inputs"))


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A scratch directory, in shared memory where there is one (tens of thousands of small writes)."""
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(prefix="qlinear-fuzz-", dir=shm if shm.is_dir() else None) as d:
        yield Path(d)


def report_and_check(report) -> None:
    """Print the counts (CI logs them) and fail listing the first failures."""
    print(report.line())
    assert not report.failures, report.line() + "\n" + "\n".join(
        f"input {i}: {kind}: {detail}" for i, kind, detail in report.failures[:10])
