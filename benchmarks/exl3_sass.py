"""Offline sm_90 SASS of the EXL3 fused decode GEMV at its M = 1 launch config (no GPU needed).

    PYTHONPATH=src python benchmarks/exl3_sass.py [--bits 2 3 4] [--gemv [--tiles-n 32]] [--plain]

Counts, per (bits, codebook), the instructions and global loads inside the main K loop (the longest backward
branch), divided by the weights one thread decodes per loop trip (BK * BN / threads; for ``--gemv``, the M = 1
kernel of ``exl3_gemv.py``: 256 tiles-n / threads), plus registers and spills.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys

from qlinear.kernels.triton import exl3_gemv, exl3_mv
from sass_offline import registers  # the bundled cuobjdump's register count

_MV = {"x_ptr": "*fp16", "tr_ptr": "*i32", "y_ptr": "*fp32"}
_GEMV = {"x_ptr": "*i32", "u_ptr": "*i32", "y_ptr": "*fp32"}
_LINE = re.compile(r"\t(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_LABEL = re.compile(r"^\s*(LBB\d+):")
_BRA = re.compile(r"\bBRA\s+(LBB\d+)")


def k_loop(sass: str) -> list[str]:
    """Opcodes of the longest loop body (label .. backward BRA) in Triton's SASS (ctrl<TAB>OP lines, LBBn: labels)."""
    ops: list[str] = []
    labels: dict[str, int] = {}
    branches: list[tuple[int, str]] = []
    for line in sass.splitlines():
        lab = _LABEL.match(line)
        if lab:
            labels[lab.group(1)] = len(ops)
            continue
        m = _LINE.search(line)
        if not m:
            continue
        b = _BRA.search(line)
        if b:
            branches.append((len(ops), b.group(1)))
        ops.append(m.group(2))
    spans = [(labels[t], i) for i, t in branches if t in labels and labels[t] <= i]
    if not spans:
        return []
    start, end = max(spans, key=lambda s: s[1] - s[0])
    return ops[start:end + 1]


def main() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.tools.disasm import get_sass

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--gemv", action="store_true", help="the M = 1 kernel (exl3_gemv.py)")
    parser.add_argument("--tiles-n", type=int, help="n tiles per program (default: exl3_gemv.launch_shape)")
    parser.add_argument("--warps", type=int, help="warps per program (default: the launch shape's, 4 for exl3_mv)")
    parser.add_argument("--rows", type=int, default=1, help="rows per program of the GEMV (MB)")
    parser.add_argument("--plain", action="store_true", help="also compile the codebooks' plain-Triton lines (ASM "
                        "off, as the interpreter runs them) beside the PTX ones CUDA runs")
    args = parser.parse_args()
    if args.gemv:
        kernel, ptrs = exl3_gemv.exl3_gemv_kernel, _GEMV
        print(f"exl3_gemv_kernel sm_90, prefetch {exl3_gemv.PREFETCH}; n tiles / warps per width as launched "
              "unless given")
    else:
        bk, bn = exl3_mv.BLOCK_K, exl3_mv.BLOCK_N
        kernel, ptrs = exl3_mv.exl3_mv_kernel, _MV
        print(f"exl3_mv_kernel sm_90, BM=16 BK={bk} BN={bn}, stream-order decode")
    print("bits codebook  asm tiles warps  regs spills loop_instr instr/weight LDG/weight")
    for bits, (cb, name), asm in itertools.product(args.bits, enumerate(exl3_mv.CODEBOOKS),
                                                   (True, False) if args.plain else (True,)):
        if args.gemv:
            tiles, warps = exl3_gemv.launch_shape(bits)
            tiles, warps = args.tiles_n or tiles, args.warps or warps
            while args.tiles_n is None and tiles * args.rows > exl3_gemv.MAX_ROW_TILES:
                tiles //= 2
            per_thread = 256 * tiles / (32 * warps)
            consts = dict(BITS=bits, CB=cb, NTN=tiles, TWO_WORDS=exl3_gemv.two_words(bits), ATOMIC=True,
                          PREFETCH=exl3_gemv.PREFETCH, MB=args.rows, ASM=asm)
        else:
            tiles, warps = bn // 16, args.warps or 4
            per_thread = bk * bn / (32 * warps)
            consts = dict(BITS=bits, CB=cb, BM=16, BK=bk, BN=bn, ATOMIC=True, ASM=asm,
                          TWO_WORDS=exl3_gemv.two_words(bits))
        sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in kernel.arg_names}
        c = triton.compile(ASTSource(kernel, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": warps})
        sass = get_sass(c.asm["cubin"])
        loop = k_loop(sass)
        spills = len(re.findall(r"\bSTL\b", sass))
        ldg = sum(op.startswith("LDG") for op in loop)
        print(f"{bits:4d} {name:9s} {'on' if asm else 'off':>4s} {tiles:5d} {warps:5d} "
              f"{registers(c.asm['cubin']):>5s} {spills:6d} {len(loop):10d} {len(loop) / per_thread:12.2f} "
              f"{ldg / per_thread:10.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
