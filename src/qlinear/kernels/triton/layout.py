"""The Triton kernels' runtime layout, derived from the canonical affine weight (kernel-private, never saved).

* Input channels are sorted by group once, here (act-order undone): ``perm [KP]`` int32 maps sorted
  row -> input channel (``-1`` for padding rows), or is None for the identity. Kernels gather
  activations through it; the dense path scatters weight rows through it.
* ``qweight [KW, NP]`` int32, ``PF = 32 // bits`` codes per word, **field-blocked**: word rows come in
  blocks of ``R`` (``rows_per_block``, 1..8); field ``j`` of word row ``w`` holds sorted row
  ``k(j, w) = (w // R) * R * PF + j * R + w % R``. So field ``j`` of ``R`` consecutive word rows is ``R``
  consecutive channels: a dequantized ``[PF, BKW, BN]`` tile flattens to contiguous K runs, the GEMV
  reads each field's activations as one vector, and no kernel needs a 3-D layout shuffle. Rows of
  words are contiguous along N: one 128-bit load feeds 4 columns.
* Groups are contiguous runs of ``group`` sorted rows; ``R * PF`` divides ``group``, so a word's
  fields share one group. Regular g_idx (plain or GPTQ act-order) needs no padding; an irregular one
  pads every group to the largest.
* ``scales [G, NP]`` in the checkpoint's scale dtype; ``zeros [G, NP]`` uint8 true zeros, or None
  when every zero is one constant (symmetric weights), which the kernels take as a compile-time value.
* ``NP`` is N rounded up to 16: every row 64-byte aligned (vector loads, no N mask on whole tiles).
* ``offsets [G, NP]`` in the scales' dtype, only for weights ``s * q + o`` with a float ``o`` (GGUF's Q4_1/Q4_K
  minimums in float32, MLX's biases in their own dtype: ``build_affine``); then zeros are the constant 0 and the
  kernels add ``o`` per group.
* ``xorder [KF]`` int32, only for 4-bit words in groups of exactly 32 (field blocks of 4 word rows): the input
  channel that position ``i`` of gemm5's A fragment reads (``fragment_order.py``: ``KF`` = KP rounded up to 64;
  padding rows inside KP are ``-1``, positions past KP, whose weights are 0, read channel 0). Built here, once,
  so a forward gathers x with one launch (``gather.py``; also inside a CUDA graph).
* ``supers [2 ceil(G / 8), NP]`` float32, only for K-quant super-blocks (``build_kquant``): scales and offsets
  are then the blocks' own uint8 sub-scales ``sc`` and mins ``m``, and the kernels take ``s = d sc`` and
  ``o = -dmin m`` with rows ``2i, 2i + 1`` = ``d, -dmin`` of super-group ``i = g // 8`` (exact in float32:
  11 x 6 significant bits): about 2.1 bytes per 32 weights next to the float32 pair's 8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .configs import CHANNELWISE

N_ALIGN = 16
MAX_BLOCK_ROWS = 8
#: 32-value groups per super-scale pair (K-quants' 256-value super-blocks; ``build_kquant``)
SUPER_GROUPS = 8


@dataclass(frozen=True)
class Packed:
    """Runtime tensors plus the facts the kernels specialise on."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    perm: torch.Tensor | None
    bits: int
    k: int
    n: int
    group: int
    zero_const: int
    rows_per_block: int
    offsets: torch.Tensor | None = None
    supers: torch.Tensor | None = None
    xorder: torch.Tensor | None = None

    @property
    def kw(self) -> int:
        """Word rows."""
        return self.qweight.shape[0]

    @property
    def kp(self) -> int:
        """Sorted (and padded) rows: a multiple of ``rows_per_block * 32 // bits``."""
        return self.kw * (32 // self.bits)

    @property
    def np(self) -> int:
        return self.qweight.shape[1]

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"qweight": self.qweight, "scales": self.scales, "zeros": self.zeros, "perm": self.perm,
                "offsets": self.offsets, "supers": self.supers, "xorder": self.xorder}

    def offset_arg(self) -> torch.Tensor:
        """The offsets pointer a launcher passes (the scales stand in when there are none; never read)."""
        return self.offsets if self.offsets is not None else self.scales

    def super_arg(self) -> torch.Tensor:
        """The super-scales pointer a launcher passes (the scales stand in when there are none; never read)."""
        return self.supers if self.supers is not None else self.scales

    def meta(self) -> tuple[int, int, int, int, int, int]:
        return (self.bits, self.k, self.n, self.group, self.zero_const, self.rows_per_block)

    def with_tensors(self, **tensors: torch.Tensor | None) -> Packed:
        """The same layout over other tensors of the same shapes (after a device move, or for copies)."""
        cur = self.tensors()
        cur.update(tensors)
        return Packed(cur["qweight"], cur["scales"], cur["zeros"], cur["perm"], *self.meta(), offsets=cur["offsets"],
                      supers=cur["supers"], xorder=cur["xorder"])


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def sort_rows(g_idx: torch.Tensor, num_groups: int, pf: int) -> tuple[torch.Tensor, int]:
    """``(perm, group length)``: channels sorted by group (stable), every group padded to the largest
    when the groups are irregular (padding rows are ``-1``)."""
    k = g_idx.numel()
    g_idx = g_idx.to(torch.int64).cpu()
    if num_groups == 1:
        return torch.arange(k), CHANNELWISE
    counts = torch.bincount(g_idx, minlength=num_groups)
    order = torch.sort(g_idx, stable=True).indices
    gs = int(counts[0])
    if gs % pf == 0 and bool((counts[:-1] == gs).all()) and 1 <= int(counts[-1]) <= gs:
        return order, gs
    group = _round_up(max(1, int(counts.max())), pf)
    perm = torch.full((num_groups * group,), -1, dtype=torch.int64)
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(k) - starts[g_idx[order]]
    perm[g_idx[order] * group + within] = order
    return perm, group


