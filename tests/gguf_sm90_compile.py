"""Compile the GGUF dequant kernel for sm_90 on this CPU and print facts about its PTX stores as JSON: run in a fresh
process by ``test_gguf_dequant_compile.py`` (a process that ran Triton's interpreter cannot compile; see
gluon_sass_compile.py).

    python3 tests/gguf_sm90_compile.py
"""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from qlinear.kernels.triton import gguf_mm
from qlinear.kernels.triton.gguf import GEOMS

#: type name -> GGML type id
TYPES = {"Q4_0": 2, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}


def facts(qt: int) -> dict[str, int]:
    kernel = gguf_mm.dequant_kernel
    names = kernel.arg_names
    consts = dict(gguf_mm._meta(GEOMS[qt], 0), BN=32, BF16_BITS=False)
    sig = {a: "constexpr" if a in consts else {"W": "*i16", "OUT": "*bf16"}.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ("W", "OUT", "K", "RHW", "stride_o")}
    c = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, enable_fp_fusion=False))
    ptx = c.asm["ptx"]
    return {op: ptx.count(op) for op in ("st.global.v4.b32", "st.global.b16", "st.local")}


if __name__ == "__main__":
    print(json.dumps({name: facts(qt) for name, qt in TYPES.items()}))
