"""gemv_tc's 8-bit inline PTX compiled for sm_90 on this CPU (the interpreter runs a plain-Triton twin instead, and
``test_qmv_tc_asm.py`` emulates the PTX text): ptxas accepts both forms, each step issues the MMAs the design
says, and nothing spills to local memory."""

from __future__ import annotations

from tests.sm90_facts import compile_facts


def test_eight_bit_forms_compile_with_their_mma_counts() -> None:
    f = compile_facts("qmv_tc_sm90_compile.py")
    unit = f["bf16"]["unit"]
    # per chunk and tile: bf16 one MMA per field (4 fields, byte split), f16 one per two fields, + Cx unless sub
    assert f["bf16"]["HMMA"] == unit * 4 * 2, f
    assert f["f16"]["HMMA"] == unit * (2 * 2 + 2), f
    assert f["f16_sub"]["HMMA"] == unit * 2 * 2, f
    for form in f.values():
        assert form["LDL"] == 0 and form["STL"] == 0, f
