"""Shared helpers of the MLX tests: run the producer (``mlx``, CPU wheel) and move arrays to torch bit for bit.

Tests import this module lazily after ``need_mlx()``, which skips cleanly (with the install command) where mlx is
missing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

INSTALL = "pip install --no-deps mlx==0.32.4 mlx-cpu==0.32.4 (requirements/nodeps-mlx.txt)"
TORCH_OF = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def need_mlx() -> Any:
    """``mlx.core``, or a skip naming the install command."""
    return pytest.importorskip("mlx.core", reason=f"mlx is not installed: {INSTALL}")


def to_torch(a: Any) -> torch.Tensor:
    """An mlx array as a torch tensor with the same bits (uint32 words, float16/bfloat16/float32 values)."""
    mx = need_mlx()
    if a.dtype == mx.uint32:
        return torch.from_numpy(np.asarray(a).view(np.int32).copy()).view(torch.uint32)
    name = str(a.dtype).rsplit(".", 1)[-1]
    return torch.from_numpy(np.asarray(a.astype(mx.float32)).copy()).to(TORCH_OF[name])


def to_mlx(t: torch.Tensor) -> Any:
    """A torch tensor as an mlx array with the same bits."""
    mx = need_mlx()
    if t.dtype == torch.uint32:
        return mx.array(t.view(torch.int32).numpy().view(np.uint32))
    name = str(t.dtype).removeprefix("torch.")
    return mx.array(t.float().numpy()).astype(getattr(mx, name))


def quantize(w: torch.Tensor, group_size: int, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mx.quantize`` of a torch weight: (uint32 words, scales, biases) as torch tensors."""
    mx = need_mlx()
    q, s, b = mx.quantize(to_mlx(w), group_size, bits)
    return to_torch(q), to_torch(s), to_torch(b)


def dequantize(words: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, group_size: int,
               bits: int) -> torch.Tensor:
    """``mx.dequantize`` of torch tensors."""
    mx = need_mlx()
    return to_torch(mx.dequantize(to_mlx(words), to_mlx(scales), to_mlx(biases), group_size, bits))
