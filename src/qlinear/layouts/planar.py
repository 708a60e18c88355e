"""GPTQ planar layout ``gptq_p`` (formats.md 2.4): codes split into bit planes whose widths divide 32.

Planes, low first: 2->(2), 3->(2,1), 4->(4), 5->(4,1), 6->(4,2), 7->(4,2,1), 8->(8). Every 32 codes
along the packed dimension form a block of exactly ``b`` int32 words: the ``w0`` words of plane 0,
then the ``w1`` words of plane 1, ... Inside a plane of width ``w`` word ``i`` holds block codes
``i*pf .. i*pf+pf-1`` in sequential fields (``pf = 32 / w``), which is the plain bit stream of
``bitpack`` applied to that plane, so no code straddles a word. 2/4/8-bit words equal the continuous
layout. Zero points are always true (v2) zeros. Names and argument order follow the reference's
``gptqmodel/utils/planar_packing.py``; unpacking returns uint8 codes and takes an optional count.
"""

from __future__ import annotations

import torch

from .bitpack import pack_bits, unpack_bits

PLANAR_BITS: tuple[int, ...] = (5, 6, 7)
PLANAR_FORMAT_BITS: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
# bits -> ((plane width, bit offset), ...), low plane first.
PLANES: dict[int, tuple[tuple[int, int], ...]] = {
    2: ((2, 0),),
    3: ((2, 0), (1, 2)),
    4: ((4, 0),),
    5: ((4, 0), (1, 4)),
    6: ((4, 0), (2, 4)),
    7: ((4, 0), (2, 4), (1, 6)),
    8: ((8, 0),),
}
BLOCK = 32  # codes per block; a block is ``bits`` int32 words
_CODE_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _check_bits(bits: int) -> None:
    if bits not in PLANES:
        raise ValueError(f"bits: planar gptq_p holds 2..8 bits, got {bits!r}")


def _check_values(values: torch.Tensor, bits: int, axis: str) -> None:
    if not isinstance(values, torch.Tensor) or values.dim() != 2:
        found = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
        raise ValueError(f"values: expected a 2-D tensor of codes, got shape {found}")
    if values.dtype not in _CODE_DTYPES:
        raise ValueError(f"values: expected an integer dtype (uint8 codes), got {values.dtype}")
    length = values.shape[0 if axis == "rows" else 1]
    if length % BLOCK:
        raise ValueError(f"values: planar packing needs the packed dimension ({axis}) to be a multiple of 32, "
                         f"got {length} (shape {tuple(values.shape)})")
    maxq = (1 << bits) - 1
    if values.numel() and (int(values.min()) < 0 or int(values.max()) > maxq):
        raise ValueError(f"values: codes must be in 0..{maxq} for {bits} bits; "
                         f"found {int(values.min())}..{int(values.max())}")


def _check_packed(packed: torch.Tensor, bits: int, axis: str, count: int | None) -> int:
    """Number of codes along the packed axis after validating ``packed`` (and ``count`` when given)."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != 2:
        found = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"packed: expected a 2-D tensor of int32 words, got shape {found}")
    if packed.dtype != torch.int32:
        raise ValueError(f"packed: planar gptq_p words must be torch.int32, got {packed.dtype}")
    have = packed.shape[0 if axis == "rows" else 1]
    if have % bits:
        raise ValueError(f"packed: planar {bits}-bit words come in blocks of {bits} along the {axis}; "
                         f"got {have} (shape {tuple(packed.shape)})")
    if count is None:
        return have // bits * BLOCK
    if not isinstance(count, int) or count < 0 or count % BLOCK:
        raise ValueError(f"{axis}: planar packing needs a multiple of 32 codes, got {count!r}")
    if have != count // BLOCK * bits:
        raise ValueError(f"packed: {count} {bits}-bit codes need {count // BLOCK * bits} int32 words along the "
                         f"{axis}, found {have} (shape {tuple(packed.shape)})")
    return count


def planar_pack_rows(values: torch.Tensor, bits: int, *, pack_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Pack codes ``[K, N]`` along dim 0 into ``[K*b/32, N]`` int32 words (K a multiple of 32)."""
    _check_bits(bits)
    if pack_dtype != torch.int32:
        raise ValueError(f"pack_dtype: planar gptq_p is packed in torch.int32 words only, got {pack_dtype}")
    _check_values(values, bits, "rows")
    k, n = values.shape
    x = values.reshape(k // BLOCK, BLOCK, n)
    planes = [pack_bits((x >> offset) & ((1 << width) - 1), width, torch.int32, dim=1)
              for width, offset in PLANES[bits]]
    return torch.cat(planes, dim=1).reshape(k // BLOCK * bits, n)


def planar_unpack_rows(packed: torch.Tensor, bits: int, rows: int | None = None) -> torch.Tensor:
    """Unpack ``[K*b/32, N]`` int32 words into codes ``[K, N]`` uint8 (``rows`` = K, inferred when None)."""
    _check_bits(bits)
    k = _check_packed(packed, bits, "rows", rows)
    n = packed.shape[1]
    words = packed.reshape(k // BLOCK, bits, n)
    out = torch.zeros(k // BLOCK, BLOCK, n, dtype=torch.uint8, device=packed.device)
    start = 0
    for width, offset in PLANES[bits]:
        out |= unpack_bits(words[:, start:start + width], width, BLOCK, dim=1, name="packed") << offset
        start += width
    return out.reshape(k, n)


def planar_pack_cols(values: torch.Tensor, bits: int, *, pack_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Pack ``[G, N]`` values along dim 1 into ``[G, N*b/32]`` int32 words (N a multiple of 32)."""
    _check_bits(bits)
    _check_values(values, bits, "columns")
    return planar_pack_rows(values.t(), bits, pack_dtype=pack_dtype).t().contiguous()


def planar_unpack_cols(packed: torch.Tensor, bits: int, cols: int | None = None) -> torch.Tensor:
    """Unpack ``[G, N*b/32]`` int32 words into ``[G, N]`` uint8 (``cols`` = N, inferred when None)."""
    _check_bits(bits)
    n = _check_packed(packed, bits, "columns", cols)
    return planar_unpack_rows(packed.t(), bits, n).t().contiguous()
