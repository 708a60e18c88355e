"""The wgmma A fragment gemm4/gemm5 dequantize into, and gemm5 over groups of 32 through x in fragment order.

Groups of 32: GPTQ g32, GGUF Q4_K's two-level form, Q4_0/Q4_1's float affine form.

gemm5's A-fragment layout (``qmm4.code_layout``) reads word rows as if every field block had 8 of them: thread
``(w, l)`` holds word rows ``2 (l % 4)``, ``+ 1`` of each 8-row block, and takes field ``j`` of row ``r`` as input
position ``8 j + r`` of the block's 64. Groups of 32 pack blocks of 4 word rows (``layout.block_rows``), where
field ``j`` of row ``r`` is sorted row ``32 (r // 4) + 4 j + r % 4``. The two orders differ by a fixed
permutation inside each 64 rows, and a sum over K does not care about order: x is gathered once into the
fragment's order (``fragment_order.fragment_input``, one gather launch; act-order's gather folds into it)
and the kernel runs unchanged on the words as they are. No second copy of the codes, so the GGUF forms stay lossless.

What changes in the kernel is the group rows: a 64-row K step now spans two groups, and word row ``r`` of a
step belongs to group ``r // 4`` of it. Both rows of a thread's word pair lie in one block of 4, so a register
pair still shares one scale (``rows_params``). Weights ``s q + o`` (GGUF minimums) dequantize with one bf16x2 /
f16x2 FMA a pair after the exact magic subtract (``ASM_FMA_*``), ``s`` and ``o`` rounded to the activation dtype
first as GPTQ's scales are; K-quant sub-scales and mins (uint8) take their super-block's float32 ``d`` and
``-dmin`` first (``layout.build_kquant``), exactly, in float32.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .qmm3 import ASM_BF16, ASM_F16, _pairs_asm


def _fma_asm(magic: str, ty: str) -> str:
    """PTX for two words, their scale, magic and offset pairs: ``qmm3``'s fields, then ``fma(q, s, o)``."""
    return _pairs_asm(magic, ty, offsets=True)


ASM_FMA_BF16 = gl.constexpr(_fma_asm("0x43004300", "bf16x2"))
ASM_FMA_F16 = gl.constexpr(_fma_asm("0x64006400", "f16x2"))


