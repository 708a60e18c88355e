"""Float64 numpy reference for GPTQ's round-to-nearest grid, written from formats.md 2.1 (no qlinear code)."""

from __future__ import annotations

import numpy as np


def rtn_group(block: np.ndarray, bits: int, sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scale, zero and codes for one group ``block`` [rows, cols] (float64 rows are output channels)."""
    maxq = 2**bits - 1
    lo = np.minimum(block.min(axis=1), 0.0)
    hi = np.maximum(block.max(axis=1), 0.0)
    if sym:
        amax = np.maximum(np.abs(lo), hi)
        lo, hi = -amax, amax
    empty = (lo == 0) & (hi == 0)
    lo = np.where(empty, -1.0, lo)
    hi = np.where(empty, 1.0, hi)
    scale = (hi - lo) / maxq
    zero = np.full_like(scale, (maxq + 1) // 2) if sym else np.round(-lo / scale)
    codes = np.clip(np.round(block / scale[:, None]) + zero[:, None], 0, maxq)
    return scale, zero, codes


def dequantize(codes: np.ndarray, scales: np.ndarray, zeros: np.ndarray, g_idx: np.ndarray) -> np.ndarray:
    """``w[n, k] = scales[n, g_idx[k]] * (codes[n, k] - zeros[n, g_idx[k]])`` in float64."""
    out = np.empty(codes.shape, dtype=np.float64)
    for k in range(codes.shape[1]):
        g = int(g_idx[k])
        out[:, k] = scales[:, g].astype(np.float64) * (codes[:, k].astype(np.float64) - zeros[:, g])
    return out
