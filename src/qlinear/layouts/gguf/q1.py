"""1-bit sign blocks: the reference's Q1_0 (id 40, 32 values, 6 bytes) and Q1_0_g128 (id 41, 128 values, 18 bytes).

Bytes: ``d f16`` (the mean of ``|w|``), then sign bits least significant first; bit 1 means ``+d``, bit 0 ``-d``.
Upstream ggml (gguf-py 0.19) names id 41 ``Q1_0`` with exactly the g128 layout; upstream id 40 is NVFP4, a
different type (see gguf_file.py). The encoder is ggml's ``quantize_row_q1_0_ref`` for either block size.
"""

from __future__ import annotations

import numpy as np
import torch

from .blocks import F32, f16_bytes, f16_field, lsb_bits, seq_sum


def decode_q1(blocks: torch.Tensor) -> torch.Tensor:
    d = f16_field(blocks, 0)
    bits = lsb_bits(blocks[:, 2:])
    return torch.where(bits.bool(), d, -d)


def encode_q1(x: np.ndarray) -> np.ndarray:
    d = seq_sum(np.abs(x)) / F32(x.shape[1])
    bits = (x >= 0).reshape(x.shape[0], -1, 8).astype(np.uint8) << np.arange(8, dtype=np.uint8)
    return np.concatenate([f16_bytes(d), bits.sum(axis=2, dtype=np.uint8)], axis=1)
