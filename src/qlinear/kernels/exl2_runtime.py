"""EXL2 row groups re-laid for the GPTQ Triton kernels, and ``q_weight`` rebuilt from them bit for bit.

An EXL2 weight is ``(q - 2**(b-1)) * s`` with ``b`` in 2..8 per group of stored rows, widest first
(``layouts/exl2.py``). The GPTQ kernels (``triton/layout.Packed``) take 2, 4 or 8-bit words, so each run of groups
goes to the narrowest width that holds it (``KERNEL_BITS``: 5 and 6 to 8, 3 to 4), its codes moved up by
``2**(B-1) - 2**(b-1)``: then ``q' - 2**(B-1) = q - 2**(b-1)`` exactly, one constant zero per run and no zero
tensor. A run is a *segment*: one ``Packed`` with plain K order over its stored rows, float16 scales as
exllamav2 forms them (``exl2.row_scales``), one row per kernel group (the gcd of the run's group lengths; a longer
group repeats its row). At most three segments (8, 4 and 2-bit words), each run by the GPTQ variants M picks.

The cost against the file: the widened rows (3-bit rows take 4 bits, 5 and 6-bit rows 8) and a float16 scale per
32-row group and column where the file keeps a 4-bit code. ``to_q_weight`` recovers the file's words from the
segments, so the layer may drop ``q_weight`` once they exist. Plain torch; nothing here imports triton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..layouts import exl2
from .triton.layout import Packed, build, unpack_words

#: EXL2 width -> the GPTQ kernels' word width that runs it
KERNEL_BITS = {8: 8, 6: 8, 5: 8, 4: 4, 3: 4, 2: 2}


@dataclass(frozen=True)
class Segment:
    """Consecutive EXL2 groups run as one GPTQ layout: its word width, groups ``first .. first + count - 1``,
    stored rows ``row0 .. row0 + rows - 1`` and the rows of one kernel group."""

    bits: int
    first: int
    count: int
    row0: int
    rows: int
    group: int

    def shifts(self, p: exl2.Exl2Params) -> torch.Tensor:
        """Per stored row of the segment: what its code gains in the wider word (``2**(B-1) - 2**(b-1)``)."""
        widths = p.group_bits[self.first:self.first + self.count]
        lengths = p.group_rows[self.first:self.first + self.count]
        per_group = torch.tensor([(1 << (self.bits - 1)) - (1 << (b - 1)) for b in widths], dtype=torch.int16)
        return torch.repeat_interleave(per_group, torch.tensor(lengths))


def segments(p: exl2.Exl2Params, widths: dict[int, int] = KERNEL_BITS) -> tuple[Segment, ...]:
    """The runs of groups that share a kernel word width (``widths``: EXL2 width -> kernel width), in stored order
    (widths never increase in EXL2)."""
    spans: list[list[int]] = []  # [bits, first group, groups, first row, rows]
    row = 0
    for i, (b, r) in enumerate(zip(p.group_bits, p.group_rows)):
        kb = widths[b]
        if spans and spans[-1][0] == kb:
            spans[-1][2] += 1
            spans[-1][4] += r
        else:
            spans.append([kb, i, 1, row, r])
        row += r
    return tuple(Segment(kb, g0, ng, r0, nr, math.gcd(*p.group_rows[g0:g0 + ng])) for kb, g0, ng, r0, nr in spans)


def to_runtime(q_weight: torch.Tensor, scales: torch.Tensor, p: exl2.Exl2Params) -> list[Packed]:
    """One ``Packed`` per segment from the file's ``q_weight`` and the float16 group scales ``[G, N]``
    (``exl2.row_scales``), on ``q_weight``'s device."""
    codes = exl2.stored_codes(q_weight, p)  # uint8 [K, N]
    out = []
    for seg in segments(p):
        c = codes[seg.row0:seg.row0 + seg.rows].to(torch.int16) + seg.shifts(p).to(codes.device)[:, None]
        lengths = torch.tensor(p.group_rows[seg.first:seg.first + seg.count], device=scales.device)
        s = torch.repeat_interleave(scales[seg.first:seg.first + seg.count], lengths // seg.group, dim=0)
        zero = torch.full((1,), 1 << (seg.bits - 1), dtype=torch.int32)
        g_idx = torch.arange(seg.rows) // seg.group
        out.append(build(c.to(torch.uint8).t(), s.t(), zero, g_idx, seg.bits, scale_dtype=torch.float16))
    return out


def segment_codes(pk: Packed) -> torch.Tensor:
    """A segment's widened codes ``uint8 [rows, N]`` in its stored order (padding rows of irregular groups
    dropped)."""
    sorted_codes = unpack_words(pk.qweight, pk.bits, pk.rows_per_block)[:, :pk.n]
    if pk.perm is None:
        return sorted_codes[:pk.k]
    perm = pk.perm.to(torch.int64)
    live = perm >= 0
    out = torch.empty(pk.k, pk.n, dtype=torch.uint8, device=sorted_codes.device)
    out[perm[live]] = sorted_codes[live]
    return out


def to_q_weight(packs: list[Packed], p: exl2.Exl2Params) -> torch.Tensor:
    """``to_runtime`` undone: the file's ``q_weight`` int32, word for word."""
    segs = segments(p)
    if len(segs) != len(packs) or any(s.bits != pk.bits or s.rows != pk.k for s, pk in zip(segs, packs)):
        raise ValueError(f"to_q_weight: expected segments {[(s.bits, s.rows) for s in segs]} (bits, rows), got "
                         f"{[(pk.bits, pk.k) for pk in packs]}")
    parts = [(segment_codes(pk).to(torch.int16) - s.shifts(p).to(pk.qweight.device)[:, None])
             for s, pk in zip(segs, packs)]
    return exl2.pack_codes(torch.cat(parts), p)


@dataclass(frozen=True)
class XPlan:
    """Where each segment's sorted activations sit in the one gathered buffer: ``index`` (int32 input column per
    buffer column, -1 for padding), each segment's first column (even: its pairs load as int32) and width."""

    index: torch.Tensor
    offsets: tuple[int, ...]
    widths: tuple[int, ...]


def x_plan(packs: list[Packed], rows0: list[int], perm: torch.Tensor) -> XPlan:
    """The gather for ``packs`` (segment ``i`` covers stored rows ``rows0[i]..``; ``perm``: the input column of each
    stored row, int64 or int32): a segment's sorted row ``j`` reads stored row ``rows0[i] + pk.perm[j]`` (or ``j``
    without a sort), padded to an even width."""
    parts, offsets, widths, col = [], [], [], 0
    perm = perm.to(torch.int64).cpu()
    for pk, r0 in zip(packs, rows0):
        local = pk.perm.to(torch.int64).cpu() if pk.perm is not None else torch.arange(pk.k)
        idx = torch.where(local >= 0, perm[r0 + local.clamp(min=0)], -1)
        width = idx.numel() + idx.numel() % 2
        parts.append(torch.cat([idx, torch.full((width - idx.numel(),), -1, dtype=torch.int64)]))
        offsets.append(col)
        widths.append(idx.numel())
        col += width
    return XPlan(torch.cat(parts).to(torch.int32).to(packs[0].qweight.device), tuple(offsets), tuple(widths))
