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
CAP = 12
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


def test_every_implemented_cpu_kernel_is_enumerated() -> None:
    names = {k.__name__ for k in KERNELS}
    assert {"TorchLinear", "GGUFTorchLinear", "TorchFP8Linear", "BitsAndBytesTorchLinear", "QQQTorchLinear",
            "MlxTorchLinear", "VPTQLinear", "ParoLinear", "Exl2TorchLinear", "ExllamaV3TorchLinear"} <= names
    assert all(k.implemented for k in implemented_kernels()) and names <= {k.__name__ for k in implemented_kernels()}
    assert {"TorchLinear", "TritonV2Linear", "GGUFTorchLinear", "BitblasLinear"} <= set(registry())


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
    if t.valid is None:  # a family whose builder is not written yet: counted and shown as such, never passed
        pytest.skip(f"{kernel.__name__}: no conformance builder yet (tests/conformance/builders_*.py)")
    assert t.executed + t.refused_count == t.sampled and t.passed <= t.executed
    unexpected = [(label, detail) for label, detail in t.failures if not known(t.kernel, label, detail)]
    assert not unexpected, "\n".join(f"{label}: {detail}" for label, detail in unexpected)


def test_the_harness_fails_a_wrong_product_and_counts_a_machine_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness is not vacuous: a product 5 % off fails, a raising forward fails with its message, and a
    kernel whose package this (fake) machine lacks is refused here with the reason, not passed."""
    from qlinear.kernels.bitsandbytes import BitsAndBytesLinear
    from qlinear.kernels.torch import TorchLinear
    from qlinear.target import Target

    forward = TorchLinear.forward
    monkeypatch.setattr(TorchLinear, "forward", lambda self, x: forward(self, x) * 1.05)
    t = tally(TorchLinear, "cpu", 3)
    assert t.passed == 0 and len(t.failures) == 3 and "max|y - ref| / max|ref|" in t.failures[0][1]

    def broken(self, x):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(TorchLinear, "forward", broken)
    t = tally(TorchLinear, "cpu", 2)
    assert [d for _, d in t.failures] == ["RuntimeError: kernel exploded"] * 2

    t = tally(BitsAndBytesLinear, "cpu", 2, target=Target.fake_cpu(modules={"bitsandbytes": False}))
    assert t.executed == t.passed == 0 and t.refused_count == 2
    assert all("needs Python module 'bitsandbytes'" in reason for reason in t.refused)
