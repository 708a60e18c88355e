"""Probe (offline, no GPU): a 4-bit dequant to packed bf16x2 through inline PTX, feeding a swap-AB ``tl.dot``.

    PYTHONPATH=<triton 3.6 wheel dir> python3 benchmarks/sass_bf16x2_probe.py

Words hold 8 codes along K, code ``2i`` in nibble ``i`` of the low half-word and ``2i+1`` in nibble ``i`` of the
high one, so ``((w >> 4i) & 0x000F000F) | 0x43004300`` is the bf16 pair ``(128 + q_2i, 128 + q_2i+1)`` (one
LOP3, one SHF for i > 0); ``sub.bf16x2`` of ``128 + z`` is exact and ``mul.rn.bf16x2`` by the scale rounds once.
The weight tile is the dot's A operand (``[BN, BK] @ x^T [BK, BM]``), so M up to BM rides the tensor cores.
Prints, per config, registers, shared memory and the SASS of the main loop per weight (see triton_notes.md).
The kernel is a probe: one group, no zeros per column, no masks; its numbers are not a result.
"""

from __future__ import annotations

import itertools
import sys
from collections import Counter
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_offline import registers

ASM = tl.constexpr("""
{
.reg .b32 t0, t1, t2, t3, u;
lop3.b32 t0, $8, 0x000F000F, 0x43004300, 0xEA;
shr.u32 u, $8, 4;
lop3.b32 t1, u, 0x000F000F, 0x43004300, 0xEA;
shr.u32 u, $8, 8;
lop3.b32 t2, u, 0x000F000F, 0x43004300, 0xEA;
shr.u32 u, $8, 12;
lop3.b32 t3, u, 0x000F000F, 0x43004300, 0xEA;
sub.bf16x2 t0, t0, $10;
sub.bf16x2 t1, t1, $10;
sub.bf16x2 t2, t2, $10;
sub.bf16x2 t3, t3, $10;
mul.rn.bf16x2 t0, t0, $9;
mul.rn.bf16x2 t1, t1, $9;
mul.rn.bf16x2 t2, t2, $9;
mul.rn.bf16x2 t3, t3, $9;
mov.b32 {$0, $1}, t0;
mov.b32 {$2, $3}, t1;
mov.b32 {$4, $5}, t2;
mov.b32 {$6, $7}, t3;
}
""")

@triton.jit
def dq8(w, s2, z2):
    return tl.inline_asm_elementwise(ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r", [w, s2, z2],
                                     dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)

@triton.jit
def toy2(X, W, S2, Z2, Y, N, K, BK: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, ORDER: tl.constexpr):
    BKW: tl.constexpr = BK // 8
    pid = tl.program_id(0)
    offs_n = pid * BN + tl.arange(0, BN)
    offs_m = tl.arange(0, BM)
    acc = tl.zeros((BN, BM), tl.float32)
    s2 = tl.load(S2 + offs_n)[:, None]
    z2 = tl.load(Z2 + offs_n)[:, None]
    KW = K // 8
    for kb in range(0, K // BK):
        w = tl.load(W + offs_n[:, None] * KW + (kb * BKW + tl.arange(0, BKW))[None, :])  # [BN, BKW]
        o0, o1, o2, o3, o4, o5, o6, o7 = dq8(w, tl.broadcast_to(s2, (BN, BKW)), tl.broadcast_to(z2, (BN, BKW)))
        # element k = 8r + j; o_j pairs: (o0,o1)=(k0,k1) ...
        q = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))
        a = tl.reshape(q, (BN, BK))
        xt = tl.load(X + offs_m[None, :] * K + (kb * BK + tl.arange(0, BK))[:, None])  # [BK, BM]
        acc = tl.dot(a, xt, acc)
    tl.store(Y + offs_n[:, None] * BM + offs_m[None, :], acc)

def analyze(kernel: object) -> tuple[int, Counter]:
    """Length and opcode histogram of the longest backward-branch loop (the K loop)."""
    sass = get_sass(kernel.asm["cubin"]).splitlines()
    labels = {ln.strip()[:-1]: i for i, ln in enumerate(sass) if ln.strip().startswith("LBB") and ln.endswith(":")}
    best = (0, 0, 0)
    for i, ln in enumerate(sass):
        target = ln.split("BRA")[-1].strip().rstrip(";") if "BRA" in ln else None
        if target in labels and labels[target] < i and i - labels[target] > best[0]:
            best = (i - labels[target], labels[target], i)
    _, a0, a1 = best

    def opcode(ln: str) -> str:
        parts = ln.split()
        return (parts[2] if parts[1].startswith("@") else parts[1]).split(".")[0].rstrip(";")

    return a1 - a0, Counter(opcode(ln) for ln in sass[a0 + 1:a1 + 1] if len(ln.split()) > 2)


def compile_probe(bn: int, bk: int, warps: int, stages: int, bm: int) -> object:
    names = toy2.arg_names
    sig = {"X": "*bf16", "W": "*i32", "S2": "*i32", "Z2": "*i32", "Y": "*fp32", "N": "i32", "K": "i32",
           "BK": "constexpr", "BN": "constexpr", "BM": "constexpr", "ORDER": "constexpr"}
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in ("X", "W", "S2", "Z2", "Y", "N", "K")}
    src = ASTSource(toy2, sig, constexprs={"BK": bk, "BN": bn, "BM": bm, "ORDER": 0}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def main() -> int:
    for bn, bk, w, st, bm in itertools.chain(((128, 128, 4, 3, 16), (256, 128, 8, 3, 16), (128, 128, 4, 3, 64)),
                                             ((64, 128, 2, 3, 16), (32, 128, 1, 3, 16))):
        k = compile_probe(bn, bk, w, st, bm)
        n, ops = analyze(k)
        per = n / (bk * bn / (w * 32))
        print(f"BN={bn} BK={bk} warps={w} stages={st} BM={bm}: regs {registers(k.asm['cubin'])}, smem "
              f"{k.metadata.shared}, loop {n} instructions = {per:.2f} per weight; {ops.most_common(12)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
