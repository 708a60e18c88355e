"""``exl3_wg_kernel`` (Gluon: wgmma with the trellis decoded into its A registers, x by TMA) compiled for sm_90 on
this CPU: the decode reaches wgmma without shared memory or shuffles inside the K loop (``assert_trivial`` fails the
compile otherwise), one wgmma group stays in flight while the next step decodes (``DEPBAR.LE gsb0, 0x1``), nothing
rewrites an in-flight wgmma's A registers (``test_gluon_sass.wgmma_hazards``, itself tested on planted SASS), and
nothing spills. Numbers run on the GPU (``benchmarks/gpu_exl3_wg.py``: bit-exact decode and float64 at every width
x codebook)."""

from __future__ import annotations

import pytest

from tests.exl3_wg_sm90_compile import CASES
from tests.sm90_facts import compile_facts


@pytest.fixture(scope="module")
def facts() -> dict:
    return compile_facts("exl3_wg_sm90_compile.py")


@pytest.mark.parametrize("case", sorted(CASES))
def test_decode_feeds_wgmma_pipelined_without_hazards(facts: dict, case: str) -> None:
    got = facts[case]
    assert got["loop"]["LDS"] == got["loop"]["STS"] == got["loop"]["SHFL"] == 0, got
    assert got["loop"]["HGMMA"] == got["hgmma_per_body"], got
    assert got["depbar"] and all(d == "gsb0, 0x1" for d in got["depbar"]), got
    assert got["hazards"] == [], got
    assert got["STL"] == got["LDL"] == 0, got
