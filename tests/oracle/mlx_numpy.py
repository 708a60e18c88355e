"""Independent numpy oracle for MLX affine weights (shares no code with ``src``): the codes as one little-endian
bit stream per row, read bit by bit, and the weight ``scales * q + biases`` in float64 (no rounding)."""

from __future__ import annotations

import numpy as np


def unpack_stream(words: np.ndarray, bits: int, in_features: int) -> np.ndarray:
    """uint32 words ``[N, W]`` -> codes ``[N, in_features]`` (int64): bit ``j`` of the row's stream is bit ``j % 32``
    of word ``j // 32``; code ``k`` is stream bits ``k*bits .. k*bits + bits - 1``, least significant first."""
    w = np.ascontiguousarray(words.astype("<u4"))
    stream = np.unpackbits(w.view(np.uint8).reshape(w.shape[0], -1), axis=1, bitorder="little")
    fields = stream[:, : in_features * bits].reshape(w.shape[0], in_features, bits).astype(np.int64)
    return (fields << np.arange(bits, dtype=np.int64)).sum(axis=-1)


def weight64(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int) -> np.ndarray:
    """The exact real weight ``s * q + b`` per group, in float64."""
    s = np.repeat(scales.astype(np.float64), group_size, axis=1)
    b = np.repeat(biases.astype(np.float64), group_size, axis=1)
    return s * codes.astype(np.float64) + b
