"""GGML blocks whose values are ``scale * code + offset`` over runs of 32: the form torch's int4pack op takes.

Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 blocks are 32 values with one scale (and min); Q4_K and Q5_K super-blocks
are eight 32-value sub-blocks, each with ``d * sc`` and ``-dmin * m``. ``affine32`` returns, per 32 values,
unsigned codes (0 .. 2**bits - 1), a float32 scale and a float32 offset such that ``scale * code + offset``
equals ``gguf.dequantize`` exactly (every product and sum below is exact in float32, or is the same
operation the decoder performs). IQ4_NL and IQ4_XS index a 16-entry table of integers in -127..113, so
``d * kv[q]`` is the 8-bit code ``kv[q] + 128`` with scale ``d`` and offset ``-128 * d`` (the form of Q8_0;
``d * kv`` needs at most 24 significant bits, so the decoder's float32 product is exact too). Types with
16-value sub-blocks (Q2_K, Q3_K, Q6_K) have the 16-value form of ``affine16``.
"""

from __future__ import annotations

import torch

from .blocks import bit_planes, f16_field, f16_field_bytes, nibbles
from .iq import KVALUES_IQ4NL, iq4_xs_scales
from .kquants import kquant_scale_min, scale_min_runs
from .legacy import _codes4, _codes5

#: qtype name -> bits of its unsigned codes (signed types are shifted: Q8_0 codes are q + 128).
AFFINE32_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5, "IQ4_NL": 8,
                 "IQ4_XS": 8}


