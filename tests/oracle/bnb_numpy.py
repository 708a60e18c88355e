"""A numpy reference for bitsandbytes weights, written from the published tables and format description only.

Shares no code with ``src``. Sources: the NF4 table as QLoRA (Dettmers et al. 2023, appendix) and bitsandbytes
publish it (normal quantiles scaled to [-1, 1]); bitsandbytes' FP4 as its documentation describes it (1 sign bit,
then 3 bits whose patterns 000..111 stand for 0, 0.0625, 8, 12, 4, 6, 2, 3, everything divided by 12); the 4-bit
layout (two codes a byte, the first in the HIGH nibble, over the flattened row-major weight; one absmax per block
of consecutive values; a double-quantized absmax being ``map[q] * nested_absmax[j // nested_block] + offset``) and
LLM.int8 (``q * SCB / 127``, bitsandbytes multiplying by float32(1/127)).

Products are computed in float64, where a product of two float32 values is exact, then rounded as the producer
rounds (to float32, then to the weight's dtype), so the results are bit-exact references, not approximations.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

#: The published NF4 values (QLoRA appendix; bitsandbytes' get_4bit_type), as float32.
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)
#: bitsandbytes' FP4 magnitudes for the low three bits 000 .. 111, before normalising by the largest (12).
FP4_PATTERN = {0b000: 0.0, 0b001: 0.0625, 0b010: 8.0, 0b011: 12.0, 0b100: 4.0, 0b101: 6.0, 0b110: 2.0, 0b111: 3.0}


def fp4_table() -> np.ndarray:
    """The 16 FP4 values as float32: sign from bit 3, magnitude from the pattern table, divided by 12 in float32."""
    out = np.zeros(16, dtype=np.float32)
    for code in range(16):
        mag = np.float32(FP4_PATTERN[code & 0b111]) / np.float32(12.0)
        out[code] = -mag if code & 0b1000 and mag != 0 else mag
    return out


def table(quant_type: str) -> np.ndarray:
    return NF4.copy() if quant_type == "nf4" else fp4_table()


def nf4_from_quantiles(offset: float = 0.9677083) -> np.ndarray:
    """NF4 rebuilt from its definition (8 positive and 7 negative normal quantiles between ``offset`` and 0.5, plus
    0, scaled by the largest), in float64: a check that the published table is what the paper defines."""
    ppf = NormalDist().inv_cdf
    pos = [ppf(p) for p in np.linspace(offset, 0.5, 9)[:-1]]
    neg = [-ppf(p) for p in np.linspace(offset, 0.5, 8)[:-1]]
    v = np.sort(np.array([*pos, 0.0, *neg]))
    return v / v.max()


def unpack(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    """Bytes in order -> codes ``[n, k]``: byte j holds flat code 2j in its high nibble, 2j+1 in its low one."""
    b = np.asarray(packed, dtype=np.uint8).reshape(-1)
    flat = np.empty(2 * b.size, dtype=np.uint8)
    flat[0::2] = b >> 4
    flat[1::2] = b & 0x0F
    return flat[:n * k].reshape(n, k)


def pack(codes: np.ndarray, pad: int) -> np.ndarray:
    """Codes ``[n, k]`` -> bytes ``[(n*k + 1) // 2, 1]`` (an odd count padded with ``pad``)."""
    flat = np.asarray(codes, dtype=np.uint8).reshape(-1)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(pad))
    return ((flat[0::2] << 4) | flat[1::2]).astype(np.uint8).reshape(-1, 1)


def nested_absmax(q: np.ndarray, code: np.ndarray, absmax2: np.ndarray, block2: int, offset: float) -> np.ndarray:
    """Double-quantized absmax: ``float32(code[q] * absmax2[j // block2])``, then ``float32(. + offset)``."""
    j = np.arange(q.size)
    scaled = (code.astype(np.float64)[q.astype(np.int64)] * absmax2.astype(np.float64)[j // block2]).astype(np.float32)
    return (scaled.astype(np.float64) + np.float64(np.float32(offset))).astype(np.float32)


def dequantize_4bit(codes: np.ndarray, quant_type: str, absmax: np.ndarray, blocksize: int) -> np.ndarray:
    """The exact products ``table[code] * absmax[flat // blocksize]`` (float64, shape of ``codes``)."""
    flat = codes.reshape(-1).astype(np.int64)
    i = np.arange(flat.size)
    prod = table(quant_type).astype(np.float64)[flat] * absmax.astype(np.float32).astype(np.float64)[i // blocksize]
    return prod.reshape(codes.shape)


def dequantize_int8(q: np.ndarray, scb: np.ndarray) -> np.ndarray:
    """LLM.int8: ``float32(float32(q * SCB) * float32(1/127))`` (as float32)."""
    first = (q.astype(np.float64) * scb.astype(np.float32).astype(np.float64)[:, None]).astype(np.float32)
    return (first.astype(np.float64) * np.float64(np.float32(1 / 127))).astype(np.float32)


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 products as the producer does: to float32 first, then (bfloat16 / float16) to the nearest even,
    returned as float64 values."""
    x32 = np.asarray(x, dtype=np.float64).astype(np.float32)
    if dtype == "float32":
        return x32.astype(np.float64)
    if dtype == "float16":
        return x32.astype(np.float16).astype(np.float64)
    bits = x32.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)
