"""``exl2_tc_kernel`` compiled for sm_90 on this CPU (the interpreter runs gemv_tc's plain-Triton twin, not the
PTX): ptxas takes the three segments' inline PTX in one kernel, each segment issues the MMAs it issues alone, and
nothing spills to local memory."""

from __future__ import annotations

from tests.sm90_facts import compile_facts


def test_three_segments_compile_as_the_sum_of_their_parts() -> None:
    f = compile_facts("exl2_tc_sm90_compile.py")
    for dt in ("bf16", "f16"):
        assert f[f"{dt}_012"]["bits"] == [8, 4, 2], f
        alone = sum(f[f"{dt}_{i}"]["HMMA"] for i in range(3))
        assert f[f"{dt}_012"]["HMMA"] == alone > 0, f
    for form in f.values():
        assert form["LDL"] == 0 and form["STL"] == 0, f
