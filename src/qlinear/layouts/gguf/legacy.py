"""GGML's 32-value legacy blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (decode in torch, encode in numpy).

Layouts (bytes in order): Q4_0 ``d f16, qs[16]``; Q4_1 ``d, m, qs[16]``; Q5_0 ``d, qh u32, qs[16]``;
Q5_1 ``d, m, qh u32, qs[16]``; Q8_0 ``d, qs int8[32]``. Byte ``j`` of ``qs`` holds value ``j`` in its low
nibble and value ``j + 16`` in its high nibble; bit ``j`` of ``qh`` is bit 4 of value ``j``. The encoders are
``quantize_row_q*_ref`` of ggml-quants.c, operation for operation.
"""

from __future__ import annotations

import numpy as np
import torch

from .blocks import F32, f16_bytes, f16_field, first_absmax, lsb_bits, nibbles, round_away, running_min_max


# ---------------------------------------------------------------------------------------------- decode
def _codes4(blocks: torch.Tensor, at: int) -> torch.Tensor:
    return nibbles(blocks[:, at:at + 16]).reshape(-1, 32)


def _codes5(blocks: torch.Tensor, qh_at: int) -> torch.Tensor:
    high = lsb_bits(blocks[:, qh_at:qh_at + 4]) << 4
    return _codes4(blocks, qh_at + 4) | high


def decode_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    return d * (_codes4(blocks, 2).to(torch.int8) - 8).to(torch.float32)


def decode_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    return d * _codes4(blocks, 4).to(torch.float32) + m


def decode_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    return d * (_codes5(blocks, 2).to(torch.int8) - 16).to(torch.float32)


def decode_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m = f16_field(blocks, 0), f16_field(blocks, 2)
    return d * _codes5(blocks, 4).to(torch.float32) + m


def decode_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    return blocks[:, 2:34].contiguous().view(torch.int8).to(torch.float32) * d


# ---------------------------------------------------------------------------------------------- encode
def _inverse(d: np.ndarray) -> np.ndarray:
    """``id = d ? 1.0f/d : 0.0f``."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1) / d, F32(0)).astype(F32)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    q = q.astype(np.uint8)
    return (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)


def _pack_qh(q: np.ndarray) -> np.ndarray:
    bits = ((q.astype(np.uint32) >> 4) & 1) << np.arange(32, dtype=np.uint32)
    return bits.sum(axis=1, dtype=np.uint32).astype("<u4").view(np.uint8).reshape(-1, 4)


def _symmetric(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 / Q5_0: ``d = max / -levels``, ``q = MIN(2*levels - 1, (int8_t)(x*id + levels + 0.5))``."""
    _, mx = first_absmax(x)
    d = (mx / F32(-levels)).astype(F32)
    q = np.trunc(x * _inverse(d)[:, None] + F32(levels + 0.5)).astype(np.int32)
    return d, np.minimum(q, 2 * levels - 1)


def _affine(x: np.ndarray, nmax: int, clamp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_1 / Q5_1: ``d = (max - min) / nmax``, ``q = (int)((x - min)*id + 0.5)`` (Q4_1 clamps to 15)."""
    mn, mx = running_min_max(x)
    d = ((mx - mn) / F32(nmax)).astype(F32)
    q = np.trunc((x - mn[:, None]) * _inverse(d)[:, None] + F32(0.5)).astype(np.int32)
    return d, mn, (np.minimum(q, nmax) if clamp else q & 0xFF)


def encode_q4_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 8)
    return np.concatenate([f16_bytes(d), _pack_nibbles(q)], axis=1)


def encode_q4_1(x: np.ndarray) -> np.ndarray:
    d, mn, q = _affine(x, 15, clamp=True)
    return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_nibbles(q)], axis=1)


def encode_q5_0(x: np.ndarray) -> np.ndarray:
    d, q = _symmetric(x, 16)
    return np.concatenate([f16_bytes(d), _pack_qh(q), _pack_nibbles(q)], axis=1)


def encode_q5_1(x: np.ndarray) -> np.ndarray:
    d, mn, q = _affine(x, 31, clamp=False)
    return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_qh(q), _pack_nibbles(q)], axis=1)


def encode_q8_0(x: np.ndarray) -> np.ndarray:
    amax = np.abs(x).max(axis=1)
    d = (amax / F32(127)).astype(F32)
    q = round_away(x * _inverse(d)[:, None]).astype(np.int8)
    return np.concatenate([f16_bytes(d), q.view(np.uint8)], axis=1)
