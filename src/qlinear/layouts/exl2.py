"""EXL2: ExLlamaV2's own mixed-bit checkpoint layout (``quant_method: "exl2"``), decoded exactly.

Facts from exllamav2 0.3.2 (``conversion/adaptivegptq.py`` ``pack``, ``exllamav2_ext/cuda/pack_tensor.cu``,
``q_matrix.cu``, ``quant/qdq_*.cuh``, ``ext.py`` ``make_q_matrix``, ``module.py``), per linear layer:

* ``q_weight [R, N]`` int32: row groups of one bit width each (2, 3, 4, 5, 6 or 8), every group packed
  along K by ``pack_columns`` as one little-endian bit stream per column (code ``i`` of the group at stream
  bits ``[b*i, b*i + b)``); a group of ``rows`` inputs takes ``ceil(rows * b / 32)`` word rows.
* ``q_groups [2G]`` int16: per group its bit width and its first word row in ``q_weight``. A group's rows
  are ``(next offset - offset) * 32 / b``; the last group takes the rest of K. The extension's kernels walk
  8, 6, 5, 4, 3, 2-bit rows in that order, so the widths never increase from one group to the next.
* ``q_scale [G, N/8]`` int32: 4-bit scale codes ``qs`` (``pack_rows_4`` stores ``qscale - 1``);
  ``q_scale_max [G]`` float16.
* ``q_invperm [K]`` int32 (some files also hold ``q_perm``, which the loader replaces by
  ``argsort(q_invperm)``): stored row ``i`` is input row ``q_perm[i]``.
* a weight is ``half(q - 2**(b-1)) * half(half((qs + 1)**2) * half(q_scale_max / 256))``, each product
  rounded to float16 (``make_q_matrix`` divides the float16 ``q_scale_max`` by 256; ``dq_scale``;
  ``__hmul2``). Every product is exact in float32 before its one rounding, so float32 math then ``.half()``
  reproduces it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

import torch

from .bitpack import pack_bits, unpack_bits

BITS = (8, 6, 5, 4, 3, 2)
INDEX_DTYPES = (torch.int32, torch.int16, torch.int64)


@dataclass(frozen=True)
class Exl2Params:
    """One EXL2 layer's structure, for ``Scheme.layout_params``: bit width and input rows of every group in
    stored order, and whether the file also holds ``q_perm``."""

    group_bits: tuple[int, ...]
    group_rows: tuple[int, ...]
    stored_perm: bool = False

    def __post_init__(self) -> None:
        if not self.group_bits or len(self.group_bits) != len(self.group_rows):
            raise ValueError(f"q_groups: expected one bit width per group and at least one group, got "
                             f"{len(self.group_bits)} widths for {len(self.group_rows)} row counts")
        for i, (b, r) in enumerate(zip(self.group_bits, self.group_rows)):
            if b not in BITS:
                raise ValueError(f"q_groups: group {i} has bit width {b}; EXL2 uses {sorted(BITS)}")
            if r <= 0:
                raise ValueError(f"q_groups: group {i} has {r} rows; expected a positive count")
            if i < len(self.group_bits) - 1 and r * b % 32:
                raise ValueError(f"q_groups: group {i} ({r} rows of {b} bits) does not fill whole int32 rows")
        if any(a < b for a, b in pairwise(self.group_bits)):
            raise ValueError(f"q_groups: bit widths {list(self.group_bits)} increase; exllamav2's kernels read "
                             "8, 6, 5, 4, 3, 2-bit groups in that order")

    @property
    def in_features(self) -> int:
        return sum(self.group_rows)

    @property
    def word_rows(self) -> tuple[int, ...]:
        """``q_weight`` rows of each group: ``ceil(rows * bits / 32)``."""
        return tuple(-(-r * b // 32) for b, r in zip(self.group_bits, self.group_rows))

    @property
    def max_bits(self) -> int:
        return max(self.group_bits)

    def q_groups(self) -> torch.Tensor:
        """The ``q_groups`` tensor the producer writes: (bits, first word row) per group, int16."""
        out, row = [], 0
        for b, w in zip(self.group_bits, self.word_rows):
            out += [b, row]
            row += w
        return torch.tensor(out, dtype=torch.int16)


def params_from(q_groups: torch.Tensor, word_rows: int, in_features: int, stored_perm: bool = False) -> Exl2Params:
    """Read ``q_groups`` (and the ``q_weight`` height, K) into ``Exl2Params``, as ``QMatrix`` does."""
    if q_groups.dim() != 1 or q_groups.numel() % 2 or q_groups.numel() == 0 or q_groups.dtype.is_floating_point:
        raise ValueError(f"q_groups: expected a 1-D integer tensor of (bits, row) pairs, got shape "
                         f"{list(q_groups.shape)} dtype {q_groups.dtype}")
    g = [int(v) for v in q_groups.tolist()]
    bits, offsets = g[0::2], g[1::2]
    if offsets[0] != 0 or any(b < a for a, b in pairwise(offsets)) or offsets[-1] >= word_rows:
        raise ValueError(f"q_groups: word-row offsets {offsets} must start at 0, not decrease and stay below "
                         f"q_weight's {word_rows} rows")
    for i, b in enumerate(bits):
        if b not in BITS:
            raise ValueError(f"q_groups: group {i} has bit width {b}; EXL2 uses {sorted(BITS)}")
    rows = [(offsets[i + 1] - offsets[i]) * 32 // bits[i] for i in range(len(bits) - 1)]
    rows.append(in_features - sum(rows))
    params = Exl2Params(tuple(bits), tuple(rows), stored_perm)
    if sum(params.word_rows) != word_rows:
        raise ValueError(f"q_weight: expected {sum(params.word_rows)} rows for groups {list(zip(bits, rows))} of "
                         f"K={in_features}, found {word_rows}")
    return params


def checkpoint_shapes(p: Exl2Params, out_features: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Tensor name -> (shape, dtype) of one EXL2 layer (without bias)."""
    g, k = len(p.group_bits), p.in_features
    shapes = {"q_weight": ((sum(p.word_rows), out_features), torch.int32),
              "q_invperm": ((k,), torch.int32),
              "q_scale": ((g, out_features // 8), torch.int32),
              "q_scale_max": ((g,), torch.float16),
              "q_groups": ((2 * g,), torch.int16)}
    if p.stored_perm:
        shapes["q_perm"] = ((k,), torch.int32)
    return shapes


def check_tensors(tensors: Mapping[str, torch.Tensor], p: Exl2Params, out_features: int) -> None:
    """Raise ``ValueError`` naming the tensor unless the layer's tensors have the shapes ``p`` implies, a valid
    permutation, the producer's ``q_groups`` and finite ``q_scale_max``."""
    for name, (shape, dtype) in checkpoint_shapes(p, out_features).items():
        t = tensors.get(name)
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: missing (an EXL2 layer needs {', '.join(checkpoint_shapes(p, out_features))})")
        ok_dtype = t.dtype in INDEX_DTYPES if name in ("q_invperm", "q_perm") else t.dtype == dtype
        if tuple(t.shape) != shape or not ok_dtype:
            raise ValueError(f"{name}: expected shape {list(shape)} dtype {dtype}, got shape {list(t.shape)} "
                             f"dtype {t.dtype}")
    if not torch.equal(tensors["q_groups"].cpu().to(torch.int16), p.q_groups()):
        raise ValueError(f"q_groups: expected {p.q_groups().tolist()} for this layer, found "
                         f"{tensors['q_groups'].tolist()}")
    inv = tensors["q_invperm"].to(torch.int64).cpu()
    if not torch.equal(torch.sort(inv).values, torch.arange(inv.numel())):
        raise ValueError(f"q_invperm: expected a permutation of 0..{inv.numel() - 1}")
    if not bool(torch.isfinite(tensors["q_scale_max"]).all()):
        raise ValueError("q_scale_max: found NaN or infinite values; expected finite float16 scales")


def row_scales(q_scale: torch.Tensor, q_scale_max: torch.Tensor, out_features: int) -> torch.Tensor:
    """Group scales ``[G, N]`` float16 as ``dq_scale`` forms them from the stored codes and maxima."""
    qs = unpack_bits(q_scale, 4, out_features, dim=1, name="q_scale").to(torch.float32) + 1
    msc = (q_scale_max.to(torch.float32) * (1 / 256)).to(torch.float16)  # make_q_matrix: q_scale_max *= 1/256
    return (qs * qs * msc.to(torch.float32)[:, None]).to(torch.float16)


def runs(p: Exl2Params) -> list[tuple[int, int, int, int, int]]:
    """Consecutive groups of one width as ``(bits, first group, groups, first word row, word rows)``: every group
    but the last fills whole words, so such a run is one continuous bit stream (one unpack instead of one per group)."""
    out: list[tuple[int, int, int, int, int]] = []
    word = 0
    for i, (b, w) in enumerate(zip(p.group_bits, p.word_rows)):
        if out and out[-1][0] == b:
            bb, g0, ng, w0, nw = out[-1]
            out[-1] = (bb, g0, ng + 1, w0, nw + w)
        else:
            out.append((b, i, 1, word, w))
        word += w
    return out


def row_groups(p: Exl2Params) -> torch.Tensor:
    """The group of every stored row, ``[K]`` int64 (on CPU; a kernel keeps a device copy)."""
    return torch.repeat_interleave(torch.arange(len(p.group_rows)), torch.tensor(p.group_rows))


def decode_group_cols(q_weight: torch.Tensor, p: Exl2Params, scales: torch.Tensor, n0: int, n1: int,
                      groups: torch.Tensor | None = None) -> torch.Tensor:
    """Weights ``[K, n1 - n0]`` float16 of columns ``n0:n1`` in STORED row order (``scales`` from ``row_scales``,
    ``groups`` from ``row_groups`` on ``q_weight``'s device, or None to build it here)."""
    gid = row_groups(p).to(q_weight.device) if groups is None else groups
    parts, row = [], 0
    for b, g0, ng, w0, nw in runs(p):
        r = sum(p.group_rows[g0:g0 + ng])
        codes = unpack_bits(q_weight[w0:w0 + nw, n0:n1], b, r, dim=0, name="q_weight").to(torch.float32)
        parts.append(((codes - (1 << (b - 1))) * scales[gid[row:row + r], n0:n1].to(torch.float32)).to(torch.float16))
        row += r
    return torch.cat(parts)


def dequantize(tensors: Mapping[str, torch.Tensor], p: Exl2Params, out_features: int) -> torch.Tensor:
    """The float16 weight ``[N, K]`` in input order (input row ``j`` is stored row ``q_invperm[j]``)."""
    check_tensors(tensors, p, out_features)
    scales = row_scales(tensors["q_scale"], tensors["q_scale_max"], out_features)
    w = decode_group_cols(tensors["q_weight"], p, scales, 0, out_features)
    return w[tensors["q_invperm"].to(torch.int64)].t().contiguous()


def encode(codes_kn: torch.Tensor, scale_codes: torch.Tensor, q_scale_max: torch.Tensor, perm: torch.Tensor,
           p: Exl2Params, stored_perm: bool = False) -> dict[str, torch.Tensor]:
    """Pack codes ``[K, N]`` (stored row order, unsigned), scale codes ``qs`` ``[G, N]`` (0..15) and maxima ``[G]``
    into the checkpoint tensors, as ``AdaptiveGPTQ.pack`` lays them out (``perm``: input row of each stored row)."""
    out = {"q_weight": pack_codes(codes_kn, p), "q_invperm": torch.argsort(perm).to(torch.int32),
           "q_scale": pack_bits(scale_codes.to(torch.uint8).contiguous(), 4, torch.int32, dim=1),
           "q_scale_max": q_scale_max.to(torch.float16), "q_groups": p.q_groups()}
    if stored_perm:
        out["q_perm"] = perm.to(torch.int32)
    return out


def stored_codes(q_weight: torch.Tensor, p: Exl2Params) -> torch.Tensor:
    """Every group's unsigned codes ``uint8 [K, N]`` in stored row order (one unpack per run of one width)."""
    parts = []
    for b, g0, ng, w0, nw in runs(p):
        r = sum(p.group_rows[g0:g0 + ng])
        parts.append(unpack_bits(q_weight[w0:w0 + nw], b, r, dim=0, name="q_weight").to(torch.uint8))
    return torch.cat(parts)


def pack_codes(codes_kn: torch.Tensor, p: Exl2Params) -> torch.Tensor:
    """``stored_codes`` undone: unsigned codes ``[K, N]`` (stored row order) -> ``q_weight`` int32, each group packed
    along K as ``pack_columns`` does; raises ``ValueError`` naming the rows if a code does not fit its group."""
    if codes_kn.dim() != 2 or codes_kn.shape[0] != p.in_features:
        raise ValueError(f"codes: expected [{p.in_features}, N], got shape {list(codes_kn.shape)}")
    words, row = [], 0
    for b, r in zip(p.group_bits, p.group_rows):
        c = codes_kn[row:row + r]
        if int(c.max()) >= 1 << b or int(c.min()) < 0:
            raise ValueError(f"codes: rows {row}..{row + r - 1} hold values outside 0..{(1 << b) - 1} ({b}-bit group)")
        words.append(pack_bits(c.to(torch.uint8).contiguous(), b, torch.int32, dim=0))
        row += r
    return torch.cat(words)