def _legacy(blocks: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = f16_field(blocks, 0)
    if name == "Q8_0":  # q int8: d*q = d*(q + 128) - 128*d, both exact (19 and 12 significant bits)
        q = blocks[:, 2:34].contiguous().view(torch.int8).to(torch.int16) + 128
        return q.to(torch.uint8), d, -128 * d
    if name == "Q4_0":
        return _codes4(blocks, 2), d, -8 * d
    if name == "Q5_0":
        return _codes5(blocks, 2), d, -16 * d
    m = f16_field(blocks, 2)
    return (_codes4(blocks, 4) if name == "Q4_1" else _codes5(blocks, 4)), d, m


def _kquant(blocks: torch.Tensor, five: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    nb = blocks.shape[0]
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, mn = kquant_scale_min(blocks[:, 4:16])
    qs_at = 48 if five else 16
    q = nibbles(blocks[:, qs_at:qs_at + 128].reshape(nb, 4, 32)).reshape(nb, 8, 32)
    if five:
        q = q | (bit_planes(blocks[:, 16:48], 1, 8) << 4)
    return q.reshape(nb * 8, 32), (d * sc.float()).reshape(-1, 1), (-(dmin * mn.float())).reshape(-1, 1)


def _iq4(blocks: torch.Tensor, xs: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Table values as 8-bit codes ``kv[q] + 128``; scale per 32: ``d`` (IQ4_NL) or ``d * (ls - 32)`` (IQ4_XS)."""
    table = torch.tensor(KVALUES_IQ4NL, dtype=torch.int16) + 128
    if xs:
        nb = blocks.shape[0]
        q = nibbles(blocks[:, 8:136].reshape(nb, 8, 16)).reshape(nb * 8, 32)
        scale = iq4_xs_scales(blocks).reshape(-1, 1)
    else:
        q = nibbles(blocks[:, 2:18]).reshape(-1, 32)
        scale = f16_field(blocks, 0).reshape(-1, 1)
    return table[q.long()].to(torch.uint8), scale, -128 * scale


def _blocks(qweight: torch.Tensor, qtype: str, k: int) -> tuple[torch.Tensor, int, int]:
    """``(blocks [N * nb, type_size], N, nb)`` of checked ``uint8 [N, row_bytes]`` GGML rows."""
    from . import type_info

    info = type_info(qtype)
    n, size = qweight.shape[0], info.type_size
    nb = -(-k // info.block_size)
    if tuple(qweight.shape) != (n, nb * size) or qweight.dtype != torch.uint8:
        raise ValueError(f"qweight ({qtype}): expected uint8 [{n}, {nb * size}], got "
                         f"{str(qweight.dtype).removeprefix('torch.')} {list(qweight.shape)}")
    return qweight.reshape(n * nb, size), n, nb


def kquant_parts(qweight: torch.Tensor, qtype: str, k: int) -> tuple[torch.Tensor, ...]:
    """Q4_K rows -> ``codes uint8 [N, Kp]``, ``sc``, ``m`` (uint8 ``[N, Kp/32]``) and ``d``, ``dmin`` (float32
    ``[N, Kp/256]``, the blocks' float16 values): ``d sc q - dmin m`` is the decoded weight (the 6-bit
    sub-scales kept as integers, for a layout that multiplies them out per group)."""
    if qtype != "Q4_K":
        raise ValueError(f"{qtype}: the two-level (uint8 per 32, float per 256) form is built for Q4_K")
    blocks, n, nb = _blocks(qweight, qtype, k)
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, mn = kquant_scale_min(blocks[:, 4:16])
    q = nibbles(blocks[:, 16:144].reshape(nb * n, 4, 32)).reshape(n, nb * 256)
    return q, sc.reshape(n, nb * 8), mn.reshape(n, nb * 8), d.reshape(n, nb), dmin.reshape(n, nb)


def kquant_blocks(codes: torch.Tensor, sc: torch.Tensor, mins: torch.Tensor, d: torch.Tensor,
                  dmin: torch.Tensor) -> torch.Tensor:
    """``kquant_parts`` undone: Q4_K rows ``uint8 [N, nb * 144]`` from codes ``[N, nb * 256]``, 6-bit ``sc`` and
    ``mins`` ``[N, nb * 8]`` and ``d``, ``dmin`` ``[N, nb]`` (float16 values, in any float dtype): the bytes
    ``kquant_parts`` read, bit for bit (formats.md 2.14: ``d, dmin, scales[12], qs[128]``)."""
    n, kp = codes.shape
    nb = kp // 256
    if kp % 256 or tuple(sc.shape) != (n, nb * 8) or tuple(mins.shape) != (n, nb * 8) or \
            tuple(d.shape) != (n, nb) or tuple(dmin.shape) != (n, nb):
        raise ValueError(f"kquant_blocks: expected codes [N, 256 nb], sc/mins [N, 8 nb], d/dmin [N, nb], got "
                         f"{list(codes.shape)}, {list(sc.shape)}, {list(mins.shape)}, {list(d.shape)}, "
                         f"{list(dmin.shape)}")
    packed = torch.cat(scale_min_runs(sc.reshape(n * nb, 8).to(torch.uint8), mins.reshape(n * nb, 8).to(torch.uint8)),
                       dim=1)
    q = codes.to(torch.uint8).reshape(n * nb, 4, 2, 32)
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(n * nb, 128)
    return torch.cat((f16_field_bytes(d), f16_field_bytes(dmin), packed, qs), dim=1).reshape(n, nb * 144)


def affine32(qweight: torch.Tensor, qtype: str, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``uint8 [N, row_bytes]`` GGML rows -> ``codes uint8 [N, Kp]``, ``scale [N, Kp/32]``, ``offset [N, Kp/32]``.

    ``Kp`` is ``k`` rounded up to whole blocks (the padding values decode like any other; a caller multiplies
    them by zero activations). Raises ``ValueError`` for a type with no 32-value affine form.
    """
    if qtype not in AFFINE32_BITS:
        raise ValueError(f"{qtype}: no 32-value affine form (takes {', '.join(AFFINE32_BITS)})")
    from . import type_info

    blocks, n, nb = _blocks(qweight, qtype, k)
    block = type_info(qtype).block_size
    if qtype.startswith("IQ4"):
        codes, scale, offset = _iq4(blocks, qtype == "IQ4_XS")
    elif qtype.endswith("_K"):
        codes, scale, offset = _kquant(blocks, qtype == "Q5_K")
    else:
        codes, scale, offset = _legacy(blocks, qtype)
    groups = nb * block // 32
    return codes.reshape(n, groups * 32), scale.reshape(n, groups), offset.reshape(n, groups)
