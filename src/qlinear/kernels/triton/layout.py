"""The Triton kernels' runtime layout, derived from the canonical affine weight (kernel-private, never saved).

* ``qweight [KW, NP]`` int32: input channels sorted by group (act-order undone once, here), packed along
  K: word ``r`` field ``j`` (bits ``b*j..``) holds sorted row ``r*PF + j``, ``PF = 32 // b``. A row of
  words is contiguous along N, so one 128-bit load feeds 4 columns x PF rows.
* ``perm [KP]`` int32 (or None for the identity): sorted row -> input channel, ``-1`` for padding rows.
  Kernels gather activations by it; the dense path scatters weight rows by it.
* groups are contiguous runs of ``group`` sorted rows: row ``r`` is in group ``r // group``. Regular
  g_idx (plain or GPTQ act-order) needs no padding; an irregular one pads every group to the largest.
* ``scales [G, NP]`` in the checkpoint's scale dtype; ``zeros [G, NP]`` uint8 true zeros, or None when
  every zero equals one constant (symmetric weights), which the kernels then take as a compile-time value.
* ``NP`` is N rounded up to 16 so every row starts 64-byte aligned (vector loads, no N mask needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .configs import CHANNELWISE

N_ALIGN = 16


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

    @property
    def kp(self) -> int:
        """Sorted (and padded) rows: a multiple of ``32 // bits``."""
        return self.qweight.shape[0] * (32 // self.bits)

    @property
    def np(self) -> int:
        return self.qweight.shape[1]

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"qweight": self.qweight, "scales": self.scales, "zeros": self.zeros, "perm": self.perm}

    def with_tensors(self, **tensors: torch.Tensor | None) -> Packed:
        """The same layout over other tensors of the same shapes (after a device move, or for copies)."""
        cur = self.tensors()
        cur.update(tensors)
        return Packed(cur["qweight"], cur["scales"], cur["zeros"], cur["perm"], self.bits, self.k, self.n,
                      self.group, self.zero_const)


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def sort_rows(g_idx: torch.Tensor, num_groups: int, pf: int) -> tuple[torch.Tensor, int, bool]:
    """``(perm [KP], group length, identity?)``: channels sorted by group, padded where irregular."""
    k = g_idx.numel()
    g_idx = g_idx.to(torch.int64).cpu()
    if num_groups == 1:
        perm, group = torch.arange(k), CHANNELWISE
    else:
        counts = torch.bincount(g_idx, minlength=num_groups)
        order = torch.sort(g_idx, stable=True).indices
        gs = int(counts[0])
        regular = (gs % pf == 0 and bool((counts[:-1] == gs).all())
                   and 1 <= int(counts[-1]) <= gs)
        if regular:
            perm, group = order, gs
        else:  # pad every group to the largest one (rounded to whole words); padding rows read x = 0
            group = _round_up(max(1, int(counts.max())), pf)
            perm = torch.full((num_groups * group,), -1, dtype=torch.int64)
            starts = torch.cumsum(counts, 0) - counts
            within = torch.arange(k) - starts[g_idx[order]]
            perm[g_idx[order] * group + within] = order
    kp = _round_up(perm.numel(), pf)
    if kp > perm.numel():
        perm = torch.cat([perm, torch.full((kp - perm.numel(),), -1, dtype=torch.int64)])
    identity = perm.numel() >= k and bool((perm[:k] == torch.arange(k)).all()) and bool((perm[k:] < 0).all())
    return perm.to(torch.int32), group, identity


def pack_words(codes_kn: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``[KP, NP]`` (KP a multiple of ``32 // bits``) -> int32 words ``[KP / PF, NP]`` along K."""
    pf = 32 // bits
    kp, n = codes_kn.shape
    c = codes_kn.reshape(kp // pf, pf, n)
    words = torch.zeros(kp // pf, n, dtype=torch.int64, device=codes_kn.device)
    for j in range(pf):  # one field at a time keeps the transient at one int64 word per output word
        words |= c[:, j].to(torch.int64) << (bits * j)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def build(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor, bits: int,
          scale_dtype: torch.dtype = torch.float16) -> Packed:
    """The runtime layout of a canonical weight (codes ``[N, K]``, scales/zeros ``[N, G]``, g_idx ``[K]``)."""
    if bits not in (2, 4, 8):
        raise ValueError(f"bits: the Triton kernels run 2, 4 or 8-bit codes, got {bits}")
    n, k = codes.shape
    pf = 32 // bits
    perm, group, identity = sort_rows(g_idx, scales.shape[1], pf)
    dev = codes.device
    npad = _round_up(n, N_ALIGN)
    pad_rows = (perm < 0).to(dev)
    sorted_kn = codes.t()[perm.clamp(min=0).long().to(dev)].to(torch.uint8)  # [KP, N]
    sorted_kn[pad_rows] = 0
    codes_kn = torch.zeros(perm.numel(), npad, dtype=torch.uint8, device=dev)
    codes_kn[:, :n] = sorted_kn
    del sorted_kn
    s = torch.zeros(scales.shape[1], npad, dtype=scale_dtype, device=dev)
    s[:, :n] = scales.t().to(scale_dtype)
    zc = int(zeros.flatten()[0]) if zeros.numel() else 0
    z = None
    if zeros.numel() and not bool((zeros == zc).all()):
        z = torch.zeros(scales.shape[1], npad, dtype=torch.uint8, device=dev)
        z[:, :n] = zeros.t().to(torch.uint8)
    perm_t = None if identity else perm.to(dev)
    return Packed(pack_words(codes_kn, bits), s, z, perm_t, bits, k, n, group, zc)
