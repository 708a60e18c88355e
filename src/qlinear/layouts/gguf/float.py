"""Unquantized GGML tensors: F32, F16 and BF16 (one value per "block"), as little-endian bytes.

GGUF files keep norms, biases and sometimes embeddings or output heads in these types; the codecs let one
reader hand every tensor out as bytes and decode it the same way.
"""

from __future__ import annotations

import numpy as np
import torch


def decode_f32(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float32)


def decode_f16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.float16).to(torch.float32)


def decode_bf16(blocks: torch.Tensor) -> torch.Tensor:
    return blocks.contiguous().view(torch.bfloat16).to(torch.float32)


def encode_f32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype="<f4").view(np.uint8).reshape(x.shape[0], 4)


def encode_f16(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.astype("<f2")).view(np.uint8).reshape(x.shape[0], 2)


def encode_bf16(x: np.ndarray) -> np.ndarray:
    """ggml's ``ggml_compute_fp32_to_bf16``: NaN kept quiet, otherwise round to nearest even."""
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (n + 0x7FFF + ((n >> 16) & 1)) >> 16
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    out = np.where(nan, (n >> 16) | 64, rounded).astype("<u2")
    return out.view(np.uint8).reshape(x.shape[0], 2)
