"""8-bit codes into gemm5's A fragment (GPTQ 8-bit, GGUF Q8_0's form): four fields a word, two K pairs a byte lane.

The fragment reads word rows as ``fragment.py`` says (thread ``(w, l)`` holds rows ``2 (l % 4)``, ``+ 1`` of every
8-row block): with 8-bit words an 8-row block is 32 codes and field ``j`` of row ``r`` is input position
``8 j + r`` of it, so one PRMT of a byte from each of the two words makes a K pair. float16: the byte OR-ed into
``1024`` (``0x6400``) is ``1024 + q`` exactly, minus ``1024 + z``, times the scale: one rounding. bfloat16 holds
integers exactly only up to 256, so ``128 + q`` is not exact for q >= 128; each byte is split into its nibbles
instead: ``(2048 + 16 h) - 2048`` (``0x4500``: bfloat16's step at 2048 is 16) and ``(128 + l) - (128 + z)`` are
both exact, their sum ``q - z`` is an integer of magnitude <= 255 and exact too, and one multiply by the scale
rounds once, as the float16 path and the 4-bit kernels do. With an additive offset (MLX's biases on 5, 6 and 8-bit
codes) that multiply is ``fma(q, s, o)``, one rounding too, as ``fragment.py`` does for 4-bit words.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


def _bytes_asm(ty: str, offsets: bool = False) -> str:
    """PTX for two words ``$4, $5`` (word rows r, r+1 of one column), scale pair ``$6`` and ``magic + z`` pair
    ``$7``: output ``$x`` = field ``x`` (byte ``x``) of both words, dequantized, as one ``ty`` pair; ``offsets``:
    ``(q - z) s + o`` by one FMA with ``$8`` the offset pair."""
    lines = ["{", ".reg .b32 t, u, h;"]
    if ty == "bf16x2":
        lines.append("mov.b32 h, 0x45004500;")
    for x in range(4):
        sel = x | x << 4 | (4 + x) << 8 | (4 + x) << 12
        lines.append(f"prmt.b32 t, $4, $5, {sel:#06x};")
        if ty == "f16x2":
            lines += [f"lop3.b32 ${x}, t, 0x00FF00FF, 0x64006400, 0xEA;", f"sub.f16x2 ${x}, ${x}, $7;"]
        else:
            lines += [f"lop3.b32 ${x}, t, 0x000F000F, 0x43004300, 0xEA;",
                      "shr.u32 u, t, 4;",
                      "lop3.b32 u, u, 0x000F000F, 0x45004500, 0xEA;",
                      "sub.bf16x2 u, u, h;",
                      f"sub.bf16x2 ${x}, ${x}, $7;",
                      f"add.bf16x2 ${x}, ${x}, u;"]
        lines.append(f"fma.rn.{ty} ${x}, ${x}, $6, $8;" if offsets else f"mul.rn.{ty} ${x}, ${x}, $6;")
    return "\n".join([*lines, "}"])


ASM8_BF16 = gl.constexpr(_bytes_asm("bf16x2"))
ASM8_F16 = gl.constexpr(_bytes_asm("f16x2"))
ASM8_FMA_BF16 = gl.constexpr(_bytes_asm("bf16x2", offsets=True))
ASM8_FMA_F16 = gl.constexpr(_bytes_asm("f16x2", offsets=True))


@gluon.jit
def to_fragment8(f0, f1, f2, f3, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, a_layout: gl.constexpr):
    """The four field outputs (``[BN, BKW]`` each, K pairs in registers) as the A fragment ``[BN, BK]``: field
    ``j`` of word row ``r`` is input position ``8 j + r`` of its 32-row block."""
    BKW: gl.constexpr = BLOCK_K // 4
    q = gl.join(gl.join(f0, f2), gl.join(f1, f3))
    q = gl.reshape(gl.permute(gl.reshape(q, (BLOCK_N, BKW // 8, 8, 4)), (0, 1, 3, 2)), (BLOCK_N, BLOCK_K))
    return gl.convert_layout(q, a_layout, assert_trivial=True)


@gluon.jit
def dequant8(w, s2, z2, o2, ZC: gl.constexpr, HAS_Z: gl.constexpr, HAS_OFF: gl.constexpr, BLOCK_N: gl.constexpr,
             BLOCK_K: gl.constexpr, a_layout: gl.constexpr, dt: gl.constexpr):
    """8-bit words and their per-word scale, zero and offset (float32 ``[BN, BKW]``) -> the A fragment
    ``[BN, BK]``."""
    MAGIC: gl.constexpr = 128.0 if dt == gl.bfloat16 else 1024.0
    sb = s2.to(dt)
    zc = (z2 + MAGIC).to(dt) if HAS_Z else gl.full(s2.shape, ZC + MAGIC, dt, s2.type.layout)
    if HAS_OFF:
        ob = o2.to(dt)
        if dt == gl.bfloat16:
            f0, f1, f2, f3 = gl.inline_asm_elementwise(ASM8_FMA_BF16, "=r,=r,=r,=r,r,r,r,r,r", [w, sb, zc, ob],
                                                       dtype=(gl.bfloat16,) * 4, is_pure=True, pack=2)
        else:
            f0, f1, f2, f3 = gl.inline_asm_elementwise(ASM8_FMA_F16, "=r,=r,=r,=r,r,r,r,r,r", [w, sb, zc, ob],
                                                       dtype=(gl.float16,) * 4, is_pure=True, pack=2)
    elif dt == gl.bfloat16:
        f0, f1, f2, f3 = gl.inline_asm_elementwise(ASM8_BF16, "=r,=r,=r,=r,r,r,r,r", [w, sb, zc],
                                                   dtype=(gl.bfloat16,) * 4, is_pure=True, pack=2)
    else:
        f0, f1, f2, f3 = gl.inline_asm_elementwise(ASM8_F16, "=r,=r,=r,=r,r,r,r,r", [w, sb, zc],
                                                   dtype=(gl.float16,) * 4, is_pure=True, pack=2)
    return to_fragment8(f0, f1, f2, f3, BLOCK_N, BLOCK_K, a_layout)
