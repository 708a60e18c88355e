"""Shared test options: ``--update-golden`` rewrites the golden explain tables instead of comparing."""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from the current output")
    parser.addoption("--fuzz-inputs", type=int, default=5_000,
                     help="mutated inputs per reader in tests/fuzz (the seed corpus always runs too); 5,000 keeps "
                          "CI under its 25 minutes on a slow runner, --fuzz-inputs 20000 for a longer run")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """``golden(name, text)``: compare ``text`` with tests/golden/<name> (or rewrite it with --update-golden)."""

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if request.config.getoption("--update-golden"):
            path.write_text(text + "\n")
            return
        assert path.exists(), f"{path} missing: run pytest --update-golden once and review the file"
        assert text + "\n" == path.read_text(), f"{name} changed; review and run pytest --update-golden"

    return check
