"""GGML's 256-value K-quant super-blocks: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K decoded in torch.

Layouts (bytes in order, formats.md 2.14): Q2_K ``scales[16], qs[64], d, dmin``; Q3_K ``hmask[32], qs[64],
scales[12], d``; Q4_K ``d, dmin, scales[12], qs[128]``; Q5_K ``d, dmin, scales[12], qh[32], qs[128]``;
Q6_K ``ql[128], qh[64], scales int8[16], d``. Each decoder multiplies in the order ggml and gguf-py do, so the
floats are bit-identical to ``gguf.quants.dequantize``. Encoders live in ``kquants_encode.py``.
"""

from __future__ import annotations

import torch

from .blocks import bit_planes, f16_field, nibbles

QK_K = 256


def kquant_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K 12-byte packing -> 6-bit ``(sc [nb, 8], mn [nb, 8])`` (uint8): bytes 0-3 carry ``sc[0..3]``
    and bits 4-5 of ``sc[4..7]`` in bits 6-7; bytes 4-7 the same for ``mn``; bytes 8-11 the low nibbles."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc, mn


def scale_min_runs(sc, mn):
    """``kquant_scale_min`` undone: the 12-byte packing's three 4-byte runs of 6-bit ``sc``, ``mn`` ``[nb, 8]``
    (numpy arrays or torch tensors; the caller concatenates them along dim 1)."""
    return (sc[:, :4] | ((sc[:, 4:] >> 4) << 6), mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4))


def q3k_scales(packed: torch.Tensor) -> torch.Tensor:
    """Q3_K 12-byte packing -> 16 signed 6-bit scales ``[nb, 16]`` (int16, already minus 32)."""
    low = nibbles(packed[:, 0:8]).reshape(-1, 16)
    high = bit_planes(packed[:, 8:12], 2, 4).reshape(-1, 16)
    return (low | (high << 4)).to(torch.int16) - 32


def decode_q2_k(blocks: torch.Tensor) -> torch.Tensor:
    nb = blocks.shape[0]
    sc = blocks[:, 0:16]
    d, dmin = f16_field(blocks, 80), f16_field(blocks, 82)
    dl = (d * (sc & 0x0F).to(torch.float32)).reshape(nb, 16, 1)
    ml = (dmin * (sc >> 4).to(torch.float32)).reshape(nb, 16, 1)
    q = bit_planes(blocks[:, 16:80].reshape(nb, 2, 32), 2, 4)  # [nb, half, shift, 32]
    return (dl * q.reshape(nb, 16, 16).to(torch.float32) - ml).reshape(nb, QK_K)


def decode_q3_k(blocks: torch.Tensor) -> torch.Tensor:
    nb = blocks.shape[0]
    d = f16_field(blocks, 108)
    dl = (d * q3k_scales(blocks[:, 96:108]).to(torch.float32)).reshape(nb, 16, 1)
    low = bit_planes(blocks[:, 32:96].reshape(nb, 2, 32), 2, 4).reshape(nb, 16, 16)
    high = bit_planes(blocks[:, 0:32], 1, 8).reshape(nb, 16, 16)  # bit set: no -4 offset
    q = low.to(torch.int8) - ((high ^ 1) << 2).to(torch.int8)
    return (dl * q.to(torch.float32)).reshape(nb, QK_K)


def _decode_q45_k(blocks: torch.Tensor, qh_at: int | None) -> torch.Tensor:
    nb = blocks.shape[0]
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, mn = kquant_scale_min(blocks[:, 4:16])
    dl = (d * sc.to(torch.float32)).reshape(nb, 8, 1)
    ml = (dmin * mn.to(torch.float32)).reshape(nb, 8, 1)
    qs_at = 16 if qh_at is None else qh_at + 32
    q = nibbles(blocks[:, qs_at:qs_at + 128].reshape(nb, 4, 32)).reshape(nb, 8, 32)
    if qh_at is not None:
        q = q | (bit_planes(blocks[:, qh_at:qh_at + 32], 1, 8) << 4)
    return (dl * q.to(torch.float32) - ml).reshape(nb, QK_K)


def decode_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    return _decode_q45_k(blocks, None)


def decode_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    return _decode_q45_k(blocks, 16)


def decode_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    nb = blocks.shape[0]
    d = f16_field(blocks, 208)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    dl = (d * scales).reshape(nb, 16, 1)
    low = nibbles(blocks[:, 0:128].reshape(nb, 2, 64)).reshape(nb, 8, 32)
    high = bit_planes(blocks[:, 128:192].reshape(nb, 2, 32), 2, 4).reshape(nb, 8, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    return (dl * q.reshape(nb, 16, 16).to(torch.float32)).reshape(nb, QK_K)