@gluon.jit
def to_fragment(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                a_layout: gl.constexpr):
    """The eight field outputs of the pair asm (``[BN, BKW]`` each, K pairs in registers) as the wgmma A
    fragment ``[BN, BK]``: field ``j`` of word row ``r`` is input position ``8 j + r`` of its 64-row block."""
    BKW: gl.constexpr = BLOCK_K // 8
    q = gl.join(gl.join(gl.join(o0, o4), gl.join(o2, o6)), gl.join(gl.join(o1, o5), gl.join(o3, o7)))
    q = gl.reshape(gl.permute(gl.reshape(q, (BLOCK_N, BKW // 8, 8, 8)), (0, 1, 3, 2)), (BLOCK_N, BLOCK_K))
    return gl.convert_layout(q, a_layout, assert_trivial=True)



@gluon.jit
def _row_at(ring, slot, t: gl.constexpr, r_layout: gl.constexpr, w_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """Row ``t`` of slot ``slot``'s ``[rows, BN]`` group rows, float32, over the words' output channels."""
    row = ring.index(slot).slice(t, 1).load(r_layout)
    return gl.convert_layout(gl.reshape(row, [BLOCK_N]), gl.SliceLayout(1, w_layout)).to(gl.float32)


@gluon.jit
def _place(row, grp, t: gl.constexpr, prev, zero, NG: gl.constexpr):
    """Row ``t`` (``[BN]``) on the words of group ``t`` of the step, ``prev`` elsewhere; on every word when the step
    spans one group."""
    v = gl.broadcast(row[:, None], zero)[0]
    return v if NG == 1 else gl.where(grp == t, v, prev)


@gluon.jit
def rows_params(ss, zs, os, us, slot, live, NG: gl.constexpr, RPG: gl.constexpr, HAS_Z: gl.constexpr,
                HAS_OFF: gl.constexpr, HAS_SUP: gl.constexpr, BLOCK_N: gl.constexpr, BKW: gl.constexpr,
                r_layout: gl.constexpr, w_layout: gl.constexpr):
    """Scale, zero and offset (float32 ``[BN, BKW]``) of every word of a step spanning ``NG`` groups: word row
    ``r`` takes group ``r // RPG`` (4-bit in 4-row blocks: 4; 8-bit g32: 8), or the step's one group (``NG`` 1:
    groups of 64 and more, 8-bit words or offsets). A padded step (``live`` false) gets scale and offset 0: it adds
    nothing."""
    grp = gl.arange(0, BKW, layout=gl.SliceLayout(0, w_layout)) // RPG
    grp = gl.broadcast(grp[None, :], gl.zeros([BLOCK_N, BKW], gl.int32, w_layout))[0]
    zero = gl.zeros([BLOCK_N, BKW], gl.float32, w_layout)
    s2, z2, o2 = zero, zero, zero
    if HAS_SUP:
        d = _row_at(us, slot, 0, r_layout, w_layout, BLOCK_N)
        ndmin = _row_at(us, slot, 1, r_layout, w_layout, BLOCK_N)
    for t in gl.static_range(NG):
        st = _row_at(ss, slot, t, r_layout, w_layout, BLOCK_N)
        if HAS_SUP:
            st = st * d
        s2 = _place(st, grp, t, s2, zero, NG)
        if HAS_Z:
            zt = _row_at(zs, slot, t, r_layout, w_layout, BLOCK_N)
            z2 = _place(zt, grp, t, z2, zero, NG)
        if HAS_OFF:
            ot = _row_at(os, slot, t, r_layout, w_layout, BLOCK_N)
            if HAS_SUP:
                ot = ot * ndmin
            o2 = _place(ot, grp, t, o2, zero, NG)
    s2 = gl.where(live, s2, zero)
    o2 = gl.where(live, o2, zero)
    return s2, z2, o2


@gluon.jit
def dequant_rows(w, s2, z2, o2, ZC: gl.constexpr, HAS_Z: gl.constexpr, HAS_OFF: gl.constexpr,
                 BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, a_layout: gl.constexpr, dt: gl.constexpr):
    """Words and their per-word ``rows_params`` -> the A fragment ``[BN, BK]`` in the activation dtype."""
    MAGIC: gl.constexpr = 128.0 if dt == gl.bfloat16 else 1024.0
    sb = s2.to(dt)
    zc = (z2 + MAGIC).to(dt) if HAS_Z else gl.full(s2.shape, ZC + MAGIC, dt, s2.type.layout)
    ob = o2.to(dt)
    if HAS_OFF:
        if dt == gl.bfloat16:
            f0, f1, f2, f3, f4, f5, f6, f7 = gl.inline_asm_elementwise(
                ASM_FMA_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r", [w, sb, zc, ob], dtype=(gl.bfloat16,) * 8,
                is_pure=True, pack=2)
        else:
            f0, f1, f2, f3, f4, f5, f6, f7 = gl.inline_asm_elementwise(
                ASM_FMA_F16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r", [w, sb, zc, ob], dtype=(gl.float16,) * 8,
                is_pure=True, pack=2)
    elif dt == gl.bfloat16:
        f0, f1, f2, f3, f4, f5, f6, f7 = gl.inline_asm_elementwise(
            ASM_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [w, sb, zc], dtype=(gl.bfloat16,) * 8, is_pure=True,
            pack=2)
    else:
        f0, f1, f2, f3, f4, f5, f6, f7 = gl.inline_asm_elementwise(
            ASM_F16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [w, sb, zc], dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    return to_fragment(f0, f1, f2, f3, f4, f5, f6, f7, BLOCK_N, BLOCK_K, a_layout)
