"""Compile gemv_tc's 8-bit forms for sm_90 on this CPU (ptxas checks the inline PTX) and print SASS facts as JSON:
run in a fresh process by ``test_qmv_tc_sm90_compile.py`` (a process that ran Triton's interpreter cannot compile).

    python3 tests/qmv_tc_sm90_compile.py
"""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass

from qlinear.kernels.triton.qmv_tc import qmv_tc_kernel
from qlinear.kernels.triton.qmv_tc_asm import MMA_CONSTRAINTS, mma_asm

UNIT = 2  # chunks a step: 2 x 4 fields


def facts(bf16: bool, sub: bool) -> dict[str, int]:
    names = qmv_tc_kernel.arg_names
    consts = dict(GS=128, BITS=8, R=8, ZC=128, HAS_Z=False, HAS_OFF=False, HAS_SUP=False, HAS_BIAS=False, WN=4,
                  WK=1, UNIT=UNIT, NB=1, SPLIT=True, EVEN_K=True, EVEN_N=True, PREFETCH=False, SUBZ=sub,
                  STAGE_X=False, SUM_ROWS=4, VEC_PARAMS=False, USE_ASM=True, ASM=mma_asm(8, 4, bf16, 1, sub, not sub),
                  CONSTRAINTS=MMA_CONSTRAINTS)
    act = "*bf16" if bf16 else "*fp16"
    ptrs = {"X": act, "Y": act, "BIAS": act, "W": "*i32", "S": "*fp16", "Z": "*i32", "OFF": "*fp32", "SUP": "*fp32",
            "PART": "*fp32", "LOCK": "*i32"}
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in (*ptrs, "NP", "stride_xm", "stride_ym")}
    c = triton.compile(ASTSource(qmv_tc_kernel, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=1))
    sass = get_sass(c.asm["cubin"])
    return {"HMMA": sass.count("HMMA."), "LDL": sass.count("LDL"), "STL": sass.count("STL"), "unit": UNIT}


if __name__ == "__main__":
    print(json.dumps({"bf16": facts(True, True), "f16": facts(False, False), "f16_sub": facts(False, True)}))
