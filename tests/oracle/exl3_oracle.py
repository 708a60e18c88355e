"""A slow EXL3 decoder in plain Python (shares no code with ``src/``), from the format's facts:

- a tile's ``16*bits`` int16 words form one bitstream once each pair of words is swapped (32-bit little-endian
  words streamed high half first), most significant bit first; the state of position ``t`` is the 16 bits ending
  with symbol ``t`` (``bits`` bits each), the stream taken cyclically;
- stream position ``t``: lane ``t // 8``, item ``t % 8``; row ``2 (lane % 4) + [0, 1, 8, 9][item % 4]``, column
  ``lane // 4 + (8 if item >= 4 else 0)`` (exllamav3's ``tensor_core_perm``);
- codebooks (exllamav3's ``codebook.cuh``): 3inst ``x = s * 89226354 + 64248484``, mcg ``x = s * 0xCBAC1FED``, then
  ``(x & 0x8FFF8FFF) ^ 0x3B603B60`` read as two float16 halves added and rounded once to float16; mul1
  ``x = s * 0x83DCD12D``, ``fp16(0x6400 + bytesum(x)) * fp16(0x1EEE) + fp16(0xC931)`` rounded once;
- ``W = H(diag(suh) H(inner)) diag(svh)`` with the orthonormal 128-point Sylvester-Hadamard matrix.
"""

from __future__ import annotations

import math
import struct

import torch


def f16(bits: int) -> float:
    return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]


def round16(v: float) -> float:
    return struct.unpack("<e", struct.pack("<e", v))[0]


def codebook(state: int, cb: str) -> float:
    if cb == "mul1":
        x = (state * 0x83DCD12D) & 0xFFFFFFFF
        total = sum((x >> s) & 255 for s in (0, 8, 16, 24))
        return round16(f16(0x6400 + total) * f16(0x1EEE) + f16(0xC931))
    x = (state * 89226354 + 64248484) if cb == "3inst" else state * 0xCBAC1FED
    x = ((x & 0xFFFFFFFF) & 0x8FFF8FFF) ^ 0x3B603B60
    return round16(f16(x) + f16(x >> 16))


def states(words: list[int], bits: int) -> list[int]:
    """The 256 states (stream order) of one tile's int16 words."""
    swapped = [words[j ^ 1] & 0xFFFF for j in range(len(words))]
    stream = 0
    for w in swapped:
        stream = (stream << 16) | w
    total = 16 * len(words)
    out = []
    for t in range(256):
        end = (t + 1) * bits  # bits [end - 16, end) of the cyclic stream
        s = 0
        for b in range(end - 16, end):
            s = (s << 1) | ((stream >> (total - 1 - (b % total))) & 1)
        out.append(s)
    return out


def position(t: int) -> tuple[int, int]:
    lane, item = divmod(t, 8)
    return 2 * (lane % 4) + [0, 1, 8, 9][item % 4], lane // 4 + (8 if item >= 4 else 0)


def inner(trellis: torch.Tensor, bits: int, cb: str) -> torch.Tensor:
    """float64 ``[K, N]`` inner weight (values exactly the float16 ones)."""
    kt, nt, _ = trellis.shape
    out = torch.empty(kt * 16, nt * 16, dtype=torch.float64)
    table: dict[int, float] = {}
    for i in range(kt):
        for j in range(nt):
            for t, s in enumerate(states(trellis[i, j].tolist(), bits)):
                if s not in table:
                    table[s] = codebook(s, cb)
                r, c = position(t)
                out[16 * i + r, 16 * j + c] = table[s]
    return out


def hadamard() -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 128:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h / math.sqrt(128)


def signs(packed: torch.Tensor) -> torch.Tensor:
    return torch.tensor([-1.0 if (int(w) >> i) & 1 else 1.0 for w in packed.tolist() for i in range(16)],
                        dtype=torch.float64)


def weight(trellis: torch.Tensor, bits: int, cb: str, suh: torch.Tensor, svh: torch.Tensor) -> torch.Tensor:
    """float64 ``[K, N]`` weight, ``y = x @ W``."""
    w = inner(trellis, bits, cb)
    h = hadamard()
    k, n = w.shape
    w = torch.block_diag(*[h] * (k // 128)) @ w * suh.double()[:, None]
    return w @ torch.block_diag(*[h] * (n // 128)) * svh.double()[None, :]
