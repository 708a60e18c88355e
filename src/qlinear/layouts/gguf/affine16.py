"""K-quants with 16-value sub-blocks (Q2_K, Q3_K, Q6_K) as ``scale * code + offset`` per run of 16.

The companion of ``affine32`` for the types it cannot express: per 16 values, unsigned codes, a float32
scale and a float32 offset with ``scale * code + offset`` equal to ``gguf.dequantize`` (the scale is the
decoder's own ``d * sc``; every product below is exact in float32):

* Q2_K: 2-bit ``q``, scale ``d * (sc & 15)``, offset ``-dmin * (sc >> 4)``;
* Q3_K: ``q = low - 4 * (1 - high)`` in -4..3 as code ``q + 4`` (3 bits), scale ``d * (sc - 32)``, offset
  ``-4 * scale``;
* Q6_K: ``q`` in -32..31 as code ``q + 32`` (6 bits), scale ``d * sc`` (int8), offset ``-32 * scale``.
"""

from __future__ import annotations

import torch

from .blocks import bit_planes, f16_field, nibbles
from .kquants import QK_K, q3k_scales

#: qtype name -> bits of its unsigned codes
AFFINE16_BITS = {"Q2_K": 2, "Q3_K": 3, "Q6_K": 6}


def _q2_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nb = blocks.shape[0]
    sc = blocks[:, 0:16]
    d, dmin = f16_field(blocks, 80), f16_field(blocks, 82)
    q = bit_planes(blocks[:, 16:80].reshape(nb, 2, 32), 2, 4).reshape(nb * 16, 16)
    return q, (d * (sc & 0x0F).float()).reshape(-1, 1), (-(dmin * (sc >> 4).float())).reshape(-1, 1)


def _q3_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nb = blocks.shape[0]
    scale = (f16_field(blocks, 108) * q3k_scales(blocks[:, 96:108]).float()).reshape(-1, 1)
    low = bit_planes(blocks[:, 32:96].reshape(nb, 2, 32), 2, 4).reshape(nb * 16, 16)
    high = bit_planes(blocks[:, 0:32], 1, 8).reshape(nb * 16, 16)  # bit set: no -4 offset
    return low | (high << 2), scale, -4 * scale


def _q6_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nb = blocks.shape[0]
    scale = (f16_field(blocks, 208) * blocks[:, 192:208].contiguous().view(torch.int8).float()).reshape(-1, 1)
    low = nibbles(blocks[:, 0:128].reshape(nb, 2, 64)).reshape(nb, 8, 32)
    high = bit_planes(blocks[:, 128:192].reshape(nb, 2, 32), 2, 4).reshape(nb, 8, 32)
    return (low | (high << 4)).reshape(nb * 16, 16), scale, -32 * scale


def affine16(qweight: torch.Tensor, qtype: str, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``uint8 [N, row_bytes]`` GGML rows -> ``codes uint8 [N, Kp]``, ``scale [N, Kp/16]``, ``offset [N, Kp/16]``
    (``Kp``: ``k`` rounded up to whole 256-value blocks). Raises ``ValueError`` for any other type."""
    if qtype not in AFFINE16_BITS:
        raise ValueError(f"{qtype}: no 16-value affine form (takes {', '.join(AFFINE16_BITS)})")
    from . import type_info

    size, n, nb = type_info(qtype).type_size, qweight.shape[0], -(-k // QK_K)
    if tuple(qweight.shape) != (n, nb * size) or qweight.dtype != torch.uint8:
        raise ValueError(f"qweight ({qtype}): expected uint8 [{n}, {nb * size}], got "
                         f"{str(qweight.dtype).removeprefix('torch.')} {list(qweight.shape)}")
    codes, scale, offset = {"Q2_K": _q2_k, "Q3_K": _q3_k, "Q6_K": _q6_k}[qtype](qweight.reshape(n * nb, size))
    groups = nb * QK_K // 16
    return codes.to(torch.uint8).reshape(n, groups * 16), scale.reshape(n, groups), offset.reshape(n, groups)
