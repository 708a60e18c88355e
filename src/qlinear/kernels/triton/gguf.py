"""Triton decoders of raw GGML blocks: per-step tiles of code fields, their scales, and their K positions.

The weight is ``qweight`` viewed as int16 halfwords ``[N, nb * T / 2]`` (every GGML type here has even
``T``, so a row and every block field is halfword aligned and the bytes never move). A *step* covers
``BPS`` blocks of every row of a tile; its quant bytes load as one tile ``[BN, NC, HC]``: ``NC = BPS * CPB``
chunks of ``HC`` consecutive halfwords, each chunk chosen so that every one of the ``F`` fields of a halfword
(nibbles, bytes or bits, ``field_q``) belongs to a single scale run for the whole chunk. So one scale pair
``(A, C)`` per (row, chunk, field class) turns codes into weights, ``w = A * q + C``, multiplied in the
order of qlinear's torch decoders (bit-identical in float32 without fused multiply-add), and a GEMV can
sum ``q * x`` over a chunk before scaling.

Codes become floats without an int-to-float conversion: a field masked in place and OR-ed into the float
``2^23`` reads ``2^23 + q * 2^s``; one multiply-add by ``2^-s`` leaves ``q - offset`` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

MAGIC = tl.constexpr(0x4B000000)  # the float 2^23


@dataclass(frozen=True)
class Geom:
    """Tile geometry of one GGML type: block values/bytes, chunks per block, 16-byte vectors per chunk
    (``hv``), halfwords per vector, fields per halfword, field classes (scale runs sharing a chunk),
    blocks per step, and whether weights have a min term."""

    qt: int
    block: int
    type_size: int
    cpb: int
    hv: int
    hc: int
    fields: int
    classes: int
    bps: int
    has_min: bool


GEOMS = {g.qt: g for g in (
    Geom(2, 32, 18, 1, 1, 8, 4, 1, 4, False),      # Q4_0
    Geom(3, 32, 20, 1, 1, 8, 4, 1, 4, True),       # Q4_1
    Geom(6, 32, 22, 1, 1, 8, 4, 1, 4, False),      # Q5_0
    Geom(7, 32, 24, 1, 1, 8, 4, 1, 4, True),       # Q5_1
    Geom(8, 32, 34, 1, 2, 8, 2, 1, 4, False),      # Q8_0
    Geom(12, 256, 144, 4, 2, 8, 4, 2, 1, True),    # Q4_K
    Geom(13, 256, 176, 4, 2, 8, 4, 2, 1, True),    # Q5_K
    Geom(14, 256, 210, 4, 2, 8, 4, 2, 1, False),   # Q6_K
    Geom(40, 32, 6, 1, 1, 2, 16, 1, 8, False),     # Q1_0 (the reference's 32-value type)
    Geom(41, 128, 18, 1, 1, 8, 16, 1, 4, False),   # Q1_0_G128
)}


@triton.jit
def _byte(W, base, o):
    """Byte ``o`` (a tensor) of the blocks starting at halfword ``base``, as int32 0..255."""
    h = tl.load(W + base + o // 2).to(tl.int32)
    return (h >> ((o % 2) * 8)) & 0xFF


@triton.jit
def _f16(W, hw):
    return tl.load(W + hw).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def qh32(W, base, QT: tl.constexpr):
    """Q5_0 / Q5_1: the block's 32 high bits (``qh``, little-endian u32 at byte 2 or 4) per (row, chunk)."""
    at = 1 if QT == 6 else 2
    lo = tl.load(W + base + at).to(tl.int32) & 0xFFFF
    hi = tl.load(W + base + at + 1).to(tl.int32)
    return lo | (hi << 16)


