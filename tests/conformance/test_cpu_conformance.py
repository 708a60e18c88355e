"""Conformance on the CPU: for every implemented kernel that declares the CPU, a deterministic covering sample of its
valid declared combinations is built through the public constructors, run at M = 1 and M = 5 and compared with a
float64 oracle (``tests/conformance``). A combination the selector refuses here for a machine reason (a missing
package, a CPU flag) is counted as refused with the reason, never as passed; one that raises or mismatches fails
the test unless it is a known, reported defect listed in ``known.KNOWN``. Prints one line per kernel and a total.
"""

from __future__ import annotations

import contextlib

import pytest

from tests.conformance.builders import registry
from tests.conformance.known import known
from tests.conformance.run import Tally, kernels_for, tally
from tests.conformance.space import declared, implemented_kernels, sample, valid

#: Combinations per kernel: the greedy cover reaches every value of every axis (and most value pairs) within it,
#: and the whole file stays well under 60 s on a busy two-core machine.
CAP = 16
KERNELS = kernels_for("cpu")
TALLIES: list[Tally] = []


@pytest.fixture(scope="module", autouse=True)
def summary(request: pytest.FixtureRequest):
    """After the module: one line per kernel and the total, on the terminal (pytest's capture hides prints)."""
    yield
    lines = [t.line() for t in TALLIES]
    tot = [sum(getattr(t, f) or 0 for t in TALLIES) for f in ("declared", "valid", "sampled", "executed", "passed")]
    lines.append(f"TOTAL: declared {tot[0]} / valid {tot[1]} / sampled {tot[2]} / executed {tot[3]} / passed "
                 f"{tot[4]} / refused here {sum(t.refused_count for t in TALLIES)} / failed "
                 f"{sum(len(t.failures) for t in TALLIES)}")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print("\n" + "\n".join(["conformance (cpu):", *lines]))


def test_every_cpu_kernel_is_enumerated_and_has_a_builder() -> None:
    builders = registry()
    names = {k.__name__ for k in KERNELS}
    assert {"TorchLinear", "GGUFTorchLinear", "TorchFP8Linear", "BitsAndBytesTorchLinear", "QQQTorchLinear"} <= names
    missing = sorted(names - set(builders))  # reported as "no builder yet" by the tallies, never silently skipped
    assert not missing, f"CPU kernels without a conformance builder: {missing}"
    assert all(k.implemented for k in implemented_kernels())


def test_sample_is_deterministic_and_covers_every_axis_value() -> None:
    from qlinear.kernels.torch import TorchLinear

    b = registry()["TorchLinear"]
    ok = valid(declared(TorchLinear), b.variants, b.check)
    first, again = sample(ok, CAP), sample(ok, CAP)
    assert first == again and len(first) == CAP
    for axis in ("format", "bits", "group_size", "desc_act", "sym", "dtype", "pack_dtype"):
        assert {getattr(c, axis) for c in first} == {getattr(c, axis) for c in ok}, axis


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.__name__)
def test_declared_combinations_run_and_match_the_oracle(kernel: type) -> None:
    t = tally(kernel, "cpu", CAP)
    TALLIES.append(t)
    assert t.valid is not None, f"{kernel.__name__}: no builder yet"
    assert t.executed + t.refused_count == t.sampled and t.passed <= t.executed
    unexpected = [(label, detail) for label, detail in t.failures if not known(t.kernel, label, detail)]
    assert not unexpected, "\n".join(f"{label}: {detail}" for label, detail in unexpected)
