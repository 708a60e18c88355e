"""The paired codebook PTX of ``exl3_codebook._pair_asm`` (what ``exl3_tc`` runs on CUDA for 3inst and mcg), executed
instruction by instruction by a small PTX evaluator written here from the PTX ISA's definitions, against the Torch
layout's codebook table (``layouts.exl3.codebook_table``, itself checked against exllamav3's decoder): every one of
the 65536 states in each half of the pair, with garbage above bit 16 as the kernel hands them over. CI has no GPU,
so this is what checks the PTX text (constants, the LOP3 truth table, the PRMT selectors, which half is which) before
a GPU run does (``benchmarks/gpu_exl3_tc.py``, bit-exact through identity rows)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from qlinear.layouts import exl3

M32 = 0xFFFFFFFF


def _f16(bits: np.ndarray) -> np.ndarray:
    return (bits & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    """Bit i of the result is bit ``(a_i << 2 | b_i << 1 | c_i)`` of the truth table (PTX ``lop3.b32``)."""
    out = np.zeros_like(a)
    for idx in range(8):
        if lut >> idx & 1:
            sa = a if idx & 4 else ~a & M32
            sb = b if idx & 2 else ~b & M32
            sc = c if idx & 1 else ~c & M32
            out |= sa & sb & sc
    return out


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """``prmt.b32`` (default mode): byte ``i`` of the result is byte ``sel >> 4 i & 7`` of ``b:a`` (``a`` bytes 0-3)."""
    out = np.zeros_like(a)
    for i in range(4):
        k = sel >> (4 * i) & 7
        src = a if k < 4 else b
        out |= ((src >> (8 * (k % 4))) & 0xFF) << (8 * i)
    return out


def run_ptx(asm: str, x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
    """Evaluate ``asm`` with ``$1``, ``$2`` bound to uint32 arrays; return ``$0``. Only the instruction forms the
    paired codebook uses; anything else fails the test."""
    regs: dict[str, np.ndarray] = {"$1": x1.astype(np.int64), "$2": x2.astype(np.int64)}

    def val(tok: str) -> np.ndarray | int:
        tok = tok.strip()
        if tok in regs:
            return regs[tok]
        return int(tok, 16) if tok.lower().startswith("0x") else int(tok)

    body = asm.strip().strip("{}")
    for stmt in filter(None, (s.strip() for s in body.split(";"))):
        op, _, rest = stmt.partition(" ")
        args = [a.strip() for a in rest.split(",")]
        if op == ".reg":
            continue
        dst, src = args[0], [val(a) for a in args[1:]]
        if op == "and.b32":
            regs[dst] = src[0] & src[1]
        elif op == "mad.lo.u32":
            regs[dst] = (src[0] * src[1] + src[2]) & M32
        elif op == "mul.lo.u32":
            regs[dst] = (src[0] * src[1]) & M32
        elif op == "lop3.b32":
            regs[dst] = _lop3(*(np.broadcast_to(np.asarray(s, dtype=np.int64), x1.shape) for s in src[:3]), src[3])
        elif op == "prmt.b32":
            regs[dst] = _prmt(src[0], src[1], src[2])
        elif op == "add.rn.f16x2":
            lo = (_f16(src[0]) + _f16(src[1])).astype(np.float16).view(np.uint16).astype(np.int64)
            hi = (_f16(src[0] >> 16) + _f16(src[1] >> 16)).astype(np.float16).view(np.uint16).astype(np.int64)
            regs[dst] = lo | hi << 16
        else:
            raise AssertionError(f"PTX the evaluator does not know: {stmt!r}")
    return regs["$0"]


@pytest.mark.parametrize(("cb", "name"), [(0, "3inst"), (1, "mcg")])
def test_paired_ptx_gives_the_codebook_for_every_state(cb: int, name: str) -> None:
    pytest.importorskip("triton")
    from qlinear.kernels.triton.exl3_codebook import _pair_asm

    asm = _pair_asm(cb)
    assert re.search(r"\$0", asm) and "$3" not in asm
    want = exl3.codebook_table(name).view(torch.int16).numpy().astype(np.int64) & 0xFFFF
    states = np.arange(1 << 16, dtype=np.int64)
    rng = np.random.default_rng(cb)
    garbage = rng.integers(0, 1 << 16, size=states.shape, dtype=np.int64) << 16
    other = states[::-1].copy()
    out = run_ptx(asm, states | garbage, other | garbage[::-1])
    assert np.array_equal(out & 0xFFFF, want[states])  # $1's value in the low half
    assert np.array_equal(out >> 16, want[other])  # $2's in the high half