@triton.jit
def step_tiles(W, rows, blk0, N, NB, RHW, c, hv, j, QT: tl.constexpr, CPB: tl.constexpr, HWB: tl.constexpr):
    """Load one step: ``(base, wq, wh, qh)``. Index tensors ``rows``, ``c`` (chunk in the step), ``hv`` (16-byte
    vector in the chunk) and ``j`` (halfword in the vector) broadcast to the tile shape, in any order.
    ``base`` is each chunk's block start in halfwords, ``wq`` the quant halfwords, ``wh`` the high-bit
    halfwords (Q5_K, Q6_K) and ``qh`` the 32 high bits per block (Q5_0, Q5_1); unused ones are ``wq``.
    Rows past N and blocks past the row are clamped to real ones, so no load needs a mask (which would
    also cost the vector width): their outputs are never stored and their activations read as zero."""
    bb = blk0 + c // CPB
    cc = c % CPB
    base = tl.where(rows < N, rows, 0).to(tl.int64) * RHW + tl.where(bb < NB, bb, 0) * HWB
    if QT == 2 or QT == 8 or QT == 40 or QT == 41:
        qs = 1
    elif QT == 3:
        qs = 2
    elif QT == 6:
        qs = 3
    elif QT == 7:
        qs = 4
    elif QT == 12:  # qs at byte 16, 32 bytes a chunk
        qs = 8 + 16 * cc
    elif QT == 13:  # qs at byte 48
        qs = 24 + 16 * cc
    else:  # Q6_K: ql chunk (h, t) = 2h + t at byte 64h + 32t
        qs = 16 * cc
    wq = tl.load(W + (base + qs + 8 * hv + j)).to(tl.uint16, bitcast=True).to(tl.int32)
    if QT == 13:
        wh = tl.load(W + (base + 8 + 8 * hv + j)).to(tl.uint16, bitcast=True).to(tl.int32)
    elif QT == 14:  # qh of half h, vector u
        wh = tl.load(W + (base + 64 + 16 * (cc // 2) + 8 * hv + j)).to(tl.uint16, bitcast=True).to(tl.int32)
    else:
        wh = wq
    if QT == 6 or QT == 7:  # noqa: SIM108 (constexpr branch)
        qh = qh32(W, base, QT)
    else:
        qh = wq
    return base, wq, wh, qh


@triton.jit
def scales(W, base, c, hv, g: tl.constexpr, QT: tl.constexpr, CPB: tl.constexpr):
    """``(A, C)`` of field class ``g`` per (row, chunk[, vector]): weights are ``A * q + C`` (C unused by types
    without a min). K-quants compute ``d * sc`` and ``dmin * mn`` as the torch decoders do."""
    if QT == 12 or QT == 13:
        r = 2 * (c % CPB) + g  # Q4_K/Q5_K scale run of this chunk and class
        rr = r % 4
        lo_sc = _byte(W, base, 4 + rr)
        lo_mn = _byte(W, base, 8 + rr)
        md = _byte(W, base, 12 + rr)
        sc = tl.where(r < 4, lo_sc & 63, (md & 0xF) | ((lo_sc >> 6) << 4))
        mn = tl.where(r < 4, lo_mn & 63, (md >> 4) | ((lo_mn >> 6) << 4))
        a = _f16(W, base) * sc.to(tl.float32)
        cm = -(_f16(W, base + 1) * mn.to(tl.float32))
    elif QT == 14:
        cc = c % CPB  # (h, t) and vector u: scale run 8h + 2t + 4g + u
        sc = _byte(W, base, 192 + 8 * (cc // 2) + 2 * (cc % 2) + 4 * g + hv)
        sc = tl.where(sc >= 128, sc - 256, sc)
        a = _f16(W, base + 104) * sc.to(tl.float32)
        cm = a
    else:
        a = _f16(W, base)
        if QT == 3 or QT == 7:  # noqa: SIM108 (constexpr branch)
            cm = _f16(W, base + 1)
        else:
            cm = a
    return a, cm


@triton.jit
def field_q(wq, wh, qh, c, j, f: tl.constexpr, QT: tl.constexpr, CPB: tl.constexpr):
    """Code field ``f`` of every halfword as an exact float32, offset removed (``q - 8`` for Q4_0, ...)."""
    if QT == 8:  # two signed bytes: flip the sign bit so the byte reads q + 128
        v = ((wq ^ (0x80 << (8 * f))) & (0xFF << (8 * f))) | MAGIC
        s: tl.constexpr = 1.0 / (1 << (8 * f))
        q = tl.fma(v.to(tl.float32, bitcast=True), s, -(8388608.0 * s + 128.0))
    elif QT == 40 or QT == 41:  # sixteen sign bits: 2 * bit - 1 (2^24 + 1 is no float32: the bit first)
        v = (wq & (1 << f)) | MAGIC
        s1: tl.constexpr = 1.0 / (1 << f)
        q = tl.fma(tl.fma(v.to(tl.float32, bitcast=True), s1, -8388608.0 * s1), 2.0, -1.0)
    else:
        v = (wq & (0xF << (4 * f))) | MAGIC  # nibble f in place
        if QT == 6 or QT == 7:  # value 16 * (f % 2) + 2j + f // 2 takes bit 4 from qh
            bit = (qh >> (16 * (f % 2) + 2 * j + f // 2)) & 1
            v = v | (bit << (4 + 4 * f))
        elif QT == 13:  # qh byte i bit r: this field's byte parity f // 2, run 2 * chunk + f % 2
            bit = (wh >> (8 * (f // 2) + 2 * (c % CPB) + f % 2)) & 1
            v = v | (bit << (4 + 4 * f))
        elif QT == 14:  # qh byte i, 2 bits of row 4h + rr at 2 * rr; rr = t + 2 * (f % 2)
            two = (wh >> (8 * (f // 2) + 2 * (c % CPB % 2) + 4 * (f % 2))) & 3
            v = v | (two << (4 + 4 * f))
        off: tl.constexpr = 8.0 if QT == 2 else 16.0 if QT == 6 else 32.0 if QT == 14 else 0.0
        s2: tl.constexpr = 1.0 / (1 << (4 * f))
        q = tl.fma(v.to(tl.float32, bitcast=True), s2, -(8388608.0 * s2 + off))
    return q


@triton.jit
def value_pos(c, hv, j, f: tl.constexpr, QT: tl.constexpr, CPB: tl.constexpr, B: tl.constexpr):
    """Position within the step (input channel minus the step's first) of field ``f`` of every halfword."""
    cc = c % CPB
    if QT == 8:
        v = 16 * hv + 2 * j + f
    elif QT == 40 or QT == 41:
        v = 16 * j + f
    elif QT == 12 or QT == 13:
        v = 64 * cc + 32 * (f % 2) + 16 * hv + 2 * j + f // 2
    elif QT == 14:  # row 4h + t + 2 * (f % 2), value 16u + 2j + f // 2 of it
        v = 32 * (4 * (cc // 2) + cc % 2 + 2 * (f % 2)) + 16 * hv + 2 * j + f // 2
    else:
        v = 16 * (f % 2) + 2 * j + f // 2
    return (c // CPB) * B + v


@triton.jit
def weights(wq, wh, qh, a, cm, c, j, f: tl.constexpr, QT: tl.constexpr, CPB: tl.constexpr,
            HAS_MIN: tl.constexpr):
    """Float32 weights of field ``f``: ``A * q (+ C)``, bit-identical to the torch decoders without FMA."""
    q = field_q(wq, wh, qh, c, j, f, QT, CPB)
    if HAS_MIN:
        return a * q + cm
    return a * q
