"""PTX text of ``gemv_tc``'s inner step (``qmv_tc.py``): per lane, code pairs made from two word rows and
``mma.sync.m16n8k16`` on them. Built once per (bits, fields, dtype, row sets, options) and cached: the
launcher asks for it on every call."""

from __future__ import annotations

import functools

#: 0.25 twice (bf16x2 / f16x2): a code read in place at bits 2-3 of its byte is ``m + 4 q``
QUARTER = {"bf16": "0x3E803E80", "f16": "0x34003400"}
#: 3 m / 4 twice (96 for bf16's m = 128, 768 for f16's 1024): turns ``-(m + z)`` into ``-(m / 4 + z)``
THREE_QUARTERS_MAGIC = {"bf16": "0x42C042C0", "f16": "0x62006200"}


@functools.cache
def mma_asm(bits: int, nf: int, bf16: bool, nb: int, sub: bool = False, cx: bool = True) -> str:
    """PTX of one chunk for one lane, for ``nb`` (1 or 2) sets of 8 activation rows sharing the weights.

    Operands (fixed, so one call site serves every case): outputs ``$12b + 0..3`` C of tile 0 of set ``b``,
    ``+4..7`` tile 1, ``+8..11`` Cx; inputs ``$24..$27`` / ``$28..$31`` the words of the lane's two word
    rows (4 columns), ``$32 + 16b + f`` the x pair of local field ``f`` for set ``b``, ``$64 + 12b + ...`` C
    in, ``$88..$91`` per column the pair ``-(m + z)``. ``nf`` fields per word are used, two per K16 step:
    ``nf / 2`` steps of two MMAs per set, plus one with A = 1 for Cx when ``cx``. With ``sub`` each pair
    becomes ``q - z`` (one exact FMA) so C needs no ``(m + z) Cx`` correction; 2-bit codes 1 and 3 of a
    byte are then masked in place (``m + 4 q``, exact) and the FMA scales by 1/4: one shift per byte, not three.
    """
    if bits == 8 and bf16:
        if not sub:
            raise ValueError("8-bit codes on bfloat16 run only with sub=True (m + q is not exact in bf16)")
        return _byte_split_asm(nf, nb, cx)
    magic = "0x43004300" if bf16 else "0x64006400"
    one = "0x3F803F80" if bf16 else "0x3C003C00"
    ty = "bf16" if bf16 else "f16"
    mask = {8: "0x00FF00FF", 4: "0x000F000F", 2: "0x00030003"}[bits]
    per_byte = 8 // bits
    lines = ["{", ".reg .b32 t, u, one;", f".reg .b32 p<{4 * nf}>;", f"mov.b32 one, {one};"]
    quad = bits == 2 and sub  # 2-bit codes 1 and 3 of a byte taken in place (as 4 q), scaled back by the FMA
    if quad:
        lines += [".reg .b32 quarter, three, zq<4>;", f"mov.b32 quarter, {QUARTER[ty]};",
                  f"mov.b32 three, {THREE_QUARTERS_MAGIC[ty]};"]
        lines += [f"fma.rn.{ty}x2 zq{c}, ${88 + c}, one, three;" for c in range(4)]  # -(m / 4 + z)
    for c in range(4):
        for x in range(nf // per_byte):
            sel = x | x << 4 | (4 + x) << 8 | (4 + x) << 12
            lines.append(f"prmt.b32 t, ${24 + c}, ${28 + c}, {sel:#06x};")
            for i in range(per_byte):
                reg = f"p{c * nf + per_byte * x + i}"
                if quad:
                    if i == 2:
                        lines.append("shr.u32 u, t, 4;")
                    src, in_place = ("t" if i < 2 else "u"), i % 2 == 1
                    lines.append(f"lop3.b32 {reg}, {src}, {'0x000C000C' if in_place else mask}, {magic}, 0xEA;")
                    scale, add = ("quarter", f"zq{c}") if in_place else ("one", f"${88 + c}")
                    lines.append(f"fma.rn.{ty}x2 {reg}, {reg}, {scale}, {add};")
                    continue
                src = "t"
                if i:
                    lines.append(f"shr.u32 u, t, {bits * i};")
                    src = "u"
                lines.append(f"lop3.b32 {reg}, {src}, {mask}, {magic}, 0xEA;")
                if sub:
                    lines.append(f"fma.rn.{ty}x2 {reg}, {reg}, one, ${88 + c};")
    steps = [(f"p{fa}, p{nf + fa}, p{fb}, p{nf + fb}",
              f"p{2 * nf + fa}, p{3 * nf + fa}, p{2 * nf + fb}, p{3 * nf + fb}",
              [f"{{${32 + 16 * b + fa}, ${32 + 16 * b + fb}}}" for b in range(nb)])
             for fa, fb in ((2 * s, 2 * s + 1) for s in range(nf // 2))]
    return "\n".join([*lines, *_mmas(ty, steps, "one, one, one, one" if cx else ""), "}"])


def _mmas(ty: str, steps: list[tuple[str, str, list[str]]], cx_a: str) -> list[str]:
    """The MMAs of a chunk: per K16 step (tile 0's A, tile 1's A, B per row set), each set's two tiles and, with
    ``cx_a`` (the A that sums x), its Cx; the first step reads C in (``$64 + ...``), later ones accumulate."""
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32"
    lines = []
    for s, (a0, a1, bs) in enumerate(steps):
        for bset, b in enumerate(bs):
            for acc, a in [(0, a0), (4, a1)] + ([(8, cx_a)] if cx_a else []):
                out = 12 * bset + acc
                d = ", ".join(f"${out + i}" for i in range(4))
                src = ", ".join(f"${(64 + out if s == 0 else out) + i}" for i in range(4))
                lines.append(f"{mma} {{{d}}}, {{{a}}}, {b}, {{{src}}};")
    return lines


def _byte_split_asm(nf: int, nb: int, cx: bool) -> str:
    """8-bit codes on bfloat16: ``m + q`` needs 9 significant bits, so each byte is split into nibbles,
    ``q - z = 16 (h - 8) + (128 + l - z)``, both terms exact in bf16 (``$88 + c`` holds ``-z`` twice here).
    One MMA per field: its first K half takes the low-nibble terms, the second the high ones, against the
    same x pair; the Cx MMA's A is 1 on the first half only, so it sums x once."""
    lines = ["{", ".reg .b32 t, u, one, zero, sixteen, shift8;", f".reg .b32 lo<{4 * nf}>, hi<{4 * nf}>;",
             "mov.b32 one, 0x3F803F80;", "mov.b32 zero, 0;", "mov.b32 sixteen, 0x41804180;",
             "mov.b32 shift8, 0xC508C508;"]  # -2176 = -16 (128 + 8) twice
    for c in range(4):
        for x in range(nf):
            sel = x | x << 4 | (4 + x) << 8 | (4 + x) << 12
            r = c * nf + x
            lines += [f"prmt.b32 t, ${24 + c}, ${28 + c}, {sel:#06x};",
                      f"lop3.b32 lo{r}, t, 0x000F000F, 0x43004300, 0xEA;",  # 128 + l
                      "shr.u32 u, t, 4;",
                      f"lop3.b32 hi{r}, u, 0x000F000F, 0x43004300, 0xEA;",  # 128 + h
                      f"fma.rn.bf16x2 lo{r}, lo{r}, one, ${88 + c};",  # 128 + l - z
                      f"fma.rn.bf16x2 hi{r}, hi{r}, sixteen, shift8;"]  # 16 (h - 8)
    steps = [(f"lo{f}, lo{nf + f}, hi{f}, hi{nf + f}",
              f"lo{2 * nf + f}, lo{3 * nf + f}, hi{2 * nf + f}, hi{3 * nf + f}",
              [f"{{${32 + 16 * b + f}, ${32 + 16 * b + f}}}" for b in range(nb)]) for f in range(nf)]
    return "\n".join([*lines, *_mmas("bf16", steps, "one, one, zero, zero" if cx else ""), "}"])

#: operand constraints of ``mma_asm`` (the same for every case)
MMA_CONSTRAINTS = ",".join(["=f"] * 24 + ["r"] * 40 + ["f"] * 24 + ["r"] * 4)
