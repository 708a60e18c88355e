"""Independent float64/numpy oracle for the GPTQ layouts, written from specs/formats.md 2.1-2.4.

Deliberately plain: one bit at a time, Python loops, small shapes only. Shares no code with qlinear.
"""

from __future__ import annotations

import numpy as np

PLANES = {2: [(2, 0)], 3: [(2, 0), (1, 2)], 4: [(4, 0)], 5: [(4, 0), (1, 4)],
          6: [(4, 0), (2, 4)], 7: [(4, 0), (2, 4), (1, 6)], 8: [(8, 0)]}


def word_bits(words: np.ndarray) -> int:
    """Bits per word of a signed integer array (int8/16/32/64)."""
    assert words.dtype.kind == "i", words.dtype
    return words.dtype.itemsize * 8


def unsigned(word: int, wbits: int) -> int:
    """The bit pattern of one signed word as a non-negative Python int."""
    return int(word) % (1 << wbits)


def stream_unpack(words: np.ndarray, bits: int, count: int) -> list[int]:
    """Codes from a 1-D little-endian bit stream: code i = stream bits [b*i, b*i+b), bit t in word t//W."""
    wbits = word_bits(words)
    values = [unsigned(w, wbits) for w in words]
    codes = []
    for i in range(count):
        code = 0
        for m in range(bits):
            t = bits * i + m
            bit = (values[t // wbits] >> (t % wbits)) & 1
            code |= bit << m
        codes.append(code)
    return codes


def stream_pack(codes: list[int], bits: int, wbits: int) -> list[int]:
    """Unsigned words (Python ints) holding ``codes`` as a little-endian bit stream."""
    n_words = -(-len(codes) * bits // wbits)
    words = [0] * n_words
    for i, code in enumerate(codes):
        for m in range(bits):
            t = bits * i + m
            words[t // wbits] |= ((code >> m) & 1) << (t % wbits)
    return words


def to_signed(word: int, wbits: int) -> int:
    """A ``wbits``-bit pattern as the signed integer torch/numpy stores."""
    return word - (1 << wbits) if word >= 1 << (wbits - 1) else word


def unpack_qweight(qweight: np.ndarray, bits: int, k: int) -> np.ndarray:
    """Continuous GPTQ qweight [ceil(K*b/W), N] -> codes [K, N] (packed along K)."""
    out = np.zeros((k, qweight.shape[1]), dtype=np.int64)
    for n in range(qweight.shape[1]):
        out[:, n] = stream_unpack(qweight[:, n], bits, k)
    return out


def unpack_qzeros(qzeros: np.ndarray, bits: int, n: int, v1: bool) -> np.ndarray:
    """Continuous GPTQ qzeros [G, ceil(N*b/W)] -> true zeros [G, N].

    v1 with 2/4/8 bits: the word, read as an unsigned integer, plus one in every field's lowest bit,
    modulo 2^W (GPTQModel's whole-word conversion, formats.md 2.3); 3 bits: each field plus 1 mod 2^b.
    """
    wbits = word_bits(qzeros)
    if v1 and wbits % bits == 0:
        ones = sum(1 << (bits * j) for j in range(wbits // bits))
        qzeros = np.array([[to_signed((unsigned(int(x), wbits) + ones) % (1 << wbits), wbits) for x in row]
                           for row in qzeros], dtype=qzeros.dtype).reshape(qzeros.shape)
    out = np.zeros((qzeros.shape[0], n), dtype=np.int64)
    for g in range(qzeros.shape[0]):
        fields = stream_unpack(qzeros[g, :], bits, n)
        out[g, :] = [(f + 1) % (1 << bits) if v1 and wbits % bits else f for f in fields]
    return out


def planar_unpack(words: np.ndarray, bits: int, count: int) -> list[int]:
    """Codes from 1-D planar words: per 32 codes, b int32 words, low plane first (formats.md 2.4)."""
    assert words.dtype == np.int32 and count % 32 == 0
    codes = []
    for block in range(count // 32):
        base = block * bits
        for c in range(32):
            code, start = 0, base
            for width, offset in PLANES[bits]:
                pf = 32 // width
                word = unsigned(words[start + c // pf], 32)
                code |= ((word >> (width * (c % pf))) & ((1 << width) - 1)) << offset
                start += width
            codes.append(code)
    return codes


def planar_unpack_qweight(qweight: np.ndarray, bits: int, k: int) -> np.ndarray:
    out = np.zeros((k, qweight.shape[1]), dtype=np.int64)
    for n in range(qweight.shape[1]):
        out[:, n] = planar_unpack(qweight[:, n], bits, k)
    return out


def planar_unpack_qzeros(qzeros: np.ndarray, bits: int, n: int) -> np.ndarray:
    out = np.zeros((qzeros.shape[0], n), dtype=np.int64)
    for g in range(qzeros.shape[0]):
        out[g, :] = planar_unpack(qzeros[g, :], bits, n)
    return out


def dequantize(q_kn: np.ndarray, scales_gn: np.ndarray, zeros_gn: np.ndarray, g_idx: np.ndarray) -> np.ndarray:
    """w[n, k] = s[g_idx[k], n] * (q[k, n] - z[g_idx[k], n]) in float64, returned as [N, K]."""
    k, n = q_kn.shape
    w = np.zeros((n, k), dtype=np.float64)
    for kk in range(k):
        g = int(g_idx[kk])
        for nn in range(n):
            w[nn, kk] = float(scales_gn[g, nn]) * (float(q_kn[kk, nn]) - float(zeros_gn[g, nn]))
    return w


def dequantize_checkpoint(tensors: dict[str, np.ndarray], bits: int, k: int, n: int, fmt: str) -> np.ndarray:
    """Float64 weight [N, K] straight from GPTQ checkpoint arrays (fmt: gptq, gptq_v2 or gptq_p)."""
    if fmt == "gptq_p":
        q = planar_unpack_qweight(tensors["qweight"], bits, k)
        z = planar_unpack_qzeros(tensors["qzeros"], bits, n)
    else:
        q = unpack_qweight(tensors["qweight"], bits, k)
        z = unpack_qzeros(tensors["qzeros"], bits, n, v1=fmt == "gptq")
    s = tensors["scales"].astype(np.float64)
    return dequantize(q, s, z, tensors["g_idx"])
