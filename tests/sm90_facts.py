"""Run a ``tests/*_sm90_compile.py`` script in a fresh process (a process that ran Triton's interpreter cannot
compile; see gluon_sass_compile.py) and return the JSON facts it prints last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"


def compile_facts(script: str) -> dict:
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    out = subprocess.run([sys.executable, str(ROOT / "tests" / script)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])
