"""Small helpers shared by the GGML block codecs: reading block fields in torch, ggml's rounding in numpy.

Decoders take ``uint8 [nb, T]`` torch tensors (any device) and return ``float32 [nb, B]``, so a row tile of
a ``[N, nb_row * T]`` weight decodes straight into ``W [rows, K]`` with no copy. (A value-major variant,
``[T, nb] -> [B, nb]`` with long contiguous rows, was measured no faster on CPU: the byte transposition it
needs costs what the longer rows save.) Encoders take ``float32 [nb, B]`` numpy arrays and return
``uint8 [nb, T]``; every float32 operation of an encoder follows ggml's C order (sums element by element,
no fused multiply-add), so the bytes match ggml's.
"""

from __future__ import annotations

import numpy as np
import torch

F32 = np.float32


# ---------------------------------------------------------------------------------------------- torch (decode)
def f16_field(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The little-endian float16 at (even) byte ``at`` of every block, as float32 ``[nb, 1]``."""
    if blocks.is_contiguous() and blocks.storage_offset() % 2 == 0:
        return blocks.view(torch.float16)[:, at // 2:at // 2 + 1].to(torch.float32)
    return blocks[:, at:at + 2].contiguous().view(torch.float16).to(torch.float32)


def f16_field_bytes(v: torch.Tensor) -> torch.Tensor:
    """``f16_field`` undone: values (float16-representable, any float dtype) -> ``uint8 [numel, 2]``, little-endian."""
    return v.to(torch.float16).reshape(-1).contiguous().view(torch.uint8).reshape(-1, 2)


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` bytes -> ``[..., 2, n]`` (low nibbles, then high nibbles), uint8."""
    return torch.stack((qs & 0x0F, qs >> 4), dim=-2)


def bit_planes(b: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """``[..., n]`` bytes -> ``[..., count, n]``: field ``i`` is ``(b >> width*i) & mask`` (uint8)."""
    mask = (1 << width) - 1
    return torch.stack([(b >> (width * i)) & mask for i in range(count)], dim=-2)


def lsb_bits(b: torch.Tensor) -> torch.Tensor:
    """``[..., n]`` bytes -> ``[..., 8n]`` bits, least significant bit of each byte first (uint8 0/1)."""
    return bit_planes(b, 1, 8).transpose(-1, -2).reshape(*b.shape[:-1], b.shape[-1] * 8)


# ---------------------------------------------------------------------------------------------- numpy (encode)
def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: add 1.5 * 2**23 in float32 and read the mantissa (round half to even for
    ``|v| <= 2**22``; the same bits as C for any input)."""
    val = (np.asarray(v, dtype=F32) + F32(12582912.0)).astype(F32)
    return (val.view(np.int32) & 0x007FFFFF) - 0x00400000


def round_away(v: np.ndarray) -> np.ndarray:
    """C's ``roundf``: halves away from zero (``a - trunc(a)`` is exact, so no double rounding)."""
    a = np.abs(v)
    t = np.trunc(a)
    return np.copysign(t + (a - t >= F32(0.5)), v)


def seq_sum(terms: np.ndarray) -> np.ndarray:
    """``float s = 0; for i: s += terms[i]`` along the last axis, in float32, in C's order."""
    acc = np.zeros(terms.shape[:-1], dtype=F32)
    for i in range(terms.shape[-1]):
        acc = acc + terms[..., i]
    return acc


def running_max(a: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """``m = start (0); for i: if (a[i] > m) m = a[i]`` along the last axis (keeps ggml's tie and zero-sign rule)."""
    m = np.zeros(a.shape[:-1], dtype=F32) if start is None else start
    for i in range(a.shape[-1]):
        m = np.where(a[..., i] > m, a[..., i], m)
    return m


def running_min_max(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``min = max = x[0]; for i: if (x[i] < min) ...; if (x[i] > max) ...`` along the last axis."""
    mn, mx = x[..., 0].copy(), x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        mn = np.where(x[..., i] < mn, x[..., i], mn)
        mx = np.where(x[..., i] > mx, x[..., i], mx)
    return mn, mx


def first_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``amax = 0, max = 0; for i: if (fabsf(x[i]) > amax) {amax = |x[i]|; max = x[i]}``: (amax, max)."""
    ax = np.abs(x)
    idx = ax.argmax(axis=-1)[..., None]
    amax = np.take_along_axis(ax, idx, axis=-1)[..., 0]
    mx = np.where(amax > 0, np.take_along_axis(x, idx, axis=-1)[..., 0], F32(0))
    return amax, mx


def f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 ``[nb]`` -> ``[nb, 2]`` little-endian float16 bytes (round to nearest even, as ggml)."""
    return np.ascontiguousarray(np.asarray(v, dtype=F32).astype("<f2")).view(np.uint8).reshape(-1, 2)


def f16_round(v: np.ndarray) -> np.ndarray:
    """``GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v))``."""
    return np.asarray(v, dtype=F32).astype(np.float16).astype(F32)
