"""QQQ (W4A8) layout: GPTQModel's ``QQQLinear`` buffers ``B``, ``s_channel`` and ``s_group`` (formats.md 2.9).

| tensor | shape | dtype | holds |
|---|---|---|---|
| ``B`` | ``[K/16, 2N]`` | int32 | 4-bit codes in Marlin-derived 16x16 tiles, 8 nibbles a word |
| ``s_channel`` | ``[1, N]`` | float32 | per output channel scale, permuted in 32-blocks |
| ``s_group`` | ``[K/gs, N]`` grouped, ``[0]`` per-channel | float16 | group scale over the channel scale, 64-blocks |

The arithmetic (GPTQModel's torch path and the QQQ CUDA kernel agree on it): activations are quantized per token to
int8, weights become int8, the int8 x int8 products are summed exactly in int32, and the sum is scaled by the token's
scale and then by ``s_channel``. The int8 weight of code ``c`` (signed, -8..7) is

* grouped (``gs < K``): ``clamp(round_half_even(c * float(s_group[k // gs, n])), -128, 127)``; the stored nibble
  is ``c + 8``; ``s_group = float16(s_g / s_extra)`` (the 4-bit group scale over the 8-bit channel scale) and
  ``s_channel = s_extra``;
* per-channel (``gs == K``): ``16 * c`` (the kernel reads the nibble as a byte's high half); the stored nibble is
  ``c``'s two's complement and ``s_channel = s / 16``.

Canonical form: ``QQQWeight`` (signed codes, the float16 group scales and float32 channel scales **as stored**).
``AffineWeight`` cannot hold a grouped QQQ weight exactly: its value ``s_channel * clamp(round(c * s_group))`` has
an integer rounding between the two scales, so no single float scale per group reproduces it. A per-channel QQQ
weight is affine (scale ``16 * s_channel``, zero 8), and converts to and from ``AffineWeight`` losslessly.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..affine import AffineWeight
from ..spec import Scheme

TILE = 16
#: packed values per permutation chunk: four 16x16 tiles (16 input x 64 output channels)
CHUNK = 1024
#: (K, N) divisibility pairs; GPTQModel's QQQ kernels need one of them (thread tiles of its CUDA kernel)
KERNEL_TILES = ((64, 256), (128, 128), (128, 64), (64, 128))
#: order of the 8 gathered values inside a word (formats.md 2.9)
GROUPED_INTERLEAVE = (0, 2, 4, 6, 1, 3, 5, 7)
CHANNEL_INTERLEAVE = (4, 0, 5, 1, 6, 2, 7, 3)
#: columns of each 32-block that rows ``8i .. 8i+7`` of the permuted channel scales read, after ``2i``
SINGLE = (0, 1, 8, 9, 16, 17, 24, 25)


@dataclass(frozen=True, eq=False)
class QQQWeight:
    """Signed 4-bit codes ``[N, K]`` int8 (-8..7), group scales ``[N, G]`` float16 (``[N, 0]`` per-channel) and
    channel scales ``[N]`` float32, exactly as a QQQ checkpoint stores them (un-permuted). ``group_size`` is a
    length (``K`` when per-channel)."""

    codes: torch.Tensor
    group_scales: torch.Tensor
    channel_scales: torch.Tensor
    group_size: int

    def __post_init__(self) -> None:
        check_weight(self.codes, self.group_scales, self.channel_scales, self.group_size)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    @property
    def grouped(self) -> bool:
        return self.group_size < self.in_features

    @property
    def num_groups(self) -> int:
        return self.group_scales.shape[1]

    def int8_weight(self) -> torch.Tensor:
        """The int8 weight ``[N, K]`` the int8 GEMM multiplies (module docstring), as the producer computes it."""
        if not self.grouped:
            return (self.codes.to(torch.int16) * 16).to(torch.int8)
        s = self.group_scales.float().repeat_interleave(self.group_size, dim=1)
        return (self.codes.float() * s).round_().clamp_(-128, 127).to(torch.int8)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[N, K]``: the int8 weight times its channel scale, in float32, then cast."""
        return (self.int8_weight().float() * self.channel_scales.float()[:, None]).to(dtype)


