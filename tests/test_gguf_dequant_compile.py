"""The GGUF dequant kernel compiled for sm_90 on this CPU (the interpreter cannot see compiled code): for the types
the dense variant decodes at large M, each row's weights leave in 16-byte stores, not 2-byte ones. Field-by-field
stores used 2 of every 32 bytes written and made the kernel L2-bound (947 us for a 4096x14336 Q4_K weight on an
H100; ncu in benchmarks/results/h100-ncu-gguf-2026-12-05.md). Its values are checked bit for bit in the
interpreter (test_gguf_triton_interpret.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"


def test_rows_are_stored_16_bytes_at_a_time() -> None:
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "gguf_sm90_compile.py")], capture_output=True,
                         text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    for name, f in facts.items():
        assert f["st.global.v4.b32"] > 0 and f["st.global.b16"] == 0 and f["st.local"] == 0, (name, f)
