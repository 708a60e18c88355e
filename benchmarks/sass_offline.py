"""Compile the Triton kernels for sm_90 on any machine (no GPU) and report what the compiler produced.

    python3 benchmarks/sass_offline.py [--bits 4] [--group 128] [--k 4096] [--n 4096] [--dump DIR]

Triton compiles ahead of time for a named target with its bundled ptxas/cuobjdump, so registers,
spills, shared memory and SASS instruction counts (HGMMA/HMMA present? 16-byte loads? local memory?)
can be checked for free before spending device time. Same table as ``gpu_check.py --sass``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("unset TRITON_INTERPRET: this compiles real kernels")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass

from gpu_check import SASS_OPS, sass_counts
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.dequant import dequant_kernel
from qlinear.kernels.triton.layout import block_rows
from qlinear.kernels.triton.qmm import V2, block_k2, qmm2_kernel, qmm_kernel
from qlinear.kernels.triton.qmm3 import qmm3_kernel

POINTERS = {"X": "*bf16", "W": "*i32", "S": "*fp16", "Z": "*u8", "OFF": "*fp32", "SUP": "*fp32", "PERM": "*i32",
            "BIAS": "*fp16", "Y": "*bf16", "PART": "*fp32", "LOCK": "*i32", "OUT": "*bf16"}
ALIGNED = ("N", "K", "KW", "KP", "NP", "GS", "stride_xm", "stride_ym", "stride_o", "N0", "N1")


def registers(cubin: bytes) -> str:
    """Registers per thread, from the bundled cuobjdump's resource usage ('?' if unavailable)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        try:
            out = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", fh.name],
                                 capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return "?"
    found = re.search(r"REG:(\d+)", out)
    return found.group(1) if found else "?"


def compile_one(fn: object, constants: dict[str, object], warps: int, stages: int) -> object:
    names = fn.arg_names  # type: ignore[attr-defined]
    constants = {**{flag: False for flag in ("PREFETCH", "HAS_OFF", "HAS_SUP") if flag in names}, **constants}
    sig = {a: "constexpr" if a in constants else POINTERS.get(a, "i32") for a in names}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in names
             if (a in POINTERS or a in ALIGNED) and a not in constants}
    src = ASTSource(fn, sig, constexprs=constants, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--dump", help="write each kernel's SASS and TTGIR here")
    ap.add_argument("--variants", default="gemv,skinny,skinny2,skinny3,gemm,gemm2,gemm3,dense")
    ap.add_argument("--m", type=int, default=0, help="rows (default: a typical M per variant)")
    ap.add_argument("--cfg", help="override bm,bn,bk,split,warps,stages")
    args = ap.parse_args()
    pf = 32 // args.bits
    group = configs.CHANNELWISE if args.group == -1 else args.group
    r = block_rows(group, pf)
    print(f"sm_90, triton {triton.__version__}, {args.bits}-bit g{args.group} K={args.k} N={args.n} bf16, sym, R={r}")
    print("| kernel | config | regs | spills | smem B | " + " | ".join(SASS_OPS) + " |")
    print("| --- " * (5 + len(SASS_OPS)) + "|")
    ap_m = {"gemv": 1, "skinny": 16, "skinny2": 16, "skinny3": 16, "gemm": 128, "gemm2": 128, "gemm3": 128,
            "dense": 1024}
    for variant in args.variants.split(","):
        m = args.m or ap_m[variant]
        cfg = configs.legal(configs.choose("offline", 132, m, args.n, args.k, args.bits, group, variant),
                            m, args.k, args.bits)
        if args.cfg:
            bm, bn, bk, sk, w, st = (int(v) for v in args.cfg.split(","))
            cfg = configs.Config(variant, bm, bn, bk, sk, w, st)
        one = cfg.block_k <= r * pf or group % cfg.block_k == 0
        common = dict(BITS=args.bits, R=r, ZC=1 << (args.bits - 1), ONE_GROUP=one, HAS_Z=False, HAS_PERM=False,
                      BLOCK_K=cfg.block_k, BLOCK_N=cfg.block_n)
        if variant == "dense":
            kern = compile_one(dequant_kernel, common, cfg.num_warps, 1)
        elif variant in ("skinny3", "gemm3"):
            fb = r * 8
            bk = max(cfg.block_k, fb) // fb * fb
            three = dict(GS=group, R=r, ZC=common["ZC"], HAS_Z=False, HAS_BIAS=False,
                         BLOCK_M=16 if variant == "skinny3" else cfg.block_m,
                         BLOCK_N=cfg.block_n, BLOCK_K=bk, SPLIT=cfg.split_k > 1, EVEN_K=True, EVEN_N=True,
                         USE_ASM=True)
            kern = compile_one(qmm3_kernel, three, cfg.num_warps, cfg.num_stages)
        elif variant in V2:
            fb = r * pf
            bk = max(cfg.block_k, fb) // fb * fb
            assert bk == block_k2(type("P", (), {"rows_per_block": r, "bits": args.bits})(), cfg.block_k)
            common.update(BLOCK_K=bk, ONE_GROUP=bk <= fb or group % bk == 0, HAS_BIAS=False,
                          BLOCK_M=cfg.block_m, SPLIT=cfg.split_k > 1, EVEN_K=True, EVEN_N=True, GS=group)
            del common["HAS_PERM"]
            kern = compile_one(qmm2_kernel, common, cfg.num_warps, cfg.num_stages)
        else:
            common.update(HAS_BIAS=False, BLOCK_M=cfg.block_m, SPLIT=cfg.split_k > 1,
                          USE_DOT=variant != "gemv", EVEN_K=True, EVEN_N=True)
            kern = compile_one(qmm_kernel, common, cfg.num_warps, cfg.num_stages)
        sass = get_sass(kern.asm["cubin"])
        if args.dump:
            Path(args.dump).mkdir(parents=True, exist_ok=True)
            Path(args.dump, f"{variant}.sass").write_text(sass)
            Path(args.dump, f"{variant}.ttgir").write_text(kern.asm["ttgir"])
        regs = registers(kern.asm["cubin"])
        spills = sass_counts(sass)[SASS_OPS.index("STL")]
        print(f"| {variant} | {cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} "
              f"st{cfg.num_stages} | {regs} | {spills} STL | {kern.metadata.shared} | "
              + " | ".join(map(str, sass_counts(sass))) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
