"""Independent numpy/float64 oracle for the QQQ layout and arithmetic, written from specs/formats.md 2.9 (and 2.8's
scale permutations). Deliberately plain: Python loops over words and lanes, small shapes only. Shares no code with
qlinear.

formats.md 2.9, as read here:

* ``B [K/16, 2N]`` int32. Codes ``[K, N]`` are cut into 16x16 tiles; row ``kt`` of B is the row of ``16 N`` values
  made of tiles ``(kt, 0), (kt, 1), ...`` one after another, each tile row-major (``16 k + n`` inside it).
* Every chunk of 1024 values (four tiles) is reordered: for lane ``i = 0..31``, for each of the 4 tiles ``t``
  (offset 256 each), the 8 values at rows ``4 (i mod 4) + 0..3`` of column ``i // 4``, then of column ``i // 4 + 8``;
  each such group of 8 is then interleaved ``[0,2,4,6,1,3,5,7]`` (grouped) or ``[4,0,5,1,6,2,7,3]`` (per-channel):
  position ``p`` of the group takes value ``interleave[p]``. 8 consecutive values make one int32, nibble ``l`` (bits
  ``4l .. 4l+3``) holding the ``l``-th.
* Grouped: the nibble is ``q = code + 8`` (``clamp(round(w / s_g) + 8, 0, 15)``); per-channel: the code's low nibble
  (two's complement).
* ``s_group [K/gs, N]`` float16: each row in blocks of 64, ``new[8i + j] = old[i + 8j]``; ``s_channel [1, N]``
  float32: blocks of 32, ``new[8i + e] = old[2i + (0,1,8,9,16,17,24,25)[e]]``.
* Activations: per row ``scale = max|x| / 127``, ``round``, ``clamp(-128, 127)``; int8 x int8 sums in int32, scaled
  by the row's scale and ``s_channel``. The int8 weight: grouped ``clamp(round(code * s_group), -128, 127)``,
  per-channel ``16 * code`` (the kernel reads the nibble as the high half of a byte).
"""

from __future__ import annotations

import numpy as np

GROUPED = (0, 2, 4, 6, 1, 3, 5, 7)
CHANNEL = (4, 0, 5, 1, 6, 2, 7, 3)
SINGLE = (0, 1, 8, 9, 16, 17, 24, 25)


