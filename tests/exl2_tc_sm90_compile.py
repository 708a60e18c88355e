"""Compile ``exl2_tc_kernel`` (every EXL2 segment in one gemv_tc launch) for sm_90 on this CPU and print SASS facts
as JSON: ptxas must take the three segments' inline PTX in one kernel. Run in a fresh process by
``test_exl2_tc_sm90_compile.py`` (a process that ran Triton's interpreter cannot compile).

    python3 tests/exl2_tc_sm90_compile.py
"""

from __future__ import annotations

import json

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass

from qlinear.kernels import exl2_runtime
from qlinear.kernels.triton.exl2_tc import MAX_SEGMENTS, exl2_tc_kernel
from qlinear.kernels.triton.qmv_tc import units
from qlinear.kernels.triton.qmv_tc_asm import MMA_CONSTRAINTS, mma_asm
from qlinear.layouts import exl2

#: 8/6/5-bit groups (8-bit words), 4/3-bit (4-bit words), 2-bit: three segments, groups of 32 as in the benchmark
PARAMS = exl2.Exl2Params((8, 6, 5, 4, 4, 3, 3, 2, 2), (32,) * 9)


def facts(bf16: bool, segments: tuple[int, ...]) -> dict[str, object]:
    n = 256
    codes = torch.cat([torch.randint(0, 1 << b, (r, n)) for b, r in zip(PARAMS.group_bits, PARAMS.group_rows)])
    packs = exl2_runtime.to_runtime(exl2.pack_codes(codes, PARAMS), torch.ones(len(PARAMS.group_bits), n).half(),
                                    PARAMS)
    packs = [packs[i] for i in segments]
    nseg = len(packs)
    consts: dict[str, object] = {}
    for i in range(MAX_SEGMENTS):
        pk = packs[min(i, nseg - 1)]
        sub = pk.bits == 8 and bf16
        nf = (32 // pk.bits) * pk.rows_per_block // 8
        consts.update({f"GS{i}": pk.group, f"BITS{i}": pk.bits, f"R{i}": pk.rows_per_block, f"ZC{i}": pk.zero_const,
                       f"UNIT{i}": units(pk, 64), f"EVEN_K{i}": True, f"SUBZ{i}": sub,
                       f"ASM{i}": mma_asm(pk.bits, nf, bf16, 1, sub, not sub)})
    consts.update(NSEG=nseg, HAS_BIAS=True, WN=4, WK=1, NB=1, EVEN_N=True, PREFETCH=True, STAGE_X=False,
                  VEC_PARAMS=False, SPLIT=True, SUM_ROWS=4, USE_ASM=True, CONSTRAINTS=MMA_CONSTRAINTS)
    names = exl2_tc_kernel.arg_names
    act = "*bf16" if bf16 else "*fp16"
    ptrs = {"X": act, "Y": act, "BIAS": act, "PART": "*fp32", "LOCK": "*i32",
            **{f"W{i}": "*i32" for i in range(3)}, **{f"S{i}": "*fp16" for i in range(3)}}
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in (*ptrs, "NP", "stride_xm", "stride_ym")}
    c = triton.compile(ASTSource(exl2_tc_kernel, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=1))
    sass = get_sass(c.asm["cubin"])
    return {"HMMA": sass.count("HMMA."), "LDL": sass.count("LDL"), "STL": sass.count("STL"),
            "bits": [pk.bits for pk in packs], "units": [units(pk, 64) for pk in packs]}


if __name__ == "__main__":
    print(json.dumps({f"{'bf16' if bf16 else 'f16'}_{''.join(map(str, segs))}": facts(bf16, segs)
                      for bf16 in (True, False) for segs in ((0, 1, 2), (0,), (1,), (2,))}))
