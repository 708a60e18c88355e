"""Compile gemm4 and gemm5 for sm_90 and write their SASS: run in a fresh process by ``test_gluon_sass.py``.

    python3 tests/gluon_sass_compile.py OUT_DIR      # OUT_DIR/<case>.sass, or <case>.err with the error

A process that has run Triton's interpreter (the ``*_interpret`` test modules) keeps Triton's language patched
for it, and compiling there then fails inside Triton's own helpers (``gl.cdiv``); a fresh process without
``TRITON_INTERPRET`` compiles as a user's would.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

#: case name -> (kernel, tile): gemm4 (block_m, block_n, block_k, warps, split, zeros); gemm5 adds a register cap
CASES = {
    "gemm4-16x128x128-w4": ("gemm4", (16, 128, 128, 4, False, False)),
    "gemm4-128x128x64-w8-split-zeros": ("gemm4", (128, 128, 64, 8, True, True)),
    "gemm4-64x64x128-w4-split": ("gemm4", (64, 64, 128, 4, True, False)),
    "gemm5-16x128x128-w4-r128": ("gemm5", (16, 128, 128, 4, False, False, 128)),
    "gemm5-128x128x64-w8-split-zeros": ("gemm5", (128, 128, 64, 8, True, True, 0)),
    "gemm5-64x64x128-w4-split-zeros-r128": ("gemm5", (64, 64, 128, 4, True, True, 128)),
    # groups of 32 (x in fragment order, fragment.py): GPTQ g32 with zeros; GGUF Q4_K's uint8 sub-scales and mins
    # with float32 super pairs; Q4_1's float32 scales and offsets; float16 activations
    "gemm5-g32-16x128x128-w4-zeros-r128": ("gemm5", (16, 128, 128, 4, False, True, 128, "g32")),
    "gemm5-g32-64x64x128-w4-split-kquant-r128": ("gemm5", (64, 64, 128, 4, True, False, 128, "kquant")),
    "gemm5-g32-128x128x64-w8-affine32": ("gemm5", (128, 128, 64, 8, False, False, 0, "affine32")),
    "gemm5-g32-64x64x128-w4-kquant-f16-r128": ("gemm5", (64, 64, 128, 4, False, False, 128, "kquant-f16")),
    # 8-bit words (fragment8.py): GPTQ 8-bit g128 with zeros; GGUF Q8_0's form (g32, zero 128); float16 activations
    "gemm5-8bit-16x128x128-w4-zeros-r128": ("gemm5", (16, 128, 128, 4, False, True, 128, "gptq8")),
    "gemm5-8bit-g32-64x64x128-w4-split-r128": ("gemm5", (64, 64, 128, 4, True, False, 128, "q8_0")),
    "gemm5-8bit-128x128x64-w8-zeros-f16": ("gemm5", (128, 128, 64, 8, False, True, 0, "gptq8-f16")),
    # MLX's scales and biases (bfloat16, groups of 64): 4-bit words a group a step, 8-bit words (5/6/8-bit codes)
    "gemm5-mlx-16x128x64-w4-offsets-r128": ("gemm5", (16, 128, 64, 4, False, False, 128, "mlx")),
    "gemm5-8bit-mlx-64x64x128-w4-split-offsets-r128": ("gemm5", (64, 64, 128, 4, True, False, 128, "mlx8")),
}


def _sm90(kernel: object, descs: dict[str, object], consts: dict[str, object], ptrs: dict[str, str],
          options: dict[str, int]) -> object:
    """Compile a Gluon kernel for sm_90: descriptor arguments from ``descs``, pointers typed by ``ptrs`` (16-byte
    aligned, as the launchers' tensors are), the rest int32."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    names = kernel.arg_names  # type: ignore[attr-defined]
    sig = {a: "constexpr" if a in consts else mangle_type(descs[a]) if a in descs else ptrs.get(a, "i32")
           for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names if a in ptrs or a in ("NP", "stride_ym")}
    src = GluonASTSource(kernel, sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile4(block_m: int, block_n: int, block_k: int, warps: int, split: bool, has_z: bool) -> object:
    from qlinear.kernels.triton.qmm4 import qmm4_kernel
    from qlinear.kernels.triton.qmm5 import _descriptor

    descs = {"x_desc": _descriptor(torch.empty(256, 4096, dtype=torch.bfloat16), [block_m, block_k])}
    consts = dict(GS=128, ZC=8, HAS_Z=has_z, HAS_BIAS=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  STAGES=4, SPLIT=split)
    ptrs = {"W": "*i32", "S": "*fp16", "Z": "*u8", "BIAS": "*bf16", "Y": "*bf16", "PART": "*fp32", "LOCK": "*i32"}
    return _sm90(qmm4_kernel, descs, consts, ptrs, {"num_warps": warps})


def compile5(block_m: int, block_n: int, block_k: int, warps: int, split: bool, has_z: bool,
             max_registers: int, form: str = "gptq") -> object:
    """``form``: gptq (groups of 128), g32 (groups of 32), kquant (uint8 sub-scales and mins, float32 super pairs),
    affine32 (float32 scales and offsets), gptq8 (8-bit, groups of 128), q8_0 (8-bit, groups of 32, zero 128),
    mlx / mlx8 (4 / 8-bit, groups of 64, scales and offsets in the activation dtype); a ``-f16`` suffix takes
    float16 activations."""
    from qlinear.kernels.triton.qmm5 import _descriptor, qmm5_kernel

    act = torch.float16 if form.endswith("-f16") else torch.bfloat16
    form = form.removesuffix("-f16")
    gs = {"gptq": 128, "gptq8": 128, "mlx": 64, "mlx8": 64}.get(form, 32)
    bits = 8 if form in ("gptq8", "q8_0", "mlx8") else 4
    ng = max(1, block_k // gs)
    s_dtype = {"kquant": torch.uint8, "affine32": torch.float32, "mlx": act, "mlx8": act}.get(form, torch.float16)
    tensors = {"x_desc": (torch.empty(256, 4096, dtype=act), [block_m, block_k]),
               "w_desc": (torch.empty(1024, 4096, dtype=torch.int32), [block_k * bits // 32, block_n]),
               "s_desc": (torch.empty(128, 4096, dtype=s_dtype), [ng, block_n]),
               "z_desc": (torch.empty(128, 4096, dtype=torch.uint8 if has_z else s_dtype), [ng, block_n]),
               "o_desc": (torch.empty(128, 4096, dtype=s_dtype), [ng, block_n]),
               "u_desc": (torch.empty(32, 4096, dtype=torch.float32), [2, block_n])}
    descs = {name: _descriptor(t, block) for name, (t, block) in tensors.items()}
    zc = {"gptq": 8, "g32": 8, "gptq8": 128, "q8_0": 128}.get(form, 0)
    consts = dict(GS=gs, BITS=bits, ZC=zc, HAS_Z=has_z, HAS_OFF=form in ("kquant", "affine32", "mlx", "mlx8"),
                  HAS_SUP=form == "kquant", HAS_BIAS=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
                  STAGES=4, SPLIT=split, LOADER_REGS=40)
    dt = "*fp16" if act == torch.float16 else "*bf16"
    ptrs = {"BIAS": dt, "Y": dt, "PART": "*fp32", "LOCK": "*i32"}
    options = {"num_warps": warps} | ({"maxnreg": max_registers} if max_registers else {})
    return _sm90(qmm5_kernel, descs, consts, ptrs, options)


def main(out: Path) -> int:
    from triton.tools.disasm import get_sass

    for name, (kernel, tile) in CASES.items():
        try:
            compiled = (compile4 if kernel == "gemm4" else compile5)(*tile)
            (out / f"{name}.sass").write_text(get_sass(compiled.asm["cubin"]))  # type: ignore[attr-defined]
        except Exception as err:  # reported by the test that reads this case
            (out / f"{name}.err").write_text(f"{type(err).__name__}: {err}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main(Path(sys.argv[1])))
