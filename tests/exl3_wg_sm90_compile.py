"""Compile ``exl3_wg_kernel`` (Gluon, wgmma + TMA) for sm_90 on this CPU and print facts about its SASS as JSON: run
in a fresh process by ``test_exl3_wg_sm90_compile.py`` (a process that ran Triton's interpreter cannot compile;
see gluon_sass_compile.py).

    python3 tests/exl3_wg_sm90_compile.py
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: case -> (bits, codebook index, n tiles, k tiles a step, rows, warps, x stages): the launch the sweep starts from,
#: a three-word width with 64 rows, two warpgroups
CASES = {
    "2bit-3inst-128rows": (2, 0, 8, 2, 128, 4, 4),
    "5bit-mul1-64rows": (5, 2, 4, 2, 64, 4, 4),
    "4bit-mcg-2warpgroups": (4, 1, 16, 2, 128, 8, 4),
}
BRANCH = re.compile(r"\bBRA\s+(\w+);")
LABEL = re.compile(r"^\s*([A-Za-z_.]\w*):\s*$")  # a label alone on its line (not a scoreboard prefix "01:-:...")


def facts(bits: int, cb: int, nt: int, kt: int, bm: int, warps: int, stages: int) -> dict:
    import torch
    from triton.tools.disasm import get_sass

    from qlinear.kernels.triton.exl3_gemv import two_words
    from qlinear.kernels.triton.exl3_wg import exl3_wg_kernel
    from qlinear.kernels.triton.qmm5 import _descriptor

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gluon_sass_compile import _sm90
    from test_gluon_sass import wgmma_hazards

    descs = {"x_desc": _descriptor(torch.empty(256, 4096, dtype=torch.float16), [bm, 16 * kt])}
    consts = dict(BITS=bits, CB=cb, NT=nt, KT=kt, BM=bm, STAGES=stages, TWO_WORDS=two_words(bits), ATOMIC=True,
                  PAIRS=True)
    sass = get_sass(_sm90(exl3_wg_kernel, descs, consts, {"u_ptr": "*i32", "y_ptr": "*fp32"},
                          {"num_warps": warps}).asm["cubin"])
    lines = sass.splitlines()
    labels = {m.group(1): i for i, m in enumerate(map(LABEL.match, lines)) if m}
    back = [(labels[m.group(1)], i) for i, m in enumerate(map(BRANCH.search, lines))
            if m and labels.get(m.group(1), len(lines)) < i - 1]
    top, end = max(back, key=lambda b: sum("HGMMA" in ln for ln in lines[b[0]:b[1]]))  # the K loop
    body = lines[top:end + 1]
    count = {op: sum(bool(re.search(rf"\b{op}\b", ln)) for ln in body) for op in ("HGMMA", "LDS", "STS", "SHFL")}
    return {"loop": count, "STL": len(re.findall(r"\bSTL\b", sass)), "LDL": len(re.findall(r"\bLDL\b", sass)),
            "hgmma_per_body": 2 * (nt // warps) * kt, "hazards": wgmma_hazards(sass),
            "depbar": [ln.split("DEPBAR.LE")[1].strip(" ;") for ln in body if "WARPGROUP.DEPBAR.LE" in ln]}


if __name__ == "__main__":
    print(json.dumps({name: facts(*case) for name, case in CASES.items()}))