def chunk_order(grouped: bool) -> list[int]:
    """Position p of a packed chunk -> index (``256 t + 16 row + col``) of the value it takes."""
    order = []
    for i in range(32):
        for t in range(4):
            rows = range(4 * (i % 4), 4 * (i % 4) + 4)
            group = [256 * t + 16 * row + col for col in (i // 4, i // 4 + 8) for row in rows]
            order += [group[x] for x in (GROUPED if grouped else CHANNEL)]
    return order


def tile_rows(nibbles: np.ndarray) -> np.ndarray:
    """``[K, N]`` -> ``[K/16, 16 N]``: each B row's values before the reordering."""
    k, n = nibbles.shape
    out = np.zeros((k // 16, 16 * n), dtype=np.int64)
    for kt in range(k // 16):
        for nt in range(n // 16):
            for r in range(16):
                for c in range(16):
                    out[kt, 256 * nt + 16 * r + c] = nibbles[16 * kt + r, 16 * nt + c]
    return out


def pack_b(codes_nk: np.ndarray, grouped: bool) -> np.ndarray:
    """Signed codes ``[N, K]`` (-8..7) -> ``B [K/16, 2N]`` int32."""
    nib = (codes_nk.T.astype(np.int64) + 8) if grouped else (codes_nk.T.astype(np.int64) & 0xF)
    rows = tile_rows(nib)
    order = chunk_order(grouped)
    kt_n, width = rows.shape
    b = np.zeros((kt_n, width // 8), dtype=np.int64)
    for kt in range(kt_n):
        stream = []
        for c0 in range(0, width, 1024):
            stream += [int(rows[kt, c0 + o]) for o in order]
        for w in range(width // 8):
            word = 0
            for lane in range(8):
                word |= stream[8 * w + lane] << (4 * lane)
            b[kt, w] = word - (1 << 32) if word >= 1 << 31 else word
    return b.astype(np.int32)


def unpack_b(b: np.ndarray, grouped: bool) -> np.ndarray:
    """``B [K/16, 2N]`` -> signed codes ``[N, K]``."""
    kt_n, words = b.shape
    k, n = 16 * kt_n, words // 2
    order = chunk_order(grouped)
    nib = np.zeros((k, n), dtype=np.int64)
    for kt in range(kt_n):
        stream = [(int(b[kt, w]) % (1 << 32) >> (4 * lane)) & 0xF for w in range(words) for lane in range(8)]
        row = [0] * (16 * n)
        for c0 in range(0, 16 * n, 1024):
            for p, o in enumerate(order):
                row[c0 + o] = stream[c0 + p]
        for nt in range(n // 16):
            for r in range(16):
                for c in range(16):
                    nib[16 * kt + r, 16 * nt + c] = row[256 * nt + 16 * r + c]
    codes = (nib - 8) if grouped else np.where(nib >= 8, nib - 16, nib)
    return codes.T


def permute_group_scales(s: np.ndarray) -> np.ndarray:
    """``[G, N]`` -> stored order (64-blocks)."""
    out = np.empty_like(s)
    for g in range(s.shape[0]):
        for b0 in range(0, s.shape[1], 64):
            for i in range(8):
                for j in range(8):
                    out[g, b0 + 8 * i + j] = s[g, b0 + i + 8 * j]
    return out


def permute_channel_scales(s: np.ndarray) -> np.ndarray:
    """``[N]`` -> stored order ``[1, N]`` (32-blocks)."""
    out = np.empty_like(s)
    for b0 in range(0, s.shape[0], 32):
        for i in range(4):
            for e in range(8):
                out[b0 + 8 * i + e] = s[b0 + 2 * i + SINGLE[e]]
    return out.reshape(1, -1)


def int8_weight(codes_nk: np.ndarray, group_scales_ng: np.ndarray | None, group_size: int) -> np.ndarray:
    """The int8 weight ``[N, K]`` (float64 products are exact; ``np.rint`` rounds half to even)."""
    if group_scales_ng is None:
        return 16 * codes_nk.astype(np.int64)
    s = np.repeat(group_scales_ng.astype(np.float64), group_size, axis=1)
    return np.clip(np.rint(codes_nk.astype(np.float64) * s), -128, 127).astype(np.int64)


def bf16_round(v: np.ndarray) -> np.ndarray:
    """float32 -> the nearest-even bfloat16 value (as float32)."""
    bits = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def to_dtype(v: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to nearest even in ``dtype`` ("float16" / "bfloat16"), as float64."""
    v = np.asarray(v, dtype=np.float32)
    return (v.astype(np.float16) if dtype == "float16" else bf16_round(v)).astype(np.float64)


def quantize_rows(x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8 codes and scales: ``s = dtype(float32(max|x|) / 127)``, ``q = clamp(rint(x / s))`` in float32."""
    x32 = x.astype(np.float32)
    s = to_dtype(np.abs(x32).max(axis=1) / np.float32(127.0), dtype).astype(np.float32)
    safe = np.where(s == 0, np.float32(1.0), s)
    q = np.clip(np.rint(x32 / safe[:, None]), -128, 127).astype(np.int64)
    return q, s.astype(np.float64)


def forward(x: np.ndarray, w8: np.ndarray, s_channel: np.ndarray, dtype: str,
            bias: np.ndarray | None = None) -> np.ndarray:
    """``y`` in float64: exact integer sums times the row and channel scales (one final rounding to ``dtype``),
    then the bias added in ``dtype``."""
    q, s = quantize_rows(x, dtype)
    acc = q @ w8.T  # int64, exact
    y = to_dtype(acc * s[:, None] * s_channel[None, :].astype(np.float64), dtype)
    if bias is not None:
        y = to_dtype(y + to_dtype(bias, dtype)[None, :], dtype)
    return y
