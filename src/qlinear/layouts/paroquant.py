"""ParoQuant: pairwise Givens rotations and channel scales applied to the input, then 4-bit AWQ GEMM codes.

A module stores the AWQ GEMM tensors (``qweight [K, N/8]``, ``qzeros [G, N/8]`` int32, ``scales [G, N]``
float16, see ``layouts/awq.py``) plus the input transform, exactly as paroquant 0.1.16 (``cli/convert.py``,
``RotateQuantizedLinear``) and GPTQModel 7.7.0 (``ParoLinear``) name them:

| tensor | shape | dtype | holds |
|---|---|---|---|
| ``pairs`` | ``[krot, K]`` | int16 | per round and group of ``gs`` channels: ``gs/2`` pairs ``(i, j)``, local indices |
| ``theta`` | ``[krot, K/2]`` | float16 | the angle of each pair, in the pairs' order |
| ``channel_scales`` | ``[1, K]`` | float16 | multiplies the input first (paroquant writes ``1 / optimised scale``) |

The rotation group is the quantization group. Within one round the pairs of a group are disjoint and cover
the group (paroquant's ``transform_to_kernel_data`` pads with zero-angle dummy pairs), so a round is a
permutation into ``(x_i, x_j)`` halves, the rotation, and the inverse permutation.

Arithmetic (GPTQModel's ``apply_paroquant_rotation_vectorized`` / ``_reference``, the portable path): ``theta``
and ``channel_scales`` are first cast to the input dtype ``T``; ``x * scales`` in ``T``; ``cos``/``sin`` of the
angles in float32, rounded to ``T``; each round ``x_i' = x_i*c + x_j*s`` and ``x_j' = -x_i*s + x_j*c``, every
product and sum rounded to ``T``. An all-zero ``theta`` with all-one scales is the identity (skipped, as the
reference does). paroquant's own CUDA kernel rounds to ``T`` once per round instead (float32 FMA, ``__sincosf``):
in float16 after 8 rounds most elements differ from this in the last bits, about 1e-3 of the vector's norm (each
is that close to the exact transform; tests/test_paroquant.py transcribes the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..enums import FORMAT, METHOD
from ..spec import Scheme
from . import awq

ROTATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class RotationError(ValueError):
    """ParoQuant rotation tensors that no producer writes (names the tensor, the expected and the found)."""


@dataclass(frozen=True)
class ParoParams:
    """``Scheme.layout_params`` of a ParoQuant layer: ``krot`` rotation rounds (the config's ``krot``)."""

    krot: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.krot, int) or isinstance(self.krot, bool) or self.krot <= 0:
            raise RotationError(f"krot: expected a positive number of rotation rounds, got {self.krot!r}")


def params_of(scheme: Scheme) -> ParoParams:
    """The scheme's ParoParams (the default, ``krot=8``, where it names none, as both producers default)."""
    p = scheme.layout_params
    if p is None:
        return ParoParams()
    if not isinstance(p, ParoParams):
        raise RotationError(f"layout_params: expected ParoParams for a paroquant scheme, got {type(p).__name__}")
    return p


def check_scheme(scheme: Scheme) -> None:
    """Raise unless ``scheme`` is a layer ParoQuant can hold: 4 bits, an even group dividing K."""
    if scheme.method is not METHOD.PAROQUANT or scheme.format is not FORMAT.PAROQUANT:
        raise RotationError(f"scheme: expected method/format paroquant, got {scheme.method.value}/"
                            f"{scheme.format.value}")
    if scheme.bits != 4:
        raise RotationError(f"bits: ParoQuant stores 4-bit AWQ GEMM codes, got {scheme.bits}")
    k, gs = scheme.in_features, scheme.group_size
    if k % gs or gs % 2:
        raise RotationError(f"group_size: the rotation pairs channels inside each group, so the group ({gs}) must "
                            f"be even and divide in_features ({k})")
    params_of(scheme)


def awq_scheme(scheme: Scheme) -> Scheme:
    """The AWQ GEMM scheme of the packed codes (same shape, bits and groups)."""
    check_scheme(scheme)
    return replace(scheme, method=METHOD.AWQ, format=FORMAT.GEMM, desc_act=False, layout_params=None)


