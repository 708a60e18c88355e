"""gemm4 and gemm5 (Gluon) compiled for sm_90 on this CPU: their loops must leave every in-flight wgmma's A
registers alone, and gemm5's warp-specialised loop must stay pipelined.

Gluon kernels do not run under ``TRITON_INTERPRET``, so CI checks what can be checked without a GPU: the kernel
compiles for sm_90 with the installed Triton (HGMMA, TMA, no local-memory spills; the dequantized tile reaches
wgmma without a layout shuffle, which ``convert_layout(assert_trivial=True)`` enforces at compile time), and
the SASS has no write to a register an issued HGMMA reads before the ``WARPGROUP.DEPBAR`` that retires it. That
hazard is what a one-step loop body compiled to (the H200 gave different outputs on two calls); the scanner
below is tested on planted SASS first, so a silent scanner cannot pass the kernel. gemm5 must also keep its
wgmma in flight across steps: ptxas serializes every HGMMA of a warp-specialised region when a path reaches
the final wait with non-wgmma writes to the accumulator (a loop that may run zero times), losing the overlap.
Numerics run on the H200 (``benchmarks/gpu_check.py``, results under ``benchmarks/results/``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: an HGMMA reads its A fragment from 4 registers starting at its second operand when that is a register
HGMMA_A = re.compile(r"HGMMA\.\S+\s+R\d+,\s+R(\d+),")
INSTR = re.compile(r"^[^\t]*\t\s*(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)\s*(.*?);")
LABEL = re.compile(r"^\s*(\.?L\w+|LBB\d+):")
NO_DEST = ("HGMMA", "BRA", "BAR", "WARPGROUP", "ST", "RED", "ATOM", "SYNCS", "EXIT", "RET", "UTMA", "BSYNC", "BSSY",
           "NOP", "DEPBAR", "CCTL", "MEMBAR", "FENCE", "ERRBAR", "CALL")


def _program(sass: str) -> list[tuple[str, str, bool]]:
    """(opcode, operands, predicated) per instruction; labels as ("LABEL", name, False)."""
    out = []
    for line in sass.splitlines():
        if found := LABEL.match(line):
            out.append(("LABEL", found.group(1), False))
        elif found := INSTR.match(line):
            out.append((found.group(1), found.group(2), "@" in line.split(found.group(1))[0]))
    return out


def _written(op: str, args: str) -> set[int]:
    """Registers an instruction writes (its first operand), widened for 64/128-bit results."""
    if op.startswith(NO_DEST) and not op.startswith("STL"):
        return set()
    found = re.match(r"R(\d+)", args)
    if not found:
        return set()
    width = 4 if ".128" in op else 2 if (".64" in op or op.startswith(("CS2R", "IMAD.WIDE"))) else 1
    return set(range(int(found.group(1)), int(found.group(1)) + width))


def wgmma_hazards(sass: str) -> list[str]:
    """Writes to an issued HGMMA's A registers before the DEPBAR that retires its group, following the code as
    it runs (a backward branch is taken: the loop goes round; forward conditional branches fall through)."""
    prog = _program(sass)
    labels = {args: i for i, (op, args, _) in enumerate(prog) if op == "LABEL"}
    hazards = []
    for i, (op, args, _) in enumerate(prog):
        found = HGMMA_A.match(f"{op} {args}")
        if not found:
            continue
        a_regs = set(range(int(found.group(1)), int(found.group(1)) + 4))
        committed = "gsb0" in args  # this HGMMA closes its group
        later_groups, j = 0, i
        for _ in range(20000):
            j += 1
            if j >= len(prog):
                break
            op2, args2, predicated = prog[j]
            if op2.startswith("HGMMA"):
                if "gsb0" in args2:
                    later_groups += committed
                    committed = True
                continue
            if op2 == "WARPGROUP.DEPBAR.LE" and committed and int(args2.split(",")[1], 16) <= later_groups:
                break  # at most later_groups pending: ours is done
            if op2 == "BRA":
                target = labels.get(args2.strip())
                if target is not None and (not predicated or target < j):
                    j = target
                continue
            if _written(op2, args2) & a_regs:
                hazards.append(f"HGMMA A=R{found.group(1)} (instr {i}) overwritten by {op2} {args2} (instr {j})")
                break
    return hazards


PLANTED = """\
LBB0:
--:-:-:-:1\tLOP3.LUT R88, R4, 0xf000f, R8, 0xea, !PT;
--:-:-:-:1\tWARPGROUP.ARRIVE;
--:-:-:-:1\tHGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR4], R24, gsb0;
--:-:-:-:1\tWARPGROUP.DEPBAR.LE gsb0, 0x1;
--:-:-:-:1\t@P0 BRA LBB0;
--:-:-:-:1\tWARPGROUP.DEPBAR.LE gsb0, 0x0;
"""


TWO_SETS = """\
LBB0:
--:-:-:-:1\tLOP3.LUT R88, R4, 0xf000f, R8, 0xea, !PT;
--:-:-:-:1\tWARPGROUP.ARRIVE;
--:-:-:-:1\tHGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR4], R24, gsb0;
--:-:-:-:1\tWARPGROUP.DEPBAR.LE gsb0, 0x1;
--:-:-:-:1\tLOP3.LUT R92, R5, 0xf000f, R8, 0xea, !PT;
--:-:-:-:1\tWARPGROUP.ARRIVE;
--:-:-:-:1\tHGMMA.64x128x16.F32.BF16 R24, R92, gdesc[UR4], R24, gsb0;
--:-:-:-:1\tWARPGROUP.DEPBAR.LE gsb0, 0x1;
--:-:-:-:1\t@P0 BRA LBB0;
--:-:-:-:1\tWARPGROUP.DEPBAR.LE gsb0, 0x0;
"""


def test_scanner_finds_a_planted_register_hazard() -> None:
    """One A set per loop body (the first gemm4): the loop head rewrites R88 while the HGMMA may run. Waiting for
    every group, or two steps an iteration with their own registers (the fix), is clean."""
    assert len(wgmma_hazards(PLANTED)) == 1
    assert wgmma_hazards(PLANTED.replace("DEPBAR.LE gsb0, 0x1", "DEPBAR.LE gsb0, 0x0")) == []
    assert wgmma_hazards(TWO_SETS) == []
    assert len(wgmma_hazards(TWO_SETS.replace("R92", "R89"))) == 1  # the second step writes into the first's A


@pytest.fixture(scope="module")
def sass(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every case of ``gluon_sass_compile.CASES`` compiled in a fresh process (see that module for why)."""
    pytest.importorskip("triton.experimental.gluon")
    from tests.gluon_sass_compile import CASES

    out = tmp_path_factory.mktemp("sass")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("gluon_sass_compile.py")), str(out)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    found = {}
    for name in CASES:
        err = out / f"{name}.err"
        if err.exists():
            text = err.read_text()
            if "ptxas" in text or "cuobjdump" in text:  # no bundled sm_90 toolchain on this platform
                pytest.skip(f"sm_90 toolchain unavailable: {text[:300]}")
            raise AssertionError(f"{name} did not compile: {text[-3000:]}")
        found[name] = (out / f"{name}.sass").read_text()
    return found


