"""gemv_tc's inline PTX, run by a small lane-level emulator written from the PTX ISA (no GPU here).

The interpreter cannot run inline PTX, so the CI twin checks gemv_tc's tiling but not its asm. This file
executes the asm text itself: ``prmt``/``lop3``/``shr``/``mov`` per lane and ``mma.sync.m16n8k16`` from the
fragment tables of the PTX ISA (A: lane (g, t) holds rows g, g+8 at K 2t, 2t+1, 2t+8, 2t+9; B: column g
at the same K; C: rows g, g+8, columns 2t, 2t+1), on the registers each lane loads per the kernel's
addressing (``qmv_tc.py``, ``qmv_tc_asm.py``), and compares C with sums over the codes computed directly from a
``layout.build`` weight. The fragment order on real hardware is checked on the H200 (gemv_tc_sweep.py).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from qlinear.kernels.triton.layout import build
from qlinear.kernels.triton.qmv_tc_asm import mma_asm


def halves(v: int, bf16: bool) -> tuple[float, float]:
    lo, hi = v & 0xFFFF, (v >> 16) & 0xFFFF
    if bf16:
        return tuple(float(np.array([h << 16], dtype=np.uint32).view(np.float32)[0]) for h in (lo, hi))
    return tuple(float(np.array([h], dtype=np.uint16).view(np.float16)[0]) for h in (lo, hi))


def run_asm(asm: str, regs: list[dict[str, float | int]], bf16: bool) -> None:
    """Execute ``asm`` on 32 lanes' registers (``$n`` operands and named temporaries), in place."""
    def val(lane: dict, tok: str) -> int | float:
        tok = tok.strip()
        return int(tok, 16) if tok.startswith("0x") else int(tok) if tok.isdigit() else lane[tok]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op.startswith("mma.sync"):
            d, a, b, c = (g.split(", ") for g in re.findall(r"\{([^}]*)\}", rest))
            amat = np.zeros((16, 16))
            bmat = np.zeros((16, 8))
            for ln, lane in enumerate(regs):
                g, t = ln // 4, ln % 4
                for j in range(4):  # register j holds a_{2j} (low half), a_{2j+1}
                    row, k = g + 8 * (j % 2), 2 * t + 8 * (j // 2)
                    amat[row, k], amat[row, k + 1] = halves(val(lane, a[j]), bf16)
                for j in range(2):
                    k = 2 * t + 8 * j
                    bmat[k, g], bmat[k + 1, g] = halves(val(lane, b[j]), bf16)
            prod = amat @ bmat
            outs = []
            for ln, lane in enumerate(regs):
                g, t = ln // 4, ln % 4
                outs.append([prod[g + 8 * (i // 2), 2 * t + i % 2] + val(lane, c[i]) for i in range(4)])
            for lane, out in zip(regs, outs, strict=True):
                for i in range(4):
                    lane[d[i].strip()] = out[i]
            continue
        args = [s.strip() for s in rest.split(",")]
        for lane in regs:
            if op == "mov.b32":
                lane[args[0]] = val(lane, args[1])
            elif op == "shr.u32":
                lane[args[0]] = (val(lane, args[1]) & 0xFFFFFFFF) >> val(lane, args[2])
            elif op == "lop3.b32":
                assert args[4] == "0xEA"  # (a & b) | c
                lane[args[0]] = (val(lane, args[1]) & val(lane, args[2])) | val(lane, args[3])
            elif op.startswith("fma.rn."):  # packed a * b + c, each half rounded to the pair's type
                out = []
                for x, y, z in zip(*(halves(val(lane, v), bf16) for v in args[1:4]), strict=True):
                    r = torch.tensor(x * y + z, dtype=torch.float64).to(torch.bfloat16 if bf16 else torch.float16)
                    out.append(int(r.view(torch.int16)) & 0xFFFF)
                lane[args[0]] = out[0] | out[1] << 16
            elif op.startswith(("sub.", "add.", "mul.rn.")):  # packed halves, each rounded to the pair's type
                fn = {"sub": lambda a, b: a - b, "add": lambda a, b: a + b, "mul": lambda a, b: a * b}[op[:3]]
                out = []
                for x, y in zip(*(halves(val(lane, v), bf16) for v in args[1:3]), strict=True):
                    r = torch.tensor(fn(x, y), dtype=torch.float64).to(torch.bfloat16 if bf16 else torch.float16)
                    out.append(int(r.view(torch.int16)) & 0xFFFF)
                lane[args[0]] = out[0] | out[1] << 16
            elif op == "prmt.b32":
                pool = (val(lane, args[1]) & 0xFFFFFFFF) | (val(lane, args[2]) & 0xFFFFFFFF) << 32
                sel = val(lane, args[3])
                lane[args[0]] = sum(((pool >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
            else:
                raise AssertionError(f"unexpected instruction {op}")


@pytest.mark.parametrize(("bits", "group", "bf16", "nb", "sub"),
                         [(4, 128, True, 1, False), (4, 32, False, 2, False), (2, 128, True, 2, False),
                          (2, 32, False, 1, False), (2, 64, True, 1, False), (4, 128, True, 2, True),
                          (4, 32, False, 1, True), (2, 128, False, 1, True),
                          (2, 128, True, 2, True), (2, 32, True, 1, True), (2, 64, False, 2, True),
                          (8, 128, True, 1, True), (8, 32, True, 2, True), (8, 64, True, 1, True),
                          (8, 128, False, 1, False), (8, 32, False, 2, True)])
def test_asm_chunk_sums_match_the_codes(bits: int, group: int, bf16: bool, nb: int, sub: bool) -> None:
    """One warp, one chunk (a field block), columns 0..31: C = sum (m + q) x (with ``sub``: sum (q - z) x)
    and Cx = sum x, per the C fragment (tile 0: column 4g + c // 2; tile 1: + 2; x row 2t + c % 2; set b:
    + 8 b)."""
    gen = torch.Generator().manual_seed(bits * 100 + group)
    n, k, pf = 32, 256, 32 // bits
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8)
    p = build(codes, torch.ones(n, k // group), torch.zeros(n, k // group, dtype=torch.int32),
              torch.arange(k) // group, bits)
    r = p.rows_per_block
    nf, hr, magic = pf * r // 8, r // 2, 128.0 if bf16 else 1024.0
    dtype = torch.bfloat16 if bf16 else torch.float16
    zero = [(7 * col) % (1 << bits) for col in range(n)]
    x = torch.randn(8 * nb, k, generator=gen).to(dtype)
    xbits = x.view(torch.int16).to(torch.int64) & 0xFFFF
    words = p.qweight.to(torch.int64) & 0xFFFFFFFF
    chunk = 1  # the second field block: kbase = chunk * R * PF
    kbase = chunk * r * pf
    regs: list[dict[str, float | int]] = []
    for ln in range(32):
        g, t = ln // 4, ln % 4
        rp, fh = 2 * (t % hr), t // hr
        lane: dict[str, float | int] = {}
        for c in range(4):  # words of the lane's two word rows, shifted to its fields
            for base, row in ((24, chunk * r + rp), (28, chunk * r + rp + 1)):
                lane[f"${base + c}"] = int(words[row, 4 * g + c]) >> (fh * nf * bits)
        for b in range(2):  # x pair of local field f: rows kbase + (fh NF + f) R + rp (+1), x row g + 8b
            for f in range(16):
                kk = kbase + (fh * nf + min(f, nf - 1)) * r + rp
                lane[f"${32 + 16 * b + f}"] = int(xbits[min(g + 8 * b, 8 * nb - 1), kk]) | \
                    int(xbits[min(g + 8 * b, 8 * nb - 1), kk + 1]) << 16
        for i in range(24):
            lane[f"${64 + i}"] = 0.0
        for c in range(4):  # -(m + z) twice (8-bit on bf16: -z), z of the lane's word column (one per column)
            zm = 0.0 if bits == 8 and bf16 else magic
            h = int(torch.tensor(-(zm + zero[4 * g + c]), dtype=dtype).view(torch.int16)) & 0xFFFF
            lane[f"${88 + c}"] = h | h << 16
        regs.append(lane)
    run_asm(mma_asm(bits, nf, bf16, nb, sub, cx=True), regs, bf16)
    kk = [kbase + j * r + row for row in range(r) for j in range(pf)]  # the chunk's sorted rows (identity perm)
    q = codes[:, kk].double() - torch.tensor(zero).double()[:, None] if sub else codes[:, kk].double() + magic
    xs = x[:, kk].double()
    for ln, lane in enumerate(regs):
        g, t = ln // 4, ln % 4
        for b in range(nb):
            for c in range(4):
                m = 8 * b + 2 * t + c % 2
                for tile in range(2):
                    col = 4 * g + c // 2 + 2 * tile
                    want = float(q[col] @ xs[m])
                    assert lane[f"${12 * b + 4 * tile + c}"] == pytest.approx(want, rel=1e-9, abs=1e-6)
                assert lane[f"${12 * b + 8 + c}"] == pytest.approx(float(xs[m].sum()), rel=1e-9, abs=1e-9)


def test_eight_bit_bf16_asm_needs_sub() -> None:
    """m + q of an 8-bit code needs 9 significant bits: bf16 runs only the byte-split, zero-subtracting form."""
    with pytest.raises(ValueError, match="sub=True"):
        mma_asm(8, 4, True, 1, False, True)
