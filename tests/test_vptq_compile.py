"""The VPTQ Triton kernels compiled for sm_90 on this CPU (the interpreter cannot see compiled code): every kernel
compiles; the norm's product and sum stay separate float16 roundings (``mul.rn.f16`` / ``add.rn.f16``, no FMA:
the producers round after each); codebook vectors are gathered 16 bytes at a time; no local-memory spills; the
tile path multiplies on tensor cores. Numerics are checked in the interpreter (test_triton_vptq_interpret.py) and
on the GPU (benchmarks/gpu_vptq.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"


@pytest.fixture(scope="module")
def facts() -> dict:
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "vptq_sm90_compile.py")], capture_output=True,
                         text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


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
