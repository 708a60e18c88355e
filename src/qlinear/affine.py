"""The canonical integer-affine weight every GPTQ/AWQ-family layout converts to and from.

``w[n, k] = scales[n, g_idx[k]] * (codes[n, k] - zeros[n, g_idx[k]])`` with true zero points
(GPTQ v2 semantics). N layouts and M kernels meet here, so they need N + M converters, not N x M.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .spec import ConfigError


@dataclass(frozen=True, eq=False)
class AffineWeight:
    """Integer codes with per-group scales and true zero points, in the quantizer's orientation.

    codes ``[N, K]`` uint8, scales ``[N, G]`` float, zeros ``[N, G]`` int32, g_idx ``[K]`` int32.
    ``group_size`` is the length of a group in processing order (``K`` when channelwise).
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    bits: int
    group_size: int
    sym: bool

    def __post_init__(self) -> None:
        check_affine(self.codes, self.scales, self.zeros, self.g_idx, self.bits, self.group_size)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    @property
    def num_groups(self) -> int:
        return self.scales.shape[1]

    @property
    def desc_act(self) -> bool:
        """True when g_idx is not the plain ``k // group_size`` (act-order grouping)."""
        plain = torch.arange(self.in_features, dtype=torch.int32) // self.group_size
        return not torch.equal(self.g_idx.cpu(), plain)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[N, K]`` (computed in float32, then cast)."""
        g = self.g_idx.long()
        w = self.scales.float()[:, g] * (self.codes.float() - self.zeros.float()[:, g])
        return w.to(dtype)


def check_affine(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
                 bits: int, group_size: int) -> None:
    """Raise ``ValueError`` naming the tensor, what was expected and what was found."""
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ConfigError(f"bits must be an integer in 1..8; got {bits!r}")
    if codes.dim() != 2:
        raise ValueError(f"codes: expected a 2-D [out_features, in_features] tensor, got shape {tuple(codes.shape)}")
    n, k = codes.shape
    if not isinstance(group_size, int) or group_size <= 0:
        raise ConfigError(f"group_size must be a positive length here (-1 is resolved by Scheme); got {group_size!r}")
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes: expected dtype torch.uint8, got {codes.dtype}")
    if not scales.is_floating_point():
        raise ValueError(f"scales: expected a floating dtype, got {scales.dtype}")
    if scales.dim() != 2 or scales.shape[0] != n:
        raise ValueError(f"scales: expected shape [{n}, G] ([out_features, num_groups]), got {tuple(scales.shape)}")
    g = scales.shape[1]
    if tuple(zeros.shape) != (n, g):
        raise ValueError(f"zeros: expected shape [{n}, {g}] like scales, got {tuple(zeros.shape)}")
    if zeros.dtype.is_floating_point or zeros.dtype == torch.bool:
        raise ValueError(f"zeros: expected an integer dtype (true zero points), got {zeros.dtype}")
    if tuple(g_idx.shape) != (k,):
        raise ValueError(f"g_idx: expected shape [{k}] (one group id per input channel), got {tuple(g_idx.shape)}")
    if g_idx.dtype.is_floating_point:
        raise ValueError(f"g_idx: expected an integer dtype, got {g_idx.dtype}")
    maxq = (1 << bits) - 1
    if codes.numel() and int(codes.max()) > maxq:
        raise ValueError(f"codes: values must be in 0..{maxq} for {bits} bits; found {int(codes.max())}")
    if zeros.numel() and (int(zeros.min()) < 0 or int(zeros.max()) > maxq):
        raise ValueError(f"zeros: true zero points must be in 0..{maxq} for {bits} bits; "
                         f"found {int(zeros.min())}..{int(zeros.max())}")
    if k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= g):
        raise ValueError(f"g_idx: group ids must be in 0..{g - 1} (scales has {g} groups); "
                         f"found {int(g_idx.min())}..{int(g_idx.max())}")
    if not torch.isfinite(scales).all():
        bad = (~torch.isfinite(scales)).nonzero()[0].tolist()
        raise ValueError(f"scales: every scale must be finite; found {scales[bad[0], bad[1]].item()} at "
                         f"[out={bad[0]}, group={bad[1]}]")


def _grid(lo: torch.Tensor, hi: torch.Tensor, maxq: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ's scale and zero for a range ``[lo, hi]`` that holds 0 (per row)."""
    if sym:
        amax = torch.maximum(lo.abs(), hi)
        lo, hi = -amax, amax
    empty = (lo == 0) & (hi == 0)
    lo, hi = torch.where(empty, -1.0, lo), torch.where(empty, 1.0, hi)
    s = (hi - lo) / maxq
    z = torch.full_like(s, float((maxq + 1) // 2)) if sym else torch.round(-lo / s)
    return s, z


def _clip_search(block: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, maxq: int, sym: bool,
                 shrinks: torch.Tensor, norm: float = 2.4) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the range shrink factor minimising ``sum |w - deq(w)| ** norm`` (GPTQ's ``mse`` grid)."""
    best_err = torch.full_like(lo, float("inf"))
    best_lo, best_hi = lo.clone(), hi.clone()
    for p in shrinks.tolist():
        s, z = _grid(lo * p, hi * p, maxq, sym)
        q = torch.clamp(torch.round(block / s[:, None]) + z[:, None], 0, maxq)
        err = ((q - z[:, None]) * s[:, None] - block).abs_().pow_(norm).sum(1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_lo, best_hi = torch.where(better, lo * p, best_lo), torch.where(better, hi * p, best_hi)
    return best_lo, best_hi


def quantize_rtn(weight: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = True,
                 desc_act: bool = False, perm: torch.Tensor | None = None,
                 clip_search: bool = False) -> AffineWeight:
    """Round-to-nearest quantization with GPTQ's grid (scale and zero per group of ``group_size`` inputs).

    Asymmetric: ``s = (max - min) / maxq`` over a range that always holds 0, ``z = round(-min / s)``.
    Symmetric: ``s = 2 * absmax / maxq``, ``z = 2 ** (bits - 1)``. ``desc_act`` forms groups in the
    order ``perm`` (default: input channels by descending column norm, a data-free stand-in for
    GPTQ's Hessian order) and records them in ``g_idx``. ``clip_search`` shrinks each row's range
    by the factor in 1.0 .. 0.2 (steps of 0.01) that minimises the group's ``|error| ** 2.4``, as
    GPTQ's quantizer does with ``mse=True``: it costs 80 trial roundings per group and lowers the
    error of 4-bit weights noticeably.
    """
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D [out_features, in_features] tensor, got shape {tuple(weight.shape)}")
    if not weight.is_floating_point():
        raise ValueError(f"weight: expected a floating dtype, got {weight.dtype}")
    if not torch.isfinite(weight).all():
        raise ValueError("weight: contains NaN or infinity; cannot choose scales")
    n, k = weight.shape
    if group_size == -1 or group_size > k:
        group_size = k
    if not isinstance(bits, int) or not 1 <= bits <= 8:
        raise ConfigError(f"bits must be an integer in 1..8; got {bits!r}")
    if group_size <= 0:
        raise ConfigError(f"group_size must be -1 or a positive length; got {group_size}")
    w = weight.detach().to(torch.float32).cpu()
    if desc_act:
        if perm is None:
            perm = torch.argsort(w.pow(2).sum(0), descending=True, stable=True)
        perm = perm.to(torch.long).cpu()
        if sorted(perm.tolist()) != list(range(k)):
            raise ValueError(f"perm: expected a permutation of 0..{k - 1}")
    else:
        perm = torch.arange(k)
    g_count = -(-k // group_size)
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[perm] = (torch.arange(k) // group_size).to(torch.int32)
    maxq = (1 << bits) - 1
    scales = torch.empty(n, g_count)
    zeros = torch.empty(n, g_count, dtype=torch.int32)
    codes = torch.empty(n, k, dtype=torch.uint8)
    shrinks = 1.0 - torch.arange(80, dtype=torch.float64) / 100
    for g in range(g_count):
        cols = perm[g * group_size:(g + 1) * group_size]
        block = w[:, cols]
        lo = block.min(1).values.clamp(max=0)
        hi = block.max(1).values.clamp(min=0)
        if clip_search:
            lo, hi = _clip_search(block, lo, hi, maxq, sym, shrinks)
        s, z = _grid(lo, hi, maxq, sym)
        q = torch.clamp(torch.round(block / s[:, None]) + z[:, None], 0, maxq)
        scales[:, g], zeros[:, g] = s, z.to(torch.int32)
        codes[:, cols] = q.to(torch.uint8)
    return AffineWeight(codes=codes, scales=scales, zeros=zeros, g_idx=g_idx, bits=bits,
                        group_size=group_size, sym=sym)