def rotation_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shape and stored dtype of the rotation tensors of ``scheme``."""
    krot, k = params_of(scheme).krot, scheme.in_features
    return {"theta": ((krot, k // 2), torch.float16), "pairs": ((krot, k), torch.int16),
            "channel_scales": ((1, k), torch.float16)}


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every checkpoint tensor of a ParoQuant module (bias aside): AWQ GEMM codes plus the rotation."""
    return awq.checkpoint_shapes(awq_scheme(scheme)) | rotation_shapes(scheme)


def identity_rotation(scheme: Scheme) -> dict[str, torch.Tensor]:
    """The no-op transform (adjacent pairs, zero angles, unit scales): what an unloaded layer holds."""
    krot, k, gs = params_of(scheme).krot, scheme.in_features, scheme.group_size
    pairs = torch.arange(gs, dtype=torch.int16).repeat(k // gs).expand(krot, k).contiguous()
    return {"theta": torch.zeros(krot, k // 2, dtype=torch.float16), "pairs": pairs,
            "channel_scales": torch.ones(1, k, dtype=torch.float16)}


def check_rotation(pairs: torch.Tensor, theta: torch.Tensor, channel_scales: torch.Tensor, group_size: int) -> None:
    """Raise ``RotationError`` unless the tensors form a valid transform: shapes, dtypes, finite values and, in
    every round and group, pairs that are a permutation of ``0..gs-1`` (disjoint, covering the group)."""
    if pairs.dim() != 2 or pairs.dtype not in (torch.int16, torch.int32, torch.int64):
        raise RotationError(f"pairs: expected a 2-D [krot, in_features] int16 tensor, got {pairs.dtype} "
                            f"{list(pairs.shape)}")
    krot, k = pairs.shape
    if k % group_size or group_size % 2:
        raise RotationError(f"pairs: in_features {k} must be a multiple of the (even) group size {group_size}")
    if tuple(theta.shape) != (krot, k // 2) or theta.dtype not in ROTATION_DTYPES:
        raise RotationError(f"theta: expected shape [{krot}, {k // 2}] float16 (one angle per pair), got "
                            f"{theta.dtype} {list(theta.shape)}")
    if tuple(channel_scales.shape) not in ((1, k), (k,)) or channel_scales.dtype not in ROTATION_DTYPES:
        raise RotationError(f"channel_scales: expected shape [1, {k}] float16, got {channel_scales.dtype} "
                            f"{list(channel_scales.shape)}")
    for name, t in (("theta", theta), ("channel_scales", channel_scales)):
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            at = bad.nonzero()[0].tolist()
            raise RotationError(f"{name}: expected finite values, found {t[tuple(at)].item()} at index {at}")
    local = pairs.to(torch.int64).reshape(krot, k // group_size, group_size)
    if bool(((local < 0) | (local >= group_size)).any()):
        r, g, p = ((local < 0) | (local >= group_size)).nonzero()[0].tolist()
        raise RotationError(f"pairs: local index {local[r, g, p].item()} at round {r}, group {g}, slot {p} is "
                            f"outside 0..{group_size - 1}")
    ok = local.sort(dim=-1).values == torch.arange(group_size, device=local.device)
    if not bool(ok.all()):
        r, g, _ = (~ok).nonzero()[0].tolist()
        raise RotationError(f"pairs: round {r}, group {g} is not a permutation of 0..{group_size - 1} (a channel "
                            "appears twice or not at all; rounds must pair disjoint channels)")


@dataclass(frozen=True)
class RotationPlan:
    """Precomputed index maps of a transform. ``perm [krot, K]``: round ``r``'s columns as ``[i-columns |
    j-columns]`` (pairs in group order). ``maps``: round ``r`` reads ``maps[r]`` of the previous round's
    ``[x_i-half | x_j-half]`` (of the input for ``r = 0``); ``maps[krot]`` restores channel order."""

    maps: tuple[torch.Tensor, ...]
    identity: bool
    perm: torch.Tensor


def plan_rotation(pairs: torch.Tensor, theta: torch.Tensor, channel_scales: torch.Tensor,
                  group_size: int) -> RotationPlan:
    """Validate the transform and build its gather maps (on ``pairs``' device)."""
    check_rotation(pairs, theta, channel_scales, group_size)
    krot, k = pairs.shape
    local = pairs.to(torch.int64).reshape(krot, k // group_size, group_size // 2, 2)
    base = (torch.arange(k // group_size, device=pairs.device) * group_size)[None, :, None]
    ii, jj = (local[..., 0] + base).reshape(krot, -1), (local[..., 1] + base).reshape(krot, -1)
    perm = torch.cat([ii, jj], dim=1)
    inv = torch.empty_like(perm).scatter_(1, perm, torch.arange(k, device=pairs.device).expand(krot, k))
    maps = [perm[0]] + [inv[r - 1][perm[r]] for r in range(1, krot)] + [inv[krot - 1]]
    identity = not bool(theta.any()) and bool((channel_scales == 1).all())
    return RotationPlan(tuple(m.contiguous() for m in maps), identity, perm)


def cos_sin(theta: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``/``sin`` ``[krot, K/2]`` as the reference forms them: angles cast to ``dtype``, evaluated in float32,
    rounded to ``dtype``."""
    t = theta.to(dtype).to(torch.float32)
    return t.cos().to(dtype), t.sin().to(dtype)


def rotate(x: torch.Tensor, plan: RotationPlan, cos: torch.Tensor, sin: torch.Tensor,
           channel_scales: torch.Tensor) -> torch.Tensor:
    """The ParoQuant input transform of ``x [..., K]`` (module docstring: the reference's operations and
    roundings, in ``x.dtype``); differentiable in ``x``."""
    if plan.identity:
        return x
    shape, k = x.shape, x.shape[-1]
    out = x.reshape(-1, k) * channel_scales.reshape(1, k).to(x.dtype)
    half = k // 2
    for r in range(len(plan.maps) - 1):
        z = out.index_select(1, plan.maps[r])
        xi, xj = z[:, :half], z[:, half:]
        c, s = cos[r], sin[r]
        out = torch.cat([xi * c + xj * s, -xi * s + xj * c], dim=1)
    return out.index_select(1, plan.maps[-1]).reshape(shape)


def pair_block(group_size: int) -> int:
    """Pairs a group's tile holds in a group-local kernel: ``group_size / 2`` rounded up to a power of two."""
    return 1 << max(0, group_size // 2 - 1).bit_length()


def group_maps(perm: torch.Tensor, group_size: int) -> torch.Tensor:
    """Group-local gather maps for a kernel that keeps one group of a row in registers: int32 ``[krot + 1, K / gs,
    2 * pair_block(gs)]``.

    Round ``r`` reads its pairs' ``x_i`` at ``maps[r, g, :P]`` and ``x_j`` at ``maps[r, g, P:P + gs/2]`` (``P =
    pair_block``; the padding lanes read 0) of the group's previous values: for ``r = 0`` the scaled input in column
    order (local column ``0..gs-1``); after that the previous round's results interleaved, ``x_i'`` of pair ``q`` at
    ``2q`` and ``x_j'`` at ``2q + 1``. Row ``krot`` maps each local column to where the last round left it (column
    order for ``krot = 0``)."""
    krot, k = perm.shape
    half, groups, block = group_size // 2, k // group_size, pair_block(group_size)
    dev = perm.device
    p = perm.to(torch.int64)
    out = torch.zeros(krot + 1, groups, 2 * block, dtype=torch.int64, device=dev)
    base = torch.arange(groups, device=dev)[:, None] * group_size
    pair = torch.arange(groups, device=dev)[:, None] * half + torch.arange(half, device=dev)[None, :]
    q = torch.arange(half, device=dev)[None, :].expand(groups, half)
    where = torch.arange(k, device=dev) - torch.arange(k, device=dev) // group_size * group_size  # column order
    for r in range(krot):
        ci, cj = p[r, pair], p[r, k // 2 + pair]
        out[r, :, :half], out[r, :, block:block + half] = where[ci], where[cj]
        where = torch.empty(k, dtype=torch.int64, device=dev)
        where[ci], where[cj] = 2 * q, 2 * q + 1
    out[krot, :, :group_size] = where[base + torch.arange(group_size, device=dev)[None, :]]
    return out.to(torch.int32).contiguous()
