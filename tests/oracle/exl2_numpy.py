"""Independent numpy oracle for ExLlamaV2's layouts, transcribed line by line from exllamav2 0.3.2's CUDA sources
(``exllamav2_ext/cuda/pack_tensor.cu``, ``q_matrix.cu``, ``quant/qdq_*.cuh`` with QMODE 0 for the plain bit reads,
``quant/qdq_util.cuh``) and GPTQModel 7.7.0's vendored copy (``gptqmodel_ext/exllamav2``: zero points ``& 0x0f``).
The CUDA code cannot run on this machine; these are Python loops over words and lanes, small shapes only, float16
arithmetic done with numpy's float16 (each op rounds once, as ``__hmul`` does). Shares no code with qlinear.
"""

from __future__ import annotations

import numpy as np

M32 = 0xFFFFFFFF


def wshift(x: int, j: int) -> int:
    """pack_tensor.cu ``wshift``: a shift that is 0 past the word."""
    if j < 0:
        return 0 if j <= -32 else x >> -j
    return 0 if j >= 32 else (x << j) & M32


def pack_columns(q: np.ndarray, bits: int) -> np.ndarray:
    """``pack_columns_kernel<bits>``: codes ``[rows, cols]`` -> uint32 words ``[ceil(rows*bits/32), cols]``."""
    rows, cols = q.shape
    out_rows = -(-rows * bits // 32)
    words_per = {2: 1, 3: 3, 4: 1, 5: 5, 6: 3, 8: 1}[bits]
    codes_per = {2: 16, 3: 32, 4: 8, 5: 32, 6: 16, 8: 4}[bits]
    padded_rows = -(-out_rows // words_per) * words_per
    out = np.zeros((padded_rows, cols), dtype=np.uint64)
    src = np.zeros((padded_rows * 32 // bits + codes_per, cols), dtype=np.uint64)
    src[:rows] = q
    for c in range(cols):
        for out_row in range(0, padded_rows, words_per):
            row = out_row * 32 // bits
            packed = [0] * words_per
            for i in range(codes_per):
                x = int(src[row + i, c])
                for w in range(words_per):
                    packed[w] |= wshift(x, i * bits - 32 * w)
            for w in range(words_per):
                out[out_row + w, c] = packed[w]
    return out[:out_rows].astype(np.uint32)


def pack_rows_4(qscale: np.ndarray) -> np.ndarray:
    """``pack_rows_4_kernel``: scale codes 1..16 ``[G, N]`` -> uint32 ``[G, N/8]`` holding ``x - 1`` per nibble."""
    g, n = qscale.shape
    out = np.zeros((g, n // 8), dtype=np.uint64)
    for r in range(g):
        for oc in range(n // 8):
            packed = 0
            for i in range(8):
                packed |= (int(qscale[r, oc * 8 + i]) - 1) << (i * 4)
            out[r, oc] = packed
    return out.astype(np.uint32)


def exb(q1: int, q0: int, shift: int, mask: int) -> int:
    """``__funnelshift_rc(q0, q1, shift) & mask`` (the 64-bit q1:q0 shifted right)."""
    return (((q1 << 32) | q0) >> shift) & mask


def dequant_plain(words: list[int], bits: int) -> list[int]:
    """qdq_*.cuh QMODE 0 reads of one block (signed ``q - 2**(bits-1)``), transcribed per width."""
    z = 1 << (bits - 1)
    if bits == 2:
        return [exb(0, words[0], i * 2, 0x03) - z for i in range(16)]
    if bits == 4:
        return [exb(0, words[0], i * 4, 0x0F) - z for i in range(8)]
    if bits == 8:
        return [exb(0, words[0], i * 8, 0xFF) - z for i in range(4)]
    q = words
    if bits == 3:
        v = [exb(0, q[0], i * 3, 7) for i in range(10)] + [exb(q[1], q[0], 30, 7)]
        v += [exb(0, q[1], i * 3 + 1, 7) for i in range(10)] + [exb(q[2], q[1], 31, 7)]
        v += [exb(0, q[2], i * 3 + 2, 7) for i in range(10)]
    elif bits == 5:
        v = [exb(0, q[0], i * 5, 31) for i in range(6)] + [exb(q[1], q[0], 30, 31)]
        v += [exb(0, q[1], i * 5 + 3, 31) for i in range(5)] + [exb(q[2], q[1], 28, 31)]
        v += [exb(0, q[2], i * 5 + 1, 31) for i in range(6)] + [exb(q[3], q[2], 31, 31)]
        v += [exb(0, q[3], i * 5 + 4, 31) for i in range(5)] + [exb(q[4], q[3], 29, 31)]
        v += [exb(0, q[4], i * 5 + 2, 31) for i in range(6)]
    else:  # 6
        v = [exb(0, q[0], i * 6, 63) for i in range(5)] + [exb(q[1], q[0], 30, 63)]
        v += [exb(0, q[1], i * 6 + 4, 63) for i in range(4)] + [exb(q[2], q[1], 28, 63)]
        v += [exb(0, q[2], i * 6 + 2, 63) for i in range(5)]
    return [x - z for x in v]


def exl2_weight(q_weight: np.ndarray, q_invperm: np.ndarray, q_scale: np.ndarray, q_scale_max: np.ndarray,
                q_groups: np.ndarray, k: int) -> np.ndarray:
    """The float16 weight ``[K, N]`` (input order) as ``make_q_matrix`` + ``reconstruct_kernel`` produce it."""
    words = q_weight.astype(np.int64) & M32
    n = words.shape[1]
    msc = (q_scale_max.astype(np.float16) * np.float16(1 / 256)).astype(np.float16)  # q_scale_max *= 1/256
    perm = np.argsort(q_invperm.astype(np.int64), kind="stable")
    gr = [int(v) for v in q_groups]
    groups = len(gr) // 2
    out = np.zeros((k, n), dtype=np.float16)
    row = 0
    for gi in range(groups):
        bits, qrow = gr[2 * gi], gr[2 * gi + 1]
        rows = (gr[2 * gi + 3] - qrow) * 32 // bits if gi < groups - 1 else k - row
        words_per = {2: 1, 3: 3, 4: 1, 5: 5, 6: 3, 8: 1}[bits]
        for c in range(n):
            qs = (int(q_scale[gi, c // 8]) & M32) >> (4 * (c % 8)) & 0xF
            qs_h = np.float16(np.float16((qs + 1) * (qs + 1)) * msc[gi])  # dq_scale
            vals: list[int] = []
            w = qrow
            while len(vals) < rows:
                block = [int(words[w + i, c]) if w + i < words.shape[0] else 0 for i in range(words_per)]
                vals += dequant_plain(block, bits)
                w += words_per
            for r in range(rows):
                out[perm[row + r], c] = np.float16(np.float16(vals[r]) * qs_h)  # __hmul2(dq, qs_h2)
        row += rows
    return out


# --------------------------------------------------------------------------- GPTQ path (make_q_matrix, 4-bit)

def make_sequential(qweight: np.ndarray, g_idx: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``QMatrix::make_sequential`` and ``make_sequential_kernel``: (new qweight, q_perm, q_invperm) as uint16."""
    height = g_idx.shape[0]
    hist = [0] * groups
    for i in range(height):
        hist[int(g_idx[i])] += 1
    acc = 0
    for i in range(groups):
        tmp = np.int16(hist[i])  # "short tmp" in the source
        hist[i] = acc
        acc += int(tmp)
    x_map_inv = [0] * height
    for row in range(height):
        g = int(g_idx[row])
        x_map_inv[row] = hist[g]
        hist[g] += 1
    x_map = [0] * height
    for row in range(height):
        x_map[x_map_inv[row]] = row
    w = qweight.astype(np.int64) & M32
    width = w.shape[1]
    new = np.zeros_like(w)
    for new_row in range(height // 8):
        for col in range(width):
            dst = 0
            for i in range(8):
                src_row = x_map[new_row * 8 + i]
                dst |= ((int(w[src_row >> 3, col]) >> ((src_row & 7) * 4)) & 0xF) << (i * 4)
            new[new_row, col] = dst
    return new.astype(np.uint32), np.array(x_map, dtype=np.uint16), np.array(x_map_inv, dtype=np.uint16)


def shuffle_4bit_8(words: np.ndarray) -> np.ndarray:
    """``shuffle_4bit_8`` on every word."""
    out = np.zeros(words.shape, dtype=np.uint64)
    flat_in, flat_out = (words.astype(np.int64) & M32).reshape(-1), out.reshape(-1)
    for idx in range(flat_in.size):
        qa, qb = int(flat_in[idx]), 0
        for i in range(4):
            qa0, qa1 = qa & 0x0F, (qa & 0xF0) >> 4
            qa >>= 8
            qb |= qa1 << (i * 4 + 16)
            qb |= qa0 << (i * 4)
        flat_out[idx] = qb
    return out.astype(np.uint32)


def gptq_weight(qweight_shuffled: np.ndarray, q_perm: np.ndarray | None, qzeros_v2: np.ndarray, scales: np.ndarray,
                k: int) -> np.ndarray:
    """``reconstruct_gptq_kernel`` (GPTQModel's copy: zero ``& 0x0f``): the float16 weight ``[K, N]``, input order.

    Per word the four half2 pairs come out as codes (0,4), (1,5), (2,6), (3,7) of the shuffled word, i.e. the
    original codes 0..7 in order; each is ``q - z`` exactly, then ``__hmul2`` by the group's float16 scale."""
    w = qweight_shuffled.astype(np.int64) & M32
    n = w.shape[1]
    groups = scales.shape[0]
    gs = 1
    while gs * groups < k:
        gs *= 2
    out = np.zeros((k, n), dtype=np.float16)
    for c in range(n):
        for wr in range(k // 8):
            word = int(w[wr, c])
            nib = [(word >> (4 * j)) & 0xF for j in range(8)]
            ordered = [nib[0], nib[4], nib[1], nib[5], nib[2], nib[6], nib[3], nib[7]]  # unshuffle
            for j in range(8):
                kk = wr * 8 + j
                g = kk // gs
                z = (int(qzeros_v2[g, c // 8]) & M32) >> (4 * (c % 8)) & 0x0F
                v = np.float16(np.float16(ordered[j] - z) * np.float16(scales[g, c]))
                out[kk if q_perm is None else int(q_perm[kk]), c] = v
    return out