def check_weight(codes: torch.Tensor, group_scales: torch.Tensor, channel_scales: torch.Tensor,
                 group_size: int) -> None:
    """Raise ``ValueError`` naming the tensor, what was expected and what was found."""
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.dtype != torch.int8:
        found = f"{codes.dtype} shape {list(codes.shape)}" if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise ValueError(f"codes: expected an int8 [N, K] tensor (signed 4-bit codes); got {found}")
    n, k = codes.shape
    if not isinstance(group_size, int) or group_size <= 0 or k % group_size:
        raise ValueError(f"group_size: expected a positive length dividing in_features {k}, got {group_size!r}")
    if codes.numel() and (int(codes.min()) < -8 or int(codes.max()) > 7):
        raise ValueError(f"codes: signed 4-bit codes must lie in -8..7, found {int(codes.min())}..{int(codes.max())}")
    g = 0 if group_size == k else k // group_size
    if tuple(group_scales.shape) != (n, g) or group_scales.dtype != torch.float16:
        raise ValueError(f"group_scales: expected float16 shape [{n}, {g}] (group size {group_size}, K {k}), got "
                         f"{group_scales.dtype} shape {list(group_scales.shape)}")
    if tuple(channel_scales.shape) != (n,) or channel_scales.dtype != torch.float32:
        raise ValueError(f"channel_scales: expected float32 shape [{n}], got {channel_scales.dtype} shape "
                         f"{list(channel_scales.shape)}")
    for name, t in (("group_scales", group_scales), ("channel_scales", channel_scales)):
        bad = (~torch.isfinite(t)).nonzero()
        if len(bad):
            raise ValueError(f"{name}: every scale must be finite; found {t[tuple(bad[0])].item()} at "
                             f"{[int(i) for i in bad[0]]}")


def layout_errors(in_features: int, out_features: int, group_size: int) -> list[str]:
    """Why an ``[out_features, in_features]`` weight with ``group_size`` (a length) has no QQQ layout."""
    out = []
    if in_features % TILE:
        out.append(f"in_features {in_features} not a multiple of {TILE} (16x16 weight tiles)")
    if out_features % 64:
        out.append(f"out_features {out_features} not a multiple of 64 (permutation chunks of 16x64)")
    if group_size < in_features and in_features % group_size:
        out.append(f"group size {group_size} does not divide in_features {in_features}")
    return out


