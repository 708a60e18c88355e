"""``exl3_tc_kernel`` (Gluon) compiled for sm_90 on this CPU: the decoded trellis reaches ``mma.sync`` as its A
fragment without moving (``convert_layout(assert_trivial=True)`` fails the compile otherwise), so the kernel has no
shared-memory traffic, no shuffles and no barriers at all; one K step issues one HMMA per 16 x 16 tile, n tile and
8 rows a warp holds; nothing spills. Gluon does not run under ``TRITON_INTERPRET``: the numbers are checked on the
GPU (``benchmarks/gpu_exl3_tc.py``, every width x codebook against float64)."""

from __future__ import annotations

import pytest

from tests.exl3_tc_sm90_compile import CASES
from tests.sm90_facts import compile_facts


@pytest.fixture(scope="module")
def facts() -> dict:
    return compile_facts("exl3_tc_sm90_compile.py")


def test_decode_reaches_the_mma_without_moving(facts: dict) -> None:
    f = facts
    assert set(f) == set(CASES), f
    for name, (_bits, _cb, nt, kt, bm, warps, _atomic) in CASES.items():
        got = f[name]
        assert got["LDS"] == got["STS"] == got["SHFL"] == got["BAR.SYNC"] == 0, (name, got)
        assert got["LDL"] == got["STL"] == 0, (name, got)
        assert got["loops"] == 1, (name, got)
        assert got["loop_HMMA"] == nt // warps * kt * bm // 8, (name, got)


def test_a_step_costs_about_what_the_gemv_decode_does(facts: dict) -> None:
    """The loop's instructions per weight a thread decodes: the one-row GEMV compiles to about 9 at 2 bits
    (``exl3_gemv.py``); the fragment kernel has no FMAs per weight, so the few-row launch must not exceed it."""
    got = facts["2bit-3inst-few"]
    per_weight = got["loop_instructions"] / got["weights_per_thread_step"]
    assert 2 < per_weight < 9.5, got
