"""Independent float64/numpy oracle for float-quantized weights and compressed-tensors' integer packing.

Written from the format definitions (OCP FP8 / MX specs, compressed-tensors' documented layouts), one
value at a time; shares no code with qlinear.
"""

from __future__ import annotations

import math

import numpy as np


def fp8_value(code: int, kind: str) -> float:
    """E4M3 (``e4m3fn``: bias 7, S.1111.111 = NaN, no inf) or E5M2 (bias 15, IEEE specials) from a byte."""
    sign = -1.0 if code & 0x80 else 1.0
    if kind == "e4m3":
        e, m = (code >> 3) & 0xF, code & 0x7
        if e == 0xF and m == 0x7:
            return math.nan
        return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    e, m = (code >> 2) & 0x1F, code & 0x3
    if e == 0x1F:
        return math.nan if m else sign * math.inf
    return sign * (m / 4 * 2.0 ** -14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15))


def fp4_value(code: int) -> float:
    """E2M1: sign bit 3, then exponent (2 bits, bias 1) and one mantissa bit."""
    sign = -1.0 if code & 0x8 else 1.0
    e, m = (code >> 1) & 0x3, code & 0x1
    return sign * (m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1))


def e8m0_value(code: int) -> float:
    return math.nan if int(code) == 255 else 2.0 ** (int(code) - 127)


def dequant_fp8(weight_bytes: np.ndarray, kind: str, scale: np.ndarray, block: tuple[int, int],
                divide: bool = False) -> np.ndarray:
    """``value * scale[n // bn, k // bk]`` (or ``/`` for GPTQModel's inverse scales), float64."""
    n, k = weight_bytes.shape
    out = np.empty((n, k))
    for i in range(n):
        for j in range(k):
            v = fp8_value(int(weight_bytes[i, j]), kind)
            s = float(scale[i // block[0], j // block[1]])
            out[i, j] = v / s if divide else v * s
    return out


def dequant_fp4(packed: np.ndarray, scale_values: np.ndarray, block: int, global_div: float = 1.0) -> np.ndarray:
    """NVFP4/MXFP4 bytes ``[N, K/2]`` (low nibble = even column) with decoded block scales, float64."""
    n, half = packed.shape
    out = np.empty((n, 2 * half))
    for i in range(n):
        for j in range(half):
            byte = int(packed[i, j])
            for t, code in enumerate((byte & 0xF, byte >> 4)):
                col = 2 * j + t
                out[i, col] = fp4_value(code) * (float(scale_values[i, col // block]) / global_div)
    return out


def ct_unpack(words: np.ndarray, bits: int, count: int, legacy: bool = False) -> np.ndarray:
    """compressed-tensors ``unpack_from_int32`` along the last axis, signed values ``stored - 2**(b-1)``.

    Dense (>= 0.18): value i at stream bits [b*i, b*i + b) (bit t in word t // 32). Legacy (< 0.18): word
    r holds values r*(32//b) + j at bit offset j*b.
    """
    rows = words.shape[0]
    out = np.zeros((rows, count), dtype=np.int64)
    per = 32 // bits
    for r in range(rows):
        u = [int(w) % (1 << 32) for w in words[r]]
        for i in range(count):
            if legacy:
                v = (u[i // per] >> ((i % per) * bits)) & ((1 << bits) - 1)
            else:
                v = 0
                for m in range(bits):
                    t = bits * i + m
                    v |= ((u[t // 32] >> (t % 32)) & 1) << m
            out[r, i] = v - (1 << (bits - 1))
    return out
