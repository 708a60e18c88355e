"""gemv_tc's inline asm gets each lane's own registers: checked on the compiled kernel (sm_90, no GPU).

On the H200, staging x through shared memory for field blocks of 4 rows made Triton give the asm the
reshape's layout (a thread's 4 packed registers from 4 different rows) and the results were wrong; the
interpreter cannot see this (it has no layouts). Here every option is compiled with the installed triton and
the asm's operand layout must give each thread one row of 4 (checked with triton 3.6, the H200's, and 3.9, CI's).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[1]
#: bits, R, warps along N, warps along K, chunks a step, 8-row sets, prefetch, sub_zero, stage_x, x aligned
CASES = [(4, 8, 2, 1, 4, 1, False, True, False, True), (4, 8, 2, 1, 4, 1, False, True, True, True),
         (4, 8, 4, 1, 2, 2, True, False, True, True), (2, 8, 2, 1, 4, 1, False, True, True, True),
         (4, 4, 4, 1, 4, 1, False, True, True, True), (2, 2, 2, 1, 2, 1, True, True, True, True),
         (2, 4, 2, 1, 4, 1, False, True, True, True), (4, 8, 2, 2, 2, 1, False, False, True, True),
         (4, 8, 2, 1, 4, 1, False, True, True, False), (4, 8, 4, 1, 2, 2, True, True, True, False),
         (2, 8, 1, 1, 2, 1, False, False, True, False), (4, 4, 2, 1, 2, 1, False, True, False, False),
         (4, 8, 4, 1, 1, 2, False, True, True, True), (2, 8, 2, 1, 1, 2, False, True, True, True),
         (2, 8, 2, 1, 2, 2, False, True, True, False)]  # the last three: M=16 as shipped (both row sets staged)


@pytest.mark.slow
def test_the_asm_operands_are_one_row_of_four_per_lane() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    out = subprocess.run([sys.executable, "-m", "tests.qmv_tc_layout_probe", json.dumps(CASES)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    layouts = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(layouts) == len(CASES)
    for case, encs in layouts.items():
        assert len(encs) == 1, f"{case}: the asm's operands in several layouts {encs}"
        enc = encs[0]
        # a thread's 4 registers are its row's 4 columns: 32 lanes and the warps down the rows, and either the 4
        # columns in one thread or 1 column repeated 4 times (triton 3.6 picks that for the per-lane path)
        assert enc.startswith("#ttg.blocked<"), f"{case}: {enc}"
        assert "threadsPerWarp = [32, 1]" in enc and re.search(r"warpsPerCTA = \[\d+, 1\]", enc), f"{case}: {enc}"
        assert "sizePerThread = [1, 4]" in enc or "sizePerThread = [1, 1]" in enc, f"{case}: {enc}"