def kernel_tile_errors(in_features: int, out_features: int) -> list[str]:
    """GPTQModel's QQQ shape rule: (K, N) divisible by one of ``KERNEL_TILES``."""
    if any(in_features % tk == 0 and out_features % tn == 0 for tk, tn in KERNEL_TILES):
        return []
    pairs = ", ".join(f"({tk}, {tn})" for tk, tn in KERNEL_TILES)
    return [f"(in_features, out_features) = ({in_features}, {out_features}) divisible by none of {pairs}"]


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]]:
    """Checkpoint tensor name -> (shape, allowed dtypes) for a QQQ layer (``s_group`` is ``[0]`` per-channel)."""
    k, n, gs = scheme.in_features, scheme.out_features, scheme.group_size
    errors = layout_errors(k, n, gs) + ([f"bits {scheme.bits}: QQQ holds 4-bit codes"] if scheme.bits != 4 else [])
    if errors:
        raise ValueError("QQQ layout: " + "; ".join(errors))
    return {"B": ((k // TILE, 2 * n), (torch.int32,)), "s_channel": ((1, n), (torch.float32,)),
            "s_group": (((k // gs, n) if gs < k else (0,)), (torch.float16,))}


# ---------------------------------------------------------------- permutations
@functools.cache
def _weight_perm(grouped: bool) -> tuple[int, ...]:
    """Stream position p of a chunk holds tile-row element ``perm[p]`` (tile row: 4 tiles of ``16 k x 16 n``,
    element ``256 t + 16 k + n``). Lane i, tile t, column half b, row r: ``256 t + 16 (4 (i % 4) + r) + i // 4 +
    8 b``; each lane-tile's 8 values are then reordered by the interleave."""
    i = torch.arange(32).view(32, 1, 1, 1)
    t = torch.arange(4).view(1, 4, 1, 1)
    b = torch.arange(2).view(1, 1, 2, 1)
    r = torch.arange(4).view(1, 1, 1, 4)
    src = (256 * t + 16 * (4 * (i % 4) + r) + i // 4 + 8 * b).reshape(-1, 8)
    order = torch.tensor(GROUPED_INTERLEAVE if grouped else CHANNEL_INTERLEAVE)
    return tuple(src[:, order].reshape(-1).tolist())


def weight_perm(grouped: bool) -> torch.Tensor:
    """The 1024-entry permutation of formats.md 2.9 (a fresh int64 tensor)."""
    return torch.tensor(_weight_perm(grouped), dtype=torch.int64)


def group_scale_perm() -> torch.Tensor:
    """64-block rule: ``new[8 i + j] = old[i + 8 j]`` (formats.md 2.8)."""
    i, j = torch.meshgrid(torch.arange(8), torch.arange(8), indexing="ij")
    return (i + 8 * j).reshape(-1)


def channel_scale_perm() -> torch.Tensor:
    """32-block rule: ``new[8 i + e] = old[2 i + SINGLE[e]]`` (formats.md 2.8)."""
    return (2 * torch.arange(4)[:, None] + torch.tensor(SINGLE)[None, :]).reshape(-1)


def _permute(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, perm.numel())[:, perm.to(t.device)].reshape(t.shape)


def _unpermute(t: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(t.reshape(-1, perm.numel()))
    out[:, perm.to(t.device)] = t.reshape(-1, perm.numel())
    return out.reshape(t.shape)


# ---------------------------------------------------------------- pack / unpack
def pack(qw: QQQWeight) -> dict[str, torch.Tensor]:
    """``QQQWeight`` -> the checkpoint tensors ``B``, ``s_channel``, ``s_group`` (bit-exact with GPTQModel's pack),
    on the weight's device."""
    n, k = qw.codes.shape
    errors = layout_errors(k, n, qw.group_size)
    if errors:
        raise ValueError("QQQ pack: " + "; ".join(errors))
    codes = qw.codes.to(torch.int64)
    nibbles = (codes + 8) if qw.grouped else (codes & 0xF)  # [N, K]
    rows = nibbles.t().reshape(k // TILE, TILE, n // TILE, TILE).permute(0, 2, 1, 3).reshape(k // TILE, n * TILE)
    stream = _permute(rows, weight_perm(qw.grouped)).reshape(k // TILE, 2 * n, 8)
    words = (stream << (4 * torch.arange(8, device=stream.device))).sum(dim=-1)  # disjoint nibbles: sum = OR
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    s_channel = _permute(qw.channel_scales.reshape(1, n), channel_scale_perm()).contiguous()
    if qw.grouped:
        s_group = _permute(qw.group_scales.t().contiguous(), group_scale_perm()).contiguous()
    else:
        s_group = torch.empty(0, dtype=torch.float16, device=codes.device)
    return {"B": words.contiguous(), "s_channel": s_channel, "s_group": s_group}


def unpack(tensors: Mapping[str, torch.Tensor], in_features: int | None = None) -> QQQWeight:
    """Checkpoint tensors -> ``QQQWeight`` on ``B``'s device. ``in_features`` defaults to ``16 * B.shape[0]``; the
    group size is ``K / s_group.shape[0]`` (per-channel when ``s_group`` is empty or absent)."""
    b, s_channel = tensors.get("B"), tensors.get("s_channel")
    if not isinstance(b, torch.Tensor) or b.dim() != 2 or b.dtype != torch.int32 or b.shape[1] % 2:
        found = f"{b.dtype} shape {list(b.shape)}" if isinstance(b, torch.Tensor) else "nothing"
        raise ValueError(f"B: expected an int32 [K/16, 2N] tensor, got {found}")
    k = 16 * b.shape[0] if in_features is None else in_features
    n = b.shape[1] // 2
    s_group = tensors.get("s_group")
    if s_group is None:
        s_group = torch.empty(0, dtype=torch.float16)
    gs = k if s_group.numel() == 0 else (k // s_group.shape[0] if s_group.dim() == 2 and s_group.shape[0] else 0)
    if gs <= 0 or (gs < k and gs * s_group.shape[0] != k):
        raise ValueError(f"s_group: expected float16 [K/group_size, {n}] with K = {k} (or empty per-channel), got "
                         f"{s_group.dtype} shape {list(s_group.shape)}")
    shapes = checkpoint_shapes(Scheme(bits=4, group_size=gs, in_features=k, out_features=n, method="qqq",
                                      format="qqq"))
    for name, t in (("B", b), ("s_channel", s_channel), ("s_group", s_group)):
        shape, dtypes = shapes[name]
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype not in dtypes:
            found = f"{t.dtype} shape {list(t.shape)}" if isinstance(t, torch.Tensor) else "nothing"
            raise ValueError(f"{name}: expected {dtypes[0]} shape {list(shape)} for QQQ K={k} N={n} "
                             f"group size {gs}, got {found}")
    grouped = gs < k
    words = b.to(torch.int64) & 0xFFFFFFFF
    stream = ((words[..., None] >> (4 * torch.arange(8, device=b.device))) & 0xF).reshape(k // TILE, TILE * n)
    rows = _unpermute(stream, weight_perm(grouped))
    nibbles = rows.reshape(k // TILE, n // TILE, TILE, TILE).permute(0, 2, 1, 3).reshape(k, n).t()
    codes = (nibbles - 8) if grouped else torch.where(nibbles >= 8, nibbles - 16, nibbles)
    channel = _unpermute(s_channel.to(b.device), channel_scale_perm()).reshape(n).contiguous()
    if grouped:
        group = _unpermute(s_group.to(b.device), group_scale_perm()).t().contiguous()
    else:
        group = torch.empty((n, 0), dtype=torch.float16, device=b.device)
    return QQQWeight(codes.to(torch.int8).contiguous(), group, channel, gs)


# ---------------------------------------------------------------- from the quantizer, to and from AffineWeight
def from_fake_quantized(weight: torch.Tensor, scales: torch.Tensor, s_extra: torch.Tensor | None,
                        group_size: int) -> QQQWeight:
    """GPTQModel's QQQ quantizer outputs -> ``QQQWeight``, with its packer's arithmetic: ``weight [N, K]`` the
    fake-quantized weight, ``scales [N, G]`` the 4-bit scales, ``s_extra [1, N]`` (grouped only) the 8-bit
    per-channel scales; ``group_size`` -1 or >= K means per-channel. Codes are ``round(w / s)`` in the promoted
    dtype of weight and scales (``+ 8`` clamped to 0..15 grouped; per-channel they must fit -8..7: GPTQModel would
    wrap a larger one silently)."""
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D [out_features, in_features] tensor, got shape {list(weight.shape)}")
    n, k = weight.shape
    gs = k if group_size == -1 or group_size >= k else group_size
    if gs <= 0 or k % gs:
        raise ValueError(f"group_size: expected -1 or a positive divisor of in_features {k}, got {group_size}")
    g = k // gs
    if tuple(scales.shape) != (n, g):
        raise ValueError(f"scales: expected shape [{n}, {g}] ([out_features, num_groups]), got {list(scales.shape)}")
    raw = scales.detach().t()  # [G, N]
    w = weight.detach().t()  # [K, N]
    q = torch.round(w / raw.repeat_interleave(gs, dim=0))
    if gs < k:
        if s_extra is None or s_extra.numel() != n:
            found = "None" if s_extra is None else f"shape {list(s_extra.shape)}"
            raise ValueError(f"s_extra: a grouped QQQ layer needs its [1, {n}] per-channel 8-bit scales, got {found}")
        extra = s_extra.detach().reshape(1, n).to(torch.float32)
        codes = (q + 8).clamp(0, 15) - 8
        group = (raw / extra).to(torch.float16).t().contiguous()
        channel = extra.reshape(n)
    else:
        codes = q.clamp(-15, 15)
        if codes.numel() and (int(codes.min()) < -8 or int(codes.max()) > 7):
            raise ValueError(f"weight: per-channel codes round(w / s) reach {int(codes.min())}..{int(codes.max())}; "
                             "QQQ stores -8..7 (GPTQModel's packer would wrap these silently)")
        group = torch.empty((n, 0), dtype=torch.float16)
        channel = (raw / 16).to(torch.float32).reshape(n)
    return QQQWeight(codes.t().to(torch.int8).cpu().contiguous(), group.cpu(), channel.cpu().contiguous(), gs)


def to_affine(qw: QQQWeight) -> AffineWeight:
    """A per-channel QQQ weight as ``AffineWeight`` (codes ``c + 8``, zero 8, scale ``16 * s_channel``), exactly."""
    if qw.grouped:
        raise ValueError(f"a grouped QQQ weight (group size {qw.group_size}) has no exact AffineWeight form: its int8 "
                         "rounding between the group and channel scales is not affine; use layouts.qqq.QQQWeight")
    n, k = qw.codes.shape
    return AffineWeight(codes=(qw.codes.to(torch.int16) + 8).to(torch.uint8), scales=(qw.channel_scales * 16)[:, None],
                        zeros=torch.full((n, 1), 8, dtype=torch.int32), g_idx=torch.zeros(k, dtype=torch.int32),
                        bits=4, group_size=k, sym=True)


def from_affine(q: AffineWeight) -> QQQWeight:
    """A symmetric 4-bit channelwise ``AffineWeight`` (zero 8) as a per-channel QQQ weight, or ``ValueError`` saying
    why it has none (grouped QQQ needs per-channel 8-bit scales an AffineWeight does not carry)."""
    k = q.in_features
    if q.bits != 4 or q.group_size < k or q.desc_act:
        raise ValueError(f"QQQ from AffineWeight: needs 4-bit, one group per row, no act-order; got {q.bits}-bit, "
                         f"group size {q.group_size}, desc_act {q.desc_act} (grouped QQQ: build QQQWeight with "
                         "layouts.qqq.from_fake_quantized from the quantizer's scales and s_extra)")
    if not bool((q.zeros == 8).all()):
        raise ValueError("QQQ from AffineWeight: needs symmetric zero points of 8; found others")
    channel = q.scales[:, 0].to(torch.float32) / 16
    if not torch.equal((channel * 16).double(), q.scales[:, 0].double()):
        raise ValueError("QQQ from AffineWeight: scales / 16 are not exact in float32 (s_channel's dtype)")
    codes = (q.codes.to(torch.int16) - 8).to(torch.int8)
    return QQQWeight(codes.contiguous(), torch.empty((q.out_features, 0), dtype=torch.float16), channel.contiguous(), k)
