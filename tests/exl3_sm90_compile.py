"""Compile the EXL3 Triton kernels for sm_90 (ptx + cubin): run in a fresh process by test_exl3_sm90_compile.py.

    python3 tests/exl3_sm90_compile.py      # prints one line per case: "<case> ok <cubin bytes>" or "<case> err ..."

A process that has run Triton's interpreter keeps Triton's language patched for it (see gluon_sass_compile.py).
"""

from __future__ import annotations

#: case -> (kernel name, constexprs, pointer types)
_MV = {"x_ptr": "*fp16", "tr_ptr": "*i32", "y_ptr": "*fp32"}
_GEMV = {"x_ptr": "*i32", "u_ptr": "*i32", "y_ptr": "*fp32"}
CASES = {
    "mv-2bit-3inst-atomic": ("exl3_mv_kernel", dict(BITS=2, CB=0, BM=16, BK=64, BN=64, ATOMIC=True, ASM=True,
                                                    TWO_WORDS=True), _MV),
    "mv-3bit-mcg": ("exl3_mv_kernel", dict(BITS=3, CB=1, BM=16, BK=32, BN=128, ATOMIC=False, ASM=True,
                                           TWO_WORDS=True), _MV),
    "mv-5bit-mul1-atomic": ("exl3_mv_kernel", dict(BITS=5, CB=2, BM=64, BK=32, BN=128, ATOMIC=True, ASM=True,
                                                   TWO_WORDS=False), _MV),
    "decode-4bit-mul1": ("exl3_decode_kernel", dict(BITS=4, CB=2, BK=64, BN=64, ASM=True, TWO_WORDS=True),
                         {"tr_ptr": "*i32", "w_ptr": "*fp16"}),
    "decode-6bit-3inst": ("exl3_decode_kernel", dict(BITS=6, CB=0, BK=64, BN=64, ASM=True, TWO_WORDS=False),
                          {"tr_ptr": "*i32", "w_ptr": "*fp16"}),
    "gemv-4bit-3inst-atomic": ("exl3_gemv_kernel", dict(BITS=4, CB=0, NTN=32, TWO_WORDS=True, ATOMIC=True,
                                                        PREFETCH=True, MB=1, ASM=True), _GEMV),
    "gemv-6bit-mul1": ("exl3_gemv_kernel", dict(BITS=6, CB=2, NTN=8, TWO_WORDS=False, ATOMIC=False,
                                                PREFETCH=False, MB=1, ASM=True), _GEMV),
    "gemv-2bit-8rows": ("exl3_gemv_kernel", dict(BITS=2, CB=0, NTN=8, TWO_WORDS=True, ATOMIC=True,
                                                 PREFETCH=True, MB=8, ASM=True), _GEMV),
    "had-in-bf16-1row": ("had_in_kernel", dict(BM=1), {"x_ptr": "*bf16", "s_ptr": "*fp32", "o_ptr": "*fp16",
                                                        "scale": "fp32"}),
    "had-in-fp16": ("had_in_kernel", dict(BM=16), {"x_ptr": "*fp16", "s_ptr": "*fp32", "o_ptr": "*fp16",
                                                   "scale": "fp32"}),
    "had-out-bias": ("had_out_kernel", dict(HAS_BIAS=True, BM=16), {"y_ptr": "*fp32", "s_ptr": "*fp32",
                                                                    "b_ptr": "*fp16", "o_ptr": "*bf16",
                                                                    "scale": "fp32"}),
}


def main() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from qlinear.kernels.triton import exl3_gemv, exl3_mv, hadamard

    for name, (kernel_name, consts, ptrs) in CASES.items():
        module = exl3_gemv if kernel_name.startswith("exl3_gemv") else hadamard if "had" in kernel_name else exl3_mv
        kernel = getattr(module, kernel_name)
        sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in kernel.arg_names}
        try:
            compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": 4})
            print(name, "ok", len(compiled.asm["cubin"]), flush=True)
        except Exception as err:  # reported to the test, which fails or skips with it
            print(name, "err", type(err).__name__, str(err).replace("\n", " ")[-800:], flush=True)


if __name__ == "__main__":
    main()
