"""Independent float64/numpy oracle for the AWQ layouts, written from specs/formats.md 2.5-2.7.

Deliberately plain: one field at a time, Python loops, small shapes only. Shares no code with qlinear.
GEMM words other than 4-bit hold their 32/b columns in natural order (qlinear's documented choice,
the one GPTQModel's pack_awq_cpu makes for 2 and 8 bits).
"""

from __future__ import annotations

import numpy as np

ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
FAST_TABLE = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27,
              4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31]


def unsigned(word: int, wbits: int) -> int:
    return int(word) % (1 << wbits)


def field(word: int, bits: int, slot: int, wbits: int = 32) -> int:
    """Field ``slot`` (bits ``b*slot .. b*slot+b-1``) of a signed word."""
    return (unsigned(word, wbits) >> (bits * slot)) & ((1 << bits) - 1)


def gemm_order(bits: int) -> list[int]:
    return ORDER if bits == 4 else list(range(32 // bits))


def gemm_unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """GEMM words ``[R, C]`` -> values ``[R, C*pf]``: slot i of packed column c is logical column pf*c + order[i]."""
    pf, order = 32 // bits, gemm_order(bits)
    rows, cols = words.shape
    out = np.zeros((rows, cols * pf), dtype=np.int64)
    for r in range(rows):
        for c in range(cols):
            for i in range(pf):
                out[r, pf * c + order[i]] = field(words[r, c], bits, i)
    return out


def gemm_pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Values ``[R, N]`` -> GEMM words ``[R, N/pf]`` (signed int32)."""
    pf, order = 32 // bits, gemm_order(bits)
    rows, n = values.shape
    out = np.zeros((rows, n // pf), dtype=np.int64)
    for r in range(rows):
        for c in range(n // pf):
            word = 0
            for i in range(pf):
                word |= int(values[r, pf * c + order[i]]) << (bits * i)
            out[r, c] = word - (1 << 32) if word >= 1 << 31 else word
    return out.astype(np.int32)


def sequential_unpack(words: np.ndarray, count: int) -> np.ndarray:
    """GEMV words ``[R, C]`` (sequential nibbles) -> ``[R, count]``: nibble i of word c is value 8c + i."""
    out = np.zeros((words.shape[0], count), dtype=np.int64)
    for r in range(words.shape[0]):
        for j in range(count):
            out[r, j] = field(words[r, j // 8], 4, j % 8)
    return out


def fast_unpack(qweight: np.ndarray, n: int) -> np.ndarray:
    """GEMV_FAST int16 ``qweight [N/4, K]`` -> codes ``[N, K]`` (undo the interleave, then the 4x8 transpose)."""
    k = qweight.shape[1]
    permuted = np.zeros((n, k), dtype=np.int64)
    for r in range(n // 4):
        for t in range(k // 64):
            for m in range(64):
                for s in range(4):
                    f = 4 * m + s
                    permuted[4 * r + f // 64, 64 * t + f % 64] = field(qweight[r, 64 * t + m], 4, s, wbits=16)
    codes = np.zeros((n, k), dtype=np.int64)
    for block in range(k // 32):
        for p in range(32):
            codes[:, 32 * block + FAST_TABLE[p]] = permuted[:, 32 * block + p]
    return codes


def zeros_width(k: int, gs: int) -> int:
    groups = -(-k // gs)
    base = -(-groups // 8)
    mult = 1 if gs >= 128 else {64: 2, 32: 4}[gs]
    return -(-base // mult) * mult


def dequantize(fmt: str, t: dict[str, np.ndarray], bits: int, k: int, n: int, gs: int) -> np.ndarray:
    """Float64 weight ``[N, K]`` as the format's kernels define it (gemv_fast: ``q*s + zbuf``)."""
    groups = -(-k // gs)
    g_of = [kk // gs for kk in range(k)]
    w = np.zeros((n, k), dtype=np.float64)
    if fmt == "gemm":
        q = gemm_unpack(t["qweight"], bits)  # [K, N]
        z = gemm_unpack(t["qzeros"], bits)  # [G, N]
        s = t["scales"].astype(np.float64)  # [G, N]
        for kk in range(k):
            w[:, kk] = s[g_of[kk]] * (q[kk] - z[g_of[kk]])
    elif fmt == "gemv":
        q = sequential_unpack(t["qweight"], k)  # [N, K]
        z = sequential_unpack(t["qzeros"], groups)  # [N, G]
        s = t["scales"].astype(np.float64)  # [N, 8*zw]
        for kk in range(k):
            w[:, kk] = s[:, g_of[kk]] * (q[:, kk] - z[:, g_of[kk]])
    else:
        q = fast_unpack(t["qweight"], n)
        zbuf = t["qzeros" if fmt == "gemv_fast" else "scaled_zeros"].astype(np.float64)  # [8*zw, N]
        s = t["scales"].astype(np.float64)
        for kk in range(k):
            w[:, kk] = q[:, kk] * s[g_of[kk]] + zbuf[g_of[kk]]
    return w
