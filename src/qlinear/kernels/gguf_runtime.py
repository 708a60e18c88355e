"""GGUF blocks re-laid for the GPTQ Triton kernels, and the lossless forms turned back into blocks.

``GGUFTritonKernel`` runs some types on the GPTQ kernels (``triton/layout.Packed``) instead of its block bodies:

* **Q4_K** (``build_kquant``): 4-bit codes, the blocks' uint8 6-bit sub-scales and mins per 32 and a float32
  ``(d, -dmin)`` per 256: 4.75 bits a weight against the blocks' 4.5, every field kept.
* **Q8_0**: codes ``q + 128`` in 8-bit words with the constant zero 128 and ``d`` as the float16 scale per 32:
  8.5 bits a weight, as the blocks, every field kept; it is GPTQ 8-bit g32 symmetric.
* **Q4_0 / Q4_1** (``build_affine32``, only when asked): float32 scale and offset per 32, about 6 bits a weight.

The first two are lossless, so they may replace the blocks (``LOSSLESS``); ``to_blocks`` rebuilds the file's bytes
from them bit for bit. Plain torch; nothing here imports triton.
"""

from __future__ import annotations

import torch

from ..layouts import gguf
from ..layouts.gguf.affine32 import affine32, kquant_blocks, kquant_parts
from ..layouts.gguf.blocks import f16_field_bytes
from .triton.layout import Packed, build, build_affine32, build_kquant, kquant_fields, unpack_words

T = gguf.GGMLType
#: types whose runtime form keeps every field of the blocks, so it may replace them: (type, values a row must be a
#: whole number of: a partial last block's padding values are not kept)
LOSSLESS = {T.Q4_K: 256, T.Q8_0: 32}
#: 4-bit types with a ``scale * code + offset`` form over runs of 32 (``affine_runtime=True``)
AFFINE = frozenset({T.Q4_0, T.Q4_1, T.Q4_K})
Q8_ZERO = 128


def lossless_runtime(qtype: gguf.GGMLType, in_features: int, dtype: torch.dtype) -> bool:
    """Can the runtime form replace the blocks? A ``LOSSLESS`` type, rows of whole blocks, half-precision
    activations (float32 ones run the block kernels)."""
    return (qtype in LOSSLESS and in_features % LOSSLESS[qtype] == 0
            and dtype in (torch.float16, torch.bfloat16))


def _finite(*t: torch.Tensor) -> bool:
    """A NaN's float16 payload need not survive float32 and back: blocks with non-finite scales stay blocks."""
    return all(bool(torch.isfinite(v).all()) for v in t)


def to_runtime(qweight: torch.Tensor, qtype: gguf.GGMLType, k: int, lossless: bool) -> Packed | None:
    """The GPTQ kernels' layout of ``uint8 [N, row_bytes]`` blocks, or None where there is none (or, with
    ``lossless``, where it would not keep every value: non-finite scales)."""
    g = -(-k // 32)
    if qtype == T.Q4_K:
        codes, sc, mins, d, dmin = kquant_parts(qweight, "Q4_K", k)
        if lossless and not _finite(d, dmin):
            return None
        return build_kquant(codes[:, :k], sc[:, :g], mins[:, :g], d[:, :-(-g // 8)], dmin[:, :-(-g // 8)])
    if qtype == T.Q8_0:
        codes, d, _ = affine32(qweight, "Q8_0", k)  # codes q + 128, d the float16 value
        if lossless and not _finite(d):
            return None
        zero = torch.full((1,), Q8_ZERO, dtype=torch.int32)
        return build(codes[:, :k], d[:, :g], zero, torch.arange(k) // 32, 8, scale_dtype=torch.float16)
    if qtype in AFFINE and not lossless:
        codes, scale, offset = affine32(qweight, qtype.name, k)
        return build_affine32(codes[:, :k], scale[:, :g], offset[:, :g])
    return None


def to_blocks(p: Packed, qtype: gguf.GGMLType) -> torch.Tensor:
    """``to_runtime`` undone for a ``LOSSLESS`` type: the blocks' bytes ``uint8 [N, row_bytes]``, bit for bit."""
    if qtype == T.Q4_K:
        return kquant_blocks(*kquant_fields(p))
    if qtype != T.Q8_0 or p.bits != 8 or p.zero_const != Q8_ZERO or p.perm is not None:
        raise ValueError(f"to_blocks: expected a Q4_K or Q8_0 runtime, got {qtype.name} with {p.bits}-bit words")
    g = p.k // 32
    q = (unpack_words(p.qweight, 8, p.rows_per_block)[:p.k, :p.n].t().to(torch.int16) - Q8_ZERO).to(torch.int8)
    d = f16_field_bytes(p.scales[:g, :p.n].t()).reshape(p.n, g, 2)
    return torch.cat((d, q.reshape(p.n, g, 32).view(torch.uint8)), dim=2).reshape(p.n, g * 34)
