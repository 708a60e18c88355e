"""Compile ``qmv_tc_kernel`` for sm_90 without a GPU and print, per case, the layouts of its inline asm's
operands (run by ``test_qmv_tc_layout.py`` in a process without TRITON_INTERPRET; not a test module).

``inline_asm_elementwise(pack=4)`` hands the asm 4 consecutive registers of a thread: only a layout in which
each thread owns one whole row of 4 (``sizePerThread [1, 4]``, ``threadsPerWarp [32, 1]``) makes those the
lane's 4 word columns. Triton picks the layout for the op; this shows which one it picked.
"""

from __future__ import annotations

import json
import re
import sys

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile

from qlinear.kernels.triton.qmv_tc import qmv_tc_kernel
from qlinear.kernels.triton.qmv_tc_asm import MMA_CONSTRAINTS, mma_asm

POINTERS = {"X": "*bf16", "W": "*i32", "S": "*fp16", "Z": "*u8", "OFF": "*fp32", "SUP": "*fp32", "BIAS": "*bf16",
            "Y": "*bf16", "PART": "*fp32", "LOCK": "*i32"}


def asm_layouts(bits: int, r: int, wn: int, wk: int, unit: int, nb: int, prefetch: bool, subz: bool,
                stage: bool, x_aligned: bool) -> list[str]:
    """``x_aligned``: x's row stride and length specialised as multiples of 16 (Triton does so when they
    are); the padded N (``NP``) always is."""
    nf = (32 // bits) * r // 8
    consts = dict(GS=r * (32 // bits), BITS=bits, R=r, ZC=1 << (bits - 1), HAS_Z=False, HAS_OFF=False, HAS_SUP=False,
                  HAS_BIAS=False, WN=wn, WK=wk, UNIT=unit, NB=nb, SPLIT=True, EVEN_K=True, EVEN_N=True,
                  PREFETCH=prefetch, SUBZ=subz, STAGE_X=stage, SUM_ROWS=4, VEC_PARAMS=False, USE_ASM=True,
                  ASM=mma_asm(bits, nf, True, nb, subz, not subz), CONSTRAINTS=MMA_CONSTRAINTS)
    names = qmv_tc_kernel.arg_names
    sig = {a: "constexpr" if a in consts else POINTERS.get(a, "i32") for a in names}
    aligned = {*POINTERS, "NP", *(("KX", "stride_xm") if x_aligned else ())}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in aligned}
    kern = compile(ASTSource(qmv_tc_kernel, sig, constexprs=consts, attrs=attrs),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": wn * wk, "num_stages": 1})
    ttgir = kern.asm["ttgir"]
    defs = dict(re.findall(r"^(#\w+) = (.*)$", ttgir, re.M))
    ops = [line for line in ttgir.splitlines() if "tt.elementwise_inline_asm" in line]
    used = sorted({enc for line in ops for enc in re.findall(r"tensor<\d+x4x\w+, (#\w+)>", line)})
    return [defs.get(enc, enc) for enc in used]


if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    print(json.dumps({json.dumps(c): asm_layouts(*c) for c in cases}))
