"""VPTQ layout: packed vector indices into per-group codebooks (Microsoft VPTQ's ``VQuantLinear``, GPTQModel's
``VPTQLinear``).

A weight ``[N, K]`` is cut along ``N`` into vectors of ``vector_len`` rows (``N`` padded up to a multiple). Input
columns are split into ``outlier_size`` outlier columns first (own codebook, vector length ``outlier_vector_len``),
then ``group_num`` groups of ``group_size`` columns (one codebook each; GPTQModel zero-pads the last group, whose
padding columns are dropped). Module tensors, as stored:

| tensor | shape | dtype | holds |
|---|---|---|---|
| ``indices`` | ``[G, ceil(N/v), ceil(gs*b/32)]`` | int32 | per (group, vector): ``gs`` ``b``-bit codes (below) |
| ``centroids.weight`` | ``[G, C*v]`` | float16/bfloat16 | codebook ``g``: ``C`` vectors of ``v`` values |
| ``res_centroids.weight`` | ``[G, R*v]`` | as centroids | residual codebooks (``num_res_centroids > 0``) |
| ``outlier_centroids.weight`` | ``[1, Co*vo]`` | as centroids | outlier codebook |
| ``outlier_indices`` | ``[1, ceil(N/vo), outlier_size]`` | int16 or int32 | one code per (vector, column) |
| ``perm`` | ``[K]`` | int16 or int32/int64 | input-channel permutation |
| ``weight_scale``, ``weight_bias`` | ``[K]`` | as centroids | per input channel norm |

A row of ``indices`` is one LSB-first bit stream of ``b = log2 C + log2 R`` bit codes, code ``t`` at bit ``t b``
(it may straddle two words), each ``(res << log2 C) | main``. VPTQ stores ``outlier_indices`` and ``perm`` as
int16 holding uint16 bits; GPTQModel as int32 (and may norm per output channel, ``norm_dim=1``: ``[N]``).

Dequantization, in the codebook dtype with one rounding per operation as both producers do: ``w = c[idx] (+
r[res])``, padding rows dropped, outlier columns put first, columns past ``K`` dropped, columns reordered by the
inverse permutation (``w[:, argsort(perm)]``), then ``w * weight_scale + weight_bias``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..spec import Scheme

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
AUX_DTYPES = (torch.int16, torch.int32, torch.int64)


class VptqLayoutError(ValueError):
    """A VPTQ tensor or parameter that no VPTQ layer can hold (names the tensor, the expected and the found)."""


@dataclass(frozen=True)
class VptqParams:
    """One VPTQ layer's structure (``Scheme.layout_params``): codebook sizes, vector lengths and groups.

    ``num_res_centroids`` <= 0 and ``outlier_size`` == 0 disable the residual and outlier codebooks.
    ``aux_dtype`` is how ``outlier_indices`` and ``perm`` are stored (int16: VPTQ's uint16 bits; int32: GPTQModel).
    """

    vector_len: int
    num_centroids: int
    group_num: int
    group_size: int
    num_res_centroids: int = -1
    outlier_size: int = 0
    outlier_vector_len: int = -1
    outlier_num_centroids: int = -1
    enable_norm: bool = False
    norm_dim: int = 0
    enable_perm: bool = False
    codebook_dtype: torch.dtype = torch.float16
    aux_dtype: torch.dtype = torch.int16

    def __post_init__(self) -> None:
        errors = self.errors()
        if errors:
            raise VptqLayoutError("VPTQ parameters: " + "; ".join(errors))

    def errors(self) -> list[str]:
        out = []
        for name in ("vector_len", "group_num", "group_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                out.append(f"{name} must be a positive integer, got {v!r}")
        for name in ("num_centroids", "num_res_centroids"):
            v = getattr(self, name)
            if name == "num_res_centroids" and v <= 0:
                continue
            if not isinstance(v, int) or v < 2 or v & (v - 1):
                out.append(f"{name} must be a power of two of at least 2 (its codes have log2 bits), got {v!r}")
        if not out and self.total_bits > 32:
            out.append(f"index bits {self.index_bits} + residual bits {self.res_bits} exceed 32")
        if self.outlier_size < 0:
            out.append(f"outlier_size must be >= 0, got {self.outlier_size}")
        if self.outlier_size > 0 and (self.outlier_vector_len < 1 or self.outlier_num_centroids < 1):
            out.append(f"outlier_size {self.outlier_size} needs outlier_vector_len >= 1 and outlier_num_centroids "
                       f">= 1, got {self.outlier_vector_len} and {self.outlier_num_centroids}")
        if self.norm_dim not in (0, 1):
            out.append(f"norm_dim must be 0 (per input channel) or 1 (per output channel), got {self.norm_dim}")
        if self.codebook_dtype not in FLOAT_DTYPES:
            out.append(f"codebook dtype must be float16, bfloat16 or float32, got {self.codebook_dtype}")
        if self.aux_dtype not in AUX_DTYPES:
            out.append(f"outlier_indices/perm dtype must be int16, int32 or int64, got {self.aux_dtype}")
        return out

    @property
    def index_bits(self) -> int:
        return int(math.log2(self.num_centroids))

    @property
    def res_bits(self) -> int:
        return int(math.log2(self.num_res_centroids)) if self.residual else 0

    @property
    def total_bits(self) -> int:
        return self.index_bits + self.res_bits

    @property
    def residual(self) -> bool:
        return self.num_res_centroids > 0

    @property
    def outlier(self) -> bool:
        return self.outlier_size > 0

    @property
    def words(self) -> int:
        """int32 words per packed (group, vector) row."""
        return -(-self.group_size * self.total_bits // 32)

    def nominal_bits(self) -> int:
        """Bits per weight as GPTQModel labels a layer: ``ceil((index + residual bits) / vector_len)`` in 1..8."""
        return max(1, min(8, math.ceil(self.total_bits / self.vector_len)))


def params_of(scheme: Scheme) -> VptqParams:
    p = scheme.layout_params
    if not isinstance(p, VptqParams):
        raise VptqLayoutError(f"layout_params: a VPTQ layer needs VptqParams, got {type(p).__name__}")
    return p


def shape_errors(p: VptqParams, k: int, n: int) -> list[str]:
    """What makes ``p`` impossible for a ``[n, k]`` layer."""
    out = []
    covered = p.outlier_size + p.group_num * p.group_size
    if covered < k:
        out.append(f"outlier_size {p.outlier_size} + group_num {p.group_num} x group_size {p.group_size} = "
                   f"{covered} columns cover fewer than in_features {k}")
    elif p.group_num > 1 and p.outlier_size + (p.group_num - 1) * p.group_size >= k:
        out.append(f"group_num {p.group_num} x group_size {p.group_size} after {p.outlier_size} outlier columns "
                   f"leaves the last group empty for in_features {k}")
    if p.enable_perm and p.aux_dtype == torch.int16 and k > 1 << 16:
        out.append(f"a uint16 perm holds at most 65536 channels, in_features is {k}")
    return out


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]]:
    """Checkpoint tensor name -> (shape, allowed dtypes) for a VPTQ layer (bias excluded)."""
    p, k, n = params_of(scheme), scheme.in_features, scheme.out_features
    errors = shape_errors(p, k, n)
    if errors:
        raise VptqLayoutError("VPTQ layout: " + "; ".join(errors))
    cd = (p.codebook_dtype,)
    out = {"indices": ((p.group_num, -(-n // p.vector_len), p.words), (torch.int32,)),
           "centroids.weight": ((p.group_num, p.num_centroids * p.vector_len), cd)}
    if p.residual:
        out["res_centroids.weight"] = ((p.group_num, p.num_res_centroids * p.vector_len), cd)
    if p.outlier:
        out["outlier_centroids.weight"] = ((1, p.outlier_num_centroids * p.outlier_vector_len), cd)
        out["outlier_indices"] = ((1, -(-n // p.outlier_vector_len), p.outlier_size), (p.aux_dtype,))
    if p.enable_perm:
        out["perm"] = ((k,), (p.aux_dtype,))
    if p.enable_norm:
        size = k if p.norm_dim == 0 else n
        out["weight_scale"] = ((size,), cd)
        out["weight_bias"] = ((size,), cd)
    return out


# ---------------------------------------------------------------- index streams
def as_index(t: torch.Tensor) -> torch.Tensor:
    """Stored small indices as int64: int16 holds uint16 bits (VPTQ), wider ints hold the value."""
    return t.view(torch.uint16).to(torch.int64) if t.dtype == torch.int16 else t.to(torch.int64)


def unpack_indices(packed: torch.Tensor, p: VptqParams) -> tuple[torch.Tensor, torch.Tensor | None]:
    """int32 words ``[..., words]`` -> (main codes, residual codes or None), int64 ``[..., group_size]``."""
    tb = p.total_bits
    off = torch.arange(p.group_size, device=packed.device, dtype=torch.int64) * tb
    w = packed.to(torch.int64) & 0xFFFFFFFF
    lo = w[..., off // 32]
    hi = w[..., (off // 32 + 1).clamp_max(packed.shape[-1] - 1)]
    code = ((lo | (hi << 32)) >> (off % 32)) & ((1 << tb) - 1)
    main = code & ((1 << p.index_bits) - 1)
    return main, (code >> p.index_bits if p.residual else None)


def pack_indices(main: torch.Tensor, res: torch.Tensor | None, p: VptqParams) -> torch.Tensor:
    """Codes ``[..., group_size]`` -> int32 words ``[..., words]`` (the inverse of ``unpack_indices``)."""
    if main.shape[-1] != p.group_size:
        raise VptqLayoutError(f"indices: expected last dimension group_size {p.group_size}, got {main.shape[-1]}")
    code = main.to(torch.int64)
    if (code < 0).any() or (code >= p.num_centroids).any():
        raise VptqLayoutError(f"indices: codes must be in [0, {p.num_centroids})")
    if p.residual:
        if res is None or res.shape != main.shape:
            raise VptqLayoutError(f"res_indices: expected shape {list(main.shape)} beside the main codes")
        r = res.to(torch.int64)
        if (r < 0).any() or (r >= p.num_res_centroids).any():
            raise VptqLayoutError(f"res_indices: codes must be in [0, {p.num_res_centroids})")
        code = code | (r << p.index_bits)
    bits = (code.unsqueeze(-1) >> torch.arange(p.total_bits, device=code.device)) & 1
    bits = bits.flatten(-2)
    bits = torch.nn.functional.pad(bits, (0, p.words * 32 - bits.shape[-1]))
    words = (bits.unflatten(-1, (p.words, 32)) << torch.arange(32, device=code.device)).sum(-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


# ---------------------------------------------------------------- validation and decode
def validate(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> None:
    """Raise ``VptqLayoutError`` naming the tensor unless every tensor fits ``scheme`` and holds valid values:
    outlier codes inside their codebook, ``perm`` a permutation, finite codebooks and norm."""
    p, k = params_of(scheme), scheme.in_features
    what = (f"VPTQ K={k} N={scheme.out_features} v={p.vector_len} C={p.num_centroids} R={p.num_res_centroids} "
            f"G={p.group_num}x{p.group_size} outliers={p.outlier_size}")
    for name, (shape, dtypes) in checkpoint_shapes(scheme).items():
        t = tensors.get(name)
        if not isinstance(t, torch.Tensor):
            raise VptqLayoutError(f"{name}: missing ({what})")
        if tuple(t.shape) != shape or t.dtype not in dtypes:
            want = " or ".join(str(d) for d in dtypes)
            raise VptqLayoutError(f"{name}: expected shape {list(shape)} dtype {want} for {what}, got shape "
                                  f"{list(t.shape)} dtype {t.dtype}")
        if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()):
            raise VptqLayoutError(f"{name}: holds NaN or infinite values ({what})")
    if p.outlier:
        top = int(as_index(tensors["outlier_indices"]).max())
        if top >= p.outlier_num_centroids:
            raise VptqLayoutError(f"outlier_indices: code {top} is outside the {p.outlier_num_centroids}-entry "
                                  "outlier codebook")
    if p.enable_perm:
        perm = as_index(tensors["perm"])
        if not torch.equal(torch.sort(perm).values, torch.arange(k, device=perm.device)):
            raise VptqLayoutError(f"perm: expected a permutation of 0..{k - 1} (uint16 bits when int16), "
                                  "found repeated or out-of-range channels")


def decode_rows(t: Mapping[str, torch.Tensor], scheme: Scheme, n0: int, n1: int,
                inv_perm: torch.Tensor | None = None) -> torch.Tensor:
    """Output rows ``n0:n1`` of the dequantized weight, ``[n1 - n0, K]`` in the codebook dtype, exactly as the
    producers compute it. ``inv_perm``: ``argsort(perm)`` when already at hand."""
    p, k = params_of(scheme), scheme.in_features
    v, g = p.vector_len, p.group_num
    j0, j1 = n0 // v, -(-n1 // v)
    main, res = unpack_indices(t["indices"][:, j0:j1], p)  # [G, J, gs]
    base = (torch.arange(g, device=main.device) * p.num_centroids).view(g, 1, 1)
    w = t["centroids.weight"].reshape(-1, v)[main + base]  # [G, J, gs, v]
    if res is not None:
        rbase = (torch.arange(g, device=main.device) * p.num_res_centroids).view(g, 1, 1)
        w = w + t["res_centroids.weight"].reshape(-1, v)[res + rbase]
    w = w.permute(1, 3, 0, 2).reshape((j1 - j0) * v, g * p.group_size)[n0 - j0 * v:n1 - j0 * v]
    if p.outlier:
        vo = p.outlier_vector_len
        o0, o1 = n0 // vo, -(-n1 // vo)
        oi = as_index(t["outlier_indices"][0, o0:o1])  # [Jo, os]
        wo = t["outlier_centroids.weight"].reshape(-1, vo)[oi]  # [Jo, os, vo]
        wo = wo.permute(0, 2, 1).reshape((o1 - o0) * vo, p.outlier_size)[n0 - o0 * vo:n1 - o0 * vo]
        w = torch.cat([wo, w], dim=1)
    w = w[:, :k]
    if p.enable_perm:
        w = w[:, as_index(t["perm"]).argsort() if inv_perm is None else inv_perm]
    if p.enable_norm:
        s, b = t["weight_scale"], t["weight_bias"]
        if p.norm_dim == 1:
            s, b = s[n0:n1, None], b[n0:n1, None]
        w = w * s + b
    return w


def dequantize(t: Mapping[str, torch.Tensor], scheme: Scheme) -> torch.Tensor:
    """The whole dequantized weight ``[N, K]`` in the codebook dtype (tests and conversions)."""
    return decode_rows(t, scheme, 0, scheme.out_features)


def describe(scheme: Scheme) -> str:
    p = params_of(scheme)
    parts = [f"VPTQ v{p.vector_len} k{p.num_centroids}"]
    if p.residual:
        parts.append(f"residual k{p.num_res_centroids}")
    if p.outlier:
        parts.append(f"{p.outlier_size} outlier columns (v{p.outlier_vector_len} k{p.outlier_num_centroids})")
    parts.append(f"{p.group_num} group(s) of {p.group_size}")
    return ", ".join(parts)