@pytest.mark.parametrize("case", ["gemm4-16x128x128-w4", "gemm4-128x128x64-w8-split-zeros",
                                  "gemm4-64x64x128-w4-split"])
def test_gemm4_compiles_for_sm90_without_wgmma_register_hazards(sass: dict[str, str], case: str) -> None:
    code = sass[case]
    assert len(re.findall(r"\bHGMMA\.", code)) >= 8, "the two steps' wgmma (4+ k16 slices each)"
    assert "UTMALDG" in code, "activations by TMA"
    assert not re.search(r"\b(STL|LDL)\b", code), "no local-memory spills"
    assert wgmma_hazards(code) == []


@pytest.mark.parametrize("case", ["gemm5-16x128x128-w4-r128", "gemm5-128x128x64-w8-split-zeros",
                                  "gemm5-64x64x128-w4-split-zeros-r128", "gemm5-g32-16x128x128-w4-zeros-r128",
                                  "gemm5-g32-64x64x128-w4-split-kquant-r128", "gemm5-g32-128x128x64-w8-affine32",
                                  "gemm5-g32-64x64x128-w4-kquant-f16-r128", "gemm5-8bit-16x128x128-w4-zeros-r128",
                                  "gemm5-8bit-g32-64x64x128-w4-split-r128", "gemm5-8bit-128x128x64-w8-zeros-f16",
                                  "gemm5-mlx-16x128x64-w4-offsets-r128",
                                  "gemm5-8bit-mlx-64x64x128-w4-split-offsets-r128"])
def test_gemm5_compiles_for_sm90_pipelined_and_without_hazards(sass: dict[str, str], case: str) -> None:
    code = sass[case]
    hgmma = len(re.findall(r"\bHGMMA\.", code))
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", code)
    assert hgmma >= 16, "four steps' wgmma (the peeled pair and the loop's pair)"
    assert len(waits) < hgmma // 2 and "0x1" in waits, f"wgmma serialized: {len(waits)} waits for {hgmma} HGMMA"
    offsets = any(f in case for f in ("kquant", "affine32", "offsets"))
    rows = 1 + ("zeros" in case) + offsets + ("kquant" in case)
    assert len(re.findall(r"UTMALDG", code)) >= 2 + rows, "x, words, scales (zeros, offsets, super pairs) by TMA"
    if offsets:  # s q + o: one FMA a K pair after the exact magic subtract
        assert len(re.findall(r"\bHFMA2\b", code)) >= 64, "the offsets' FMA pairs"
    assert not re.search(r"\b(STL|LDL)\b", code), "no local-memory spills"
    assert wgmma_hazards(code) == []
