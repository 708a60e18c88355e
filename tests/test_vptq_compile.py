"""The VPTQ Triton kernels compiled for sm_90 on this CPU (the interpreter cannot see compiled code): every kernel
compiles; the norm's product and sum stay separate float16 roundings (``mul.rn.f16`` / ``add.rn.f16``, no FMA:
the producers round after each); codebook vectors are gathered 16 bytes at a time; no local-memory spills; the
tile path multiplies on tensor cores. Numerics are checked in the interpreter (test_triton_vptq_interpret.py) and
on the GPU (benchmarks/gpu_vptq.py)."""

from __future__ import annotations

import pytest

from tests.sm90_facts import compile_facts


@pytest.fixture(scope="module")
def facts() -> dict:
    return compile_facts("vptq_sm90_compile.py")


def test_norm_rounds_twice_without_fma(facts: dict) -> None:
    for name, f in facts.items():
        assert f["fma.rn"] == 0 and f["mul.rn.f16"] > 0 and f["add.rn.f16"] > 0, (name, f)


def test_gathers_are_vectorized_and_nothing_spills(facts: dict) -> None:
    for name, f in facts.items():
        assert f["ld.global.v4"] > 0 and f["st.local"] == 0, (name, f)


def test_paths(facts: dict) -> None:
    assert facts["mma"]["mma"] > 0 and facts["gemv-m1"]["mma"] == 0  # wgmma or mma.sync
    assert all(facts[k]["atom.global"] > 0 for k in ("gemv-m1", "gemv-m4", "mma"))
    assert facts["decode"]["atom.global"] == 0 and facts["gemv-m1"]["cvt.rn.bf16.f32"] > 0
