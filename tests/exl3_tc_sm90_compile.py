"""Compile ``exl3_tc_kernel`` (Gluon) for sm_90 on this CPU and print facts about its SASS as JSON: run in a fresh
process by ``test_exl3_tc_sm90_compile.py`` (a process that ran Triton's interpreter cannot compile; see
gluon_sass_compile.py).

    python3 tests/exl3_tc_sm90_compile.py
"""

from __future__ import annotations

import json
import re

PTRS = {"x_ptr": "*fp16", "u_ptr": "*i32", "y_ptr": "*fp32"}
#: case -> (bits, codebook index, n tiles, k tiles a step, rows, warps, atomic): the shipped launches (8 x 4 x 4 up
#: to 8 rows, 8 x 2 x 2 above), a three-word width, one row block of 32
CASES = {
    "2bit-3inst-few": (2, 0, 8, 4, 8, 4, True),
    "4bit-mul1-few": (4, 2, 8, 4, 8, 4, False),
    "5bit-mcg-few": (5, 1, 8, 4, 8, 4, True),
    "2bit-mcg-32rows": (2, 1, 8, 2, 32, 2, True),
    "8bit-3inst-16rows": (8, 0, 8, 2, 16, 2, True),
}
OPS = ("HMMA", "LDS", "STS", "SHFL", "LDL", "STL", "LDG", "BAR.SYNC")
BRANCH = re.compile(r"\bBRA\s+(\w+);")
LABEL = re.compile(r"^\s*([A-Za-z_.]\w*):\s*$")  # a label alone on its line (not a scoreboard prefix "01:-:...")


def facts(bits: int, cb: int, nt: int, kt: int, bm: int, warps: int, atomic: bool, pairs: bool = True) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.tools.disasm import get_sass

    from qlinear.kernels.triton.exl3_gemv import two_words
    from qlinear.kernels.triton.exl3_tc import exl3_tc_kernel

    consts = dict(BITS=bits, CB=cb, NT=nt, KT=kt, BM=bm, TWO_WORDS=two_words(bits), ATOMIC=atomic, WARPS=warps,
                  PAIRS=pairs)
    names = exl3_tc_kernel.arg_names
    sig = {a: "constexpr" if a in consts else PTRS.get(a, "i32") for a in names}
    # pointers and the row stride 16-aligned, as a launch with K % 16 == 0 specializes them
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in PTRS or a == "stride_xm"}
    c = triton.compile(GluonASTSource(exl3_tc_kernel, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    sass = get_sass(c.asm["cubin"])
    out = {op: len(re.findall(rf"\b{re.escape(op)}\b", sass)) for op in OPS}
    # the K loop: the one branch back to a label above it (not the closing BRA to itself); its HMMA count is what
    # one step issues
    lines = sass.splitlines()
    labels = {m.group(1): i for i, m in enumerate(map(LABEL.match, lines)) if m}
    back = [(labels[m.group(1)], i) for i, m in enumerate(map(BRANCH.search, lines))
            if m and labels.get(m.group(1), len(lines)) < i - 1]
    out["loops"] = len(back)
    if back:
        body = [ln for ln in lines[back[0][0] + 1:back[0][1] + 1] if not LABEL.match(ln)]
        out["loop_HMMA"] = sum("HMMA" in ln for ln in body)
        out["loop_instructions"] = len(body)
    out["weights_per_thread_step"] = nt // warps * kt * 256 // 32
    return out


if __name__ == "__main__":
    print(json.dumps({name: facts(*case) for name, case in CASES.items()}))
