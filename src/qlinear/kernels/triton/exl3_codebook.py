"""EXL3 codebooks in Triton: a 16-bit trellis state to the float16 value exllamav3's ``decode_3inst<cb>`` gives.

Shared by the block decode (``exl3_mv.py``) and the M = 1 decode GEMV (``exl3_gemv.py``); the Torch layout's
``codebook_table`` (``layouts/exl3.py``) is the reference both are tested against.
"""

from __future__ import annotations

import triton
import triton.language as tl

K_INV = tl.constexpr(0.00676727294921875)  # float16 0x1EEE
K_BIAS = tl.constexpr(-10.3828125)  # float16 0xC931


#: ``0x6400 +`` the sum of a word's four bytes in one instruction: dp4a against 0x01010101 (exllamav3's own byte
#: sum for mul1). Takes the M = 1 GEMV's mul1 decode from 12.8 to 8.4 sm_90 instructions per weight at 2 bits, under
#: 3inst's 9.5 (``benchmarks/exl3_sass.py --gemv --plain``, ``results/exl3-sass-dp4a-2026-12-07.md``).
BYTE_SUM_ASM = tl.constexpr("{ .reg .b32 ones, base; mov.b32 ones, 0x01010101; mov.b32 base, 0x6400; "
                             "dp4a.u32.u32 $0, $1, ones, base; }")


@triton.jit
def codebook_value(state, CB: tl.constexpr, ASM: tl.constexpr):
    """float16 value of uint32 ``state`` (< 2**16); ``CB`` indexes ``layouts.exl3.CODEBOOKS``. ``ASM``: PTX where it
    saves instructions (CUDA only; the interpreter runs the plain-Triton lines, which compute the same bits)."""
    K_INV_H = tl.cast(K_INV, tl.float16)  # exact: both are float16 values; a scalar cast (no tl.full) so Gluon
    K_BIAS_H = tl.cast(K_BIAS, tl.float16)  # kernels (exl3_tc.py) call this too
    if CB == 2:  # mul1: fma(1024 + byte sum, k_inv, k_bias) in float16, one rounding as __hfma
        x = state * 0x83DCD12D
        if ASM:
            biased = tl.inline_asm_elementwise(BYTE_SUM_ASM, "=r,r", [x], dtype=tl.uint32, is_pure=True, pack=1)
        else:
            pairs = (x & 0x00FF00FF) + ((x >> 8) & 0x00FF00FF)  # two 16-bit lanes, each a sum of two bytes
            biased = (pairs & 0xFFFF) + (pairs >> 16) + 0x6400  # sum < 1024: float16 1024 + sum is 0x6400 + sum
        val = tl.fma(biased.to(tl.uint16).to(tl.float16, bitcast=True), K_INV_H, K_BIAS_H)
    else:
        x = state * 89226354 + 64248484 if CB == 0 else state * 0xCBAC1FED  # 3inst / mcg
        x = (x & 0x8FFF8FFF) ^ 0x3B603B60
        lo = (x & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
        hi = (x >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
        val = lo + hi  # float16 add: the exact sum rounded once, as __hadd
    return val


def _pair_asm(cb: int) -> str:
    """PTX for two states (``$1``, ``$2``, low 16 bits used) to their two float16 values packed in ``$0`` (``$1``'s
    in the low half), 3inst (``cb`` 0) or mcg (1): the per-state arithmetic of ``codebook_value``, then the two
    halves of both words gathered by two PRMTs and summed by one f16x2 add. Compiled for sm_90 inside ``exl3_tc``
    this takes the loop from 7.5 to 6.95 instructions a weight at 2-bit 3inst, 8.7 to 7.9 at 5-bit mcg
    (``tests/exl3_tc_sm90_compile.py``): Triton rematerializes the LOP3 mask constant and packs pairs with extra
    moves."""
    mad = "mad.lo.u32 a, a, 89226354, 64248484; mad.lo.u32 b, b, 89226354, 64248484;" if cb == 0 else \
        "mul.lo.u32 a, a, 0xCBAC1FED; mul.lo.u32 b, b, 0xCBAC1FED;"
    return ("{ .reg .b32 a, b, lo, hi; and.b32 a, $1, 0xFFFF; and.b32 b, $2, 0xFFFF; " + mad
            + " lop3.b32 a, a, 0x8FFF8FFF, 0x3B603B60, 0x6A; lop3.b32 b, b, 0x8FFF8FFF, 0x3B603B60, 0x6A; "
            "prmt.b32 lo, a, b, 0x5410; prmt.b32 hi, a, b, 0x7632; add.rn.f16x2 $0, lo, hi; }")


PAIR_3INST = tl.constexpr(_pair_asm(0))
PAIR_MCG = tl.constexpr(_pair_asm(1))


@triton.jit
def codebook_pairs(state, CB: tl.constexpr):
    """``codebook_value(state & 0xFFFF, CB, True)`` for uint32 ``state``, CUDA only, two states an instruction
    sequence for 3inst and mcg (``_pair_asm``; the pairs are neighbouring registers, which ``exl3_tc`` lays out as
    one mma A register); mul1 as ``codebook_value`` (its dp4a form compiles no better paired)."""
    if CB == 2:
        return codebook_value(state & 0xFFFF, CB, True)
    return tl.inline_asm_elementwise(PAIR_3INST if CB == 0 else PAIR_MCG, "=r,r,r", [state], dtype=tl.float16,
                                     is_pure=True, pack=2)