def block_rows(group: int, pf: int) -> int:
    """Word rows per field block: the largest power of two <= 8 whose block of codes divides a group."""
    r = MAX_BLOCK_ROWS
    while r > 1 and group % (r * pf):
        r //= 2
    return r


def pack_words(codes_kn: torch.Tensor, bits: int, rows: int) -> torch.Tensor:
    """Sorted codes ``[KP, NP]`` -> field-blocked int32 words ``[KP / PF, NP]`` (``rows`` = R)."""
    pf = 32 // bits
    kp, n = codes_kn.shape
    c = codes_kn.reshape(kp // (rows * pf), pf, rows, n).transpose(1, 2).reshape(kp // pf, pf, n)
    words = torch.zeros(kp // pf, n, dtype=torch.int64, device=codes_kn.device)
    for j in range(pf):  # one field at a time keeps the transient at one int64 per output word
        words |= c[:, j].to(torch.int64) << (bits * j)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def unpack_words(words: torch.Tensor, bits: int, rows: int) -> torch.Tensor:
    """``pack_words`` undone: field-blocked int32 words ``[KP / PF, NP]`` -> sorted codes uint8 ``[KP, NP]``."""
    pf = 32 // bits
    kw, n = words.shape
    w = words.to(torch.int64) & 0xFFFFFFFF
    c = torch.stack([(w >> (bits * j)) & ((1 << bits) - 1) for j in range(pf)], dim=1)  # [KW, PF, NP]
    return c.reshape(kw // rows, rows, pf, n).transpose(1, 2).reshape(kw * pf, n).to(torch.uint8)


def kquant_fields(p: Packed) -> tuple[torch.Tensor, ...]:
    """``build_kquant`` undone: ``(codes uint8 [N, K], sc, mins uint8 [N, K / 32], d, dmin float32 [N, K / 256])``,
    exactly the values it was built from."""
    if p.supers is None or p.offsets is None or p.perm is not None or p.bits != 4:
        raise ValueError("kquant_fields: expected a layout from build_kquant (4-bit, plain K order, uint8 "
                         "sub-scales and mins, float32 super-scales)")
    g, g8 = -(-p.k // 32), -(-p.k // (32 * SUPER_GROUPS))
    codes = unpack_words(p.qweight, p.bits, p.rows_per_block)[:p.k, :p.n].t()
    sup = p.supers.reshape(-1, 2, p.np)[:g8, :, :p.n]
    return (codes, p.scales[:g, :p.n].t(), p.offsets[:g, :p.n].t(), sup[:, 0].t(), -sup[:, 1].t())


def build(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, bits: int,
          scale_dtype: torch.dtype = torch.float16) -> Packed:
    """The runtime layout of a canonical weight (codes ``[N, K]``, scales/zeros ``[N, G]``, g_idx ``[K]``)."""
    if bits not in (2, 4, 8):
        raise ValueError(f"bits: the Triton kernels run 2, 4 or 8-bit codes, got {bits}")
    n, k = codes.shape
    pf = 32 // bits
    perm, group = sort_rows(g_idx, scales.shape[1], pf)
    rows = block_rows(group, pf)
    kp = _round_up(perm.numel(), rows * pf)
    perm = torch.cat([perm, torch.full((kp - perm.numel(),), -1, dtype=torch.int64)]).to(torch.int32)
    identity = bool((perm[:k] == torch.arange(k)).all()) and bool((perm[k:] < 0).all())
    dev = codes.device
    npad = _round_up(n, N_ALIGN)
    codes_kn = torch.zeros(kp, npad, dtype=torch.uint8, device=dev)
    codes_kn[:, :n] = codes.t()[perm.clamp(min=0).long().to(dev)]
    codes_kn[(perm < 0).to(dev)] = 0
    s = torch.zeros(scales.shape[1], npad, dtype=scale_dtype, device=dev)
    s[:, :n] = scales.t().to(scale_dtype)
    zc = int(zeros.flatten()[0]) if zeros.numel() else 0
    z = None
    if zeros.numel() and not bool((zeros == zc).all()):
        z = torch.zeros(scales.shape[1], npad, dtype=torch.uint8, device=dev)
        z[:, :n] = zeros.t().to(torch.uint8)
        zc = 0  # unused with a zeros tensor; one value keeps the compiled variants few
    words = pack_words(codes_kn, bits, rows)
    xorder = fragment_x_order(None if identity else perm, k, kp).to(dev) if (bits, rows, group) == (4, 4, 32) else None
    return Packed(words, s, z, None if identity else perm.to(dev), bits, k, n, group, zc, rows, xorder=xorder)


#: sorted rows of one block of gemm5's A fragment (8 word rows of 8 fields) and of a group-32 field block
FRAGMENT_ROWS = 64
FRAGMENT_GROUP = 32


def fragment_x_order(perm: torch.Tensor | None, k: int, kp: int) -> torch.Tensor:
    """``xorder`` (see the module docstring): fragment position ``64 c + 8 j + r`` reads sorted row
    ``64 c + 32 (r // 4) + 4 j + r % 4`` (field ``j`` of word row ``r`` in field blocks of 4), mapped through
    ``perm`` (sorted row -> input channel)."""
    kf = _round_up(kp, FRAGMENT_ROWS)
    i = torch.arange(kf)
    block, j, r = i // FRAGMENT_ROWS, i % FRAGMENT_ROWS // 8, i % 8
    row = block * FRAGMENT_ROWS + FRAGMENT_GROUP * (r // 4) + 4 * j + r % 4
    chan = perm.to(torch.int64).cpu() if perm is not None else torch.where(torch.arange(kp) < k, torch.arange(kp), -1)
    return torch.where(row < kp, chan[row.clamp(max=kp - 1)], 0).to(torch.int32)


def build_affine(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, bits: int, group_size: int,
                 param_dtype: torch.dtype = torch.float32) -> Packed:
    """The runtime layout of weights ``scales * codes + offsets`` in groups of ``group_size`` along K (codes
    ``[N, K]`` in ``bits``-bit words, 2, 4 or 8; scales/offsets ``[N, K / group_size]``, kept in ``param_dtype``:
    choose one that holds them exactly): plain K order, constant zero 0."""
    n, k = codes.shape
    g = scales.shape[1]
    p = build(codes, scales, torch.zeros(1, dtype=torch.int32), torch.arange(k) // group_size, bits,
              scale_dtype=param_dtype)
    o = torch.zeros(g, p.np, dtype=param_dtype, device=codes.device)
    o[:, :n] = offsets.t().to(param_dtype)
    return Packed(p.qweight, p.scales, None, p.perm, bits, k, n, p.group, 0, p.rows_per_block, offsets=o,
                  xorder=p.xorder)


def build_affine32(codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, bits: int = 4) -> Packed:
    """``build_affine`` in groups of 32 with float32 scales and offsets (exact GGUF values)."""
    return build_affine(codes, scales.float(), offsets, bits, 32)


def build_kquant(codes: torch.Tensor, sc: torch.Tensor, mins: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor,
                 bits: int = 4) -> Packed:
    """The runtime layout of K-quant weights ``d sc q - dmin m`` (codes ``[N, K]``; ``sc``, ``mins`` uint8
    ``[N, K / 32]``; ``d``, ``dmin`` float32 ``[N, K / 256]``, the blocks' float16 values): plain K order,
    constant zero 0, the sub-scales and mins kept as uint8 with a float32 pair per super-group."""
    n, k = codes.shape
    g = sc.shape[1]
    if sc.dtype != torch.uint8 or mins.dtype != torch.uint8 or tuple(mins.shape) != (n, g):
        raise ValueError(f"sc, mins: expected uint8 [{n}, {g}], got {sc.dtype} {list(sc.shape)} and "
                         f"{mins.dtype} {list(mins.shape)}")
    g8 = -(-g // SUPER_GROUPS)
    if tuple(d.shape) != (n, g8) or tuple(dmin.shape) != (n, g8):
        raise ValueError(f"d, dmin: expected [{n}, {g8}] (one per {SUPER_GROUPS} groups of 32), got "
                         f"{list(d.shape)} and {list(dmin.shape)}")
    p = build(codes, sc, torch.zeros(1, dtype=torch.int32), torch.arange(k) // 32, bits, scale_dtype=torch.uint8)
    o = torch.zeros(g, p.np, dtype=torch.uint8, device=codes.device)
    o[:, :n] = mins.t()
    sup = torch.zeros(g8, 2, p.np, dtype=torch.float32, device=codes.device)
    sup[:, 0, :n] = d.t().float()
    sup[:, 1, :n] = -dmin.t().float()
    return Packed(p.qweight, p.scales, None, p.perm, bits, k, n, p.group, 0, p.rows_per_block, offsets=o,
                  supers=sup.reshape(2 * g8, p.np), xorder=p.xorder)


def one_group(p: Packed, block_k: int) -> bool:
    """Does every K step of ``block_k`` codes lie inside one group (one scale row per step)?"""
    return block_k <= p.rows_per_block * (32 // p.bits) or p.group % block_k == 0
