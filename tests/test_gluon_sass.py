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

import re

import pytest
import torch

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


def _compile(block_m: int, block_n: int, block_k: int, warps: int, split: bool, has_z: bool) -> object:
    # Triton is imported here, not at collection: the interpreter modules set TRITON_INTERPRET when they are
    # collected, and a Triton imported before that decorates its own helpers for the compiler, not the interpreter
    pytest.importorskip("triton.experimental.gluon")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    from qlinear.kernels.triton.qmm4 import qmm4_kernel

    x = torch.empty(256, 4096, dtype=torch.bfloat16)
    layout = gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.bfloat16)
    desc = TensorDescriptor.from_tensor(x, [block_m, block_k], layout)
    consts = dict(GS=128, ZC=8, HAS_Z=has_z, HAS_BIAS=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  STAGES=4, SPLIT=split)
    ptrs = {"W": "*i32", "S": "*fp16", "Z": "*u8", "BIAS": "*bf16", "Y": "*bf16", "PART": "*fp32", "LOCK": "*i32"}
    names = qmm4_kernel.arg_names
    sig = {a: "constexpr" if a in consts else mangle_type(desc) if a == "x_desc" else ptrs.get(a, "i32")
           for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in ptrs or a in ("NP", "stride_ym")}
    src = GluonASTSource(qmm4_kernel, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})


@pytest.mark.parametrize("tile", [(16, 128, 128, 4, False, False), (128, 128, 64, 8, True, True),
                                  (64, 64, 128, 4, True, False)])
def test_gemm4_compiles_for_sm90_without_wgmma_register_hazards(tile: tuple[int, int, int, int, bool, bool]) -> None:
    from triton.tools.disasm import get_sass

    try:
        kernel = _compile(*tile)
    except (RuntimeError, FileNotFoundError) as err:  # no bundled ptxas/cuobjdump on this platform
        if "ptxas" in str(err) or "cuobjdump" in str(err):
            pytest.skip(f"sm_90 toolchain unavailable: {err}")
        raise
    sass = get_sass(kernel.asm["cubin"])  # type: ignore[attr-defined]
    assert len(re.findall(r"\bHGMMA\.", sass)) >= 8, "the two steps' wgmma (4+ k16 slices each)"
    assert "UTMALDG" in sass, "activations by TMA"
    assert not re.search(r"\b(STL|LDL)\b", sass), "no local-memory spills"
    assert wgmma_hazards(sass) == []


def _compile5(block_m: int, block_n: int, block_k: int, warps: int, split: bool, has_z: bool,
              max_registers: int) -> object:
    pytest.importorskip("triton.experimental.gluon")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    from qlinear.kernels.triton.qmm5 import _descriptor, qmm5_kernel

    tensors = {"x_desc": (torch.empty(256, 4096, dtype=torch.bfloat16), [block_m, block_k]),
               "w_desc": (torch.empty(512, 4096, dtype=torch.int32), [block_k // 8, block_n]),
               "s_desc": (torch.empty(32, 4096, dtype=torch.float16), [1, block_n]),
               "z_desc": (torch.empty(32, 4096, dtype=torch.uint8 if has_z else torch.float16), [1, block_n])}
    descs = {name: _descriptor(t, block) for name, (t, block) in tensors.items()}
    consts = dict(GS=128, ZC=8, HAS_Z=has_z, HAS_BIAS=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  STAGES=4, SPLIT=split, LOADER_REGS=40)
    ptrs = {"BIAS": "*bf16", "Y": "*bf16", "PART": "*fp32", "LOCK": "*i32"}
    names = qmm5_kernel.arg_names
    sig = {a: "constexpr" if a in consts else mangle_type(descs[a]) if a in descs else ptrs.get(a, "i32")
           for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in ptrs or a == "stride_ym"}
    options = {"num_warps": warps} | ({"maxnreg": max_registers} if max_registers else {})
    src = GluonASTSource(qmm5_kernel, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


@pytest.mark.parametrize("tile", [(16, 128, 128, 4, False, False, 128), (128, 128, 64, 8, True, True, 0),
                                  (64, 64, 128, 4, True, True, 128)])
def test_gemm5_compiles_for_sm90_pipelined_and_without_hazards(tile: tuple) -> None:
    from triton.tools.disasm import get_sass

    try:
        kernel = _compile5(*tile)
    except (RuntimeError, FileNotFoundError) as err:  # no bundled ptxas/cuobjdump on this platform
        if "ptxas" in str(err) or "cuobjdump" in str(err):
            pytest.skip(f"sm_90 toolchain unavailable: {err}")
        raise
    sass = get_sass(kernel.asm["cubin"])  # type: ignore[attr-defined]
    hgmma = len(re.findall(r"\bHGMMA\.", sass))
    waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
    assert hgmma >= 16, "four steps' wgmma (the peeled pair and the loop's pair)"
    assert len(waits) < hgmma // 2 and "0x1" in waits, f"wgmma serialized: {len(waits)} waits for {hgmma} HGMMA"
    assert len(re.findall(r"UTMALDG", sass)) >= 3 + tile[5], "x, words, scales (and zeros) by TMA"
    assert not re.search(r"\b(STL|LDL)\b", sass), "no local-memory spills"
    assert wgmma_hazards(sass) == []
