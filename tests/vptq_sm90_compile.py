"""Compile the VPTQ Triton kernels for sm_90 on this CPU and print facts about their PTX as JSON: run in a fresh
process by ``test_vptq_compile.py`` (a process that ran Triton's interpreter cannot compile; see
gluon_sass_compile.py).

    python3 tests/vptq_sm90_compile.py
"""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from qlinear.kernels.triton import vptq_mv

PTRS = dict(x_ptr="*bf16", idx_ptr="*i32", cb_ptr="*fp16", res_ptr="*fp16", s_ptr="*fp16", b_ptr="*fp16",
            out_ptr="*fp32", w_ptr="*bf16")
COMMON = dict(V=8, VP=8, TB=24, IB=16, BJ=8, HAS_RES=True, HAS_NORM=True, INTERP=False)
CASES = {
    "gemv-m1": (vptq_mv.vptq_gemv_kernel, dict(MR=1, BK=64)),
    "gemv-m4": (vptq_mv.vptq_gemv_kernel, dict(MR=4, BK=32)),
    "mma": (vptq_mv.vptq_mma_kernel, dict(BM=16, BK=64, PREC="tf32")),
    "decode": (vptq_mv.vptq_decode_kernel, dict(BK=64)),
}


def facts(kernel: object, consts: dict) -> dict:
    names = kernel.arg_names  # type: ignore[attr-defined]
    sig = {a: "constexpr" if a in consts else PTRS.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in PTRS}
    c = triton.compile(ASTSource(kernel, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, enable_fp_fusion=False))
    ptx = c.asm["ptx"]
    return {op: ptx.count(op) for op in ("mul.rn.f16", "add.rn.f16", "fma.rn", "mma", "ld.global.v4",
                                         "st.local", "cvt.rn.bf16.f32", "atom.global")}


if __name__ == "__main__":
    print(json.dumps({name: facts(k, COMMON | extra) for name, (k, extra) in CASES.items()}))
