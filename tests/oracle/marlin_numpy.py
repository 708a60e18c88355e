"""Independent numpy oracle for Marlin's layout, written from specs/formats.md 2.8 (the "legacy procedure").

Weights: cut ``[K, N]`` into 16x16 blocks, lay them out as ``[K/16, N/16, 16, 16]`` and flatten each block
row to ``16N`` values; permute every 1024 consecutive values with the classic table (for lane ``i``: rows
``r, r+1, r+8, r+9`` (``r = 2(i mod 4)``) at column ``i // 4``, then the same rows at column ``i // 4 + 8``,
repeated for the 4 blocks of the chunk at offsets ``256 j``; then every 8 (4-bit) or 4 (8-bit) entries
interleaved with ``[0,2,4,6,1,3,5,7]`` / ``[0,2,1,3]``); pack consecutive values into int32 words, low field
first. Scales, zero points and bias from the same section's tables, as Python lists. Python loops, small
shapes; shares no code with qlinear.
"""

from __future__ import annotations

import numpy as np

INTERLEAVE = {4: [0, 2, 4, 6, 1, 3, 5, 7], 8: [0, 2, 1, 3]}


def weight_table(bits: int) -> list[int]:
    """The classic 1024-entry permutation of one chunk (four 16x16 blocks, each row-major)."""
    table = []
    for i in range(32):
        lane = []
        r, col = 2 * (i % 4), i // 4
        for block in (0, 1):
            for row in (r, r + 1, r + 8, r + 9):
                lane.append(16 * row + col + 8 * block)
        for j in range(4):
            table.extend(p + 256 * j for p in lane)
    inter = INTERLEAVE[bits]
    out = []
    for start in range(0, 1024, len(inter)):
        out.extend(table[start + e] for e in inter)
    return out


def pack_fields(values: list[int], bits: int) -> list[int]:
    """Consecutive values into signed int32 words, value ``f`` of a word at bits ``[b f, b f + b)``."""
    per = 32 // bits
    words = []
    for start in range(0, len(values), per):
        w = 0
        for f, v in enumerate(values[start:start + per]):
            assert 0 <= v < 1 << bits
            w |= int(v) << (bits * f)
        words.append(w - (1 << 32) if w >= 1 << 31 else w)
    return words


def unpack_fields(words: list[int], bits: int) -> list[int]:
    out = []
    for w in words:
        u = int(w) % (1 << 32)
        out.extend((u >> (bits * f)) & ((1 << bits) - 1) for f in range(32 // bits))
    return out


def marlin_weight(codes_kn: np.ndarray, bits: int, perm: list[int] | None = None) -> np.ndarray:
    """Codes ``[K, N]`` -> Marlin ``[K/16, N*16*b/32]`` int32 by the legacy procedure; row k is ``perm[k]``."""
    k, n = codes_kn.shape
    assert k % 16 == 0 and n % 64 == 0
    if perm is not None:
        codes_kn = codes_kn[list(perm)]
    blocks = codes_kn.reshape(k // 16, 16, n // 16, 16).transpose(0, 2, 1, 3).reshape(k // 16, 16 * n)
    table = weight_table(bits)
    out = []
    for row in blocks:
        shuffled = []
        for start in range(0, 16 * n, 1024):
            chunk = row[start:start + 1024]
            shuffled.extend(int(chunk[t]) for t in table)
        out.append(pack_fields(shuffled, bits))
    return np.array(out, dtype=np.int32)


def gptq_codes(qweight: np.ndarray, bits: int) -> np.ndarray:
    """GPTQ ``[K*b/32, N]`` -> codes ``[K, N]`` (field j of word r is row ``r*32/b + j``)."""
    per = 32 // bits
    out = np.zeros((qweight.shape[0] * per, qweight.shape[1]), dtype=np.int64)
    for col in range(qweight.shape[1]):
        out[:, col] = unpack_fields(list(qweight[:, col]), bits)
    return out


def awq_values(words: np.ndarray, bits: int) -> np.ndarray:
    """AWQ ``[R, N*b/32]`` -> logical ``[R, N]``. 4-bit: logical column j sits in nibble ``[0,4,1,5,2,6,3,7][j]``
    (formats.md 2.5/2.8), i.e. field i holds column ``[0,2,4,6,1,3,5,7][i]``; 8-bit: the repack kernels read
    field i as column ``[0,2,1,3][i]``. Both happen to equal ``INTERLEAVE``."""
    per = 32 // bits
    out = np.zeros((words.shape[0], words.shape[1] * per), dtype=np.int64)
    for r in range(words.shape[0]):
        fields = unpack_fields(list(words[r]), bits)
        for c in range(words.shape[1]):
            for i in range(per):
                out[r, c * per + INTERLEAVE[bits][i]] = fields[c * per + i]
    return out


def scale_table(grouped: bool) -> list[int]:
    """new[8i + j] = old[i + 8j] per 64 (grouped); new[8i + e] = old[2i + (0,1,8,9,16,17,24,25)[e]] per 32."""
    if grouped:
        return [i + 8 * j for i in range(8) for j in range(8)]
    return [2 * i + e for i in range(4) for e in (0, 1, 8, 9, 16, 17, 24, 25)]


def permute_rows(values: np.ndarray, table: list[int]) -> np.ndarray:
    flat = values.reshape(-1)
    out = np.empty_like(flat)
    for start in range(0, flat.size, len(table)):
        for new, old in enumerate(table):
            out[start + new] = flat[start + old]
    return out.reshape(values.shape)


def marlin_scales(scales_gn: np.ndarray) -> np.ndarray:
    """Scales ``[G, N]``: the 64-block rule when ``G > 1``, else the 32-block rule."""
    return permute_rows(scales_gn, scale_table(scales_gn.shape[0] > 1))


def marlin_bias(bias: np.ndarray) -> np.ndarray:
    return permute_rows(bias, scale_table(False))


def marlin_zeros(zeros_gn: np.ndarray, bits: int) -> np.ndarray:
    """True zeros ``[G, N]`` -> ``[G, N*b/32]``: 64-block rule, interleave, consecutive fields per word."""
    z = permute_rows(zeros_gn, scale_table(True))
    z = permute_rows(z, INTERLEAVE[bits])
    return np.array([pack_fields([int(v) for v in row], bits) for row in z], dtype=np.int32)


def dequantize(codes_kn: np.ndarray, scales_gn: np.ndarray, zeros_gn: np.ndarray, g_idx: list[int]) -> np.ndarray:
    """float64 ``w[k, n] = s[g_idx[k], n] * (q[k, n] - z[g_idx[k], n])``."""
    g = np.asarray(g_idx)
    return scales_gn.astype(np.float64)[g] * (codes_kn.astype(np.float64) - zeros_gn.astype(np.float64)[g])
