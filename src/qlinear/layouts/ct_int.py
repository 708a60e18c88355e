"""compressed-tensors integer layouts: ``pack-quantized``, and ``naive-quantized`` / ``int-quantized`` with int codes.

Facts from compressed-tensors' own source (``compressors/pack_quantized``, ``naive_quantized``):

* Quantized values are signed, ``q in [-2**(b-1), 2**(b-1) - 1]``, ``w = scale * (q - zero_point)``.
  The canonical codes are ``q + 2**(b-1)`` (exactly the unsigned value pack-quantized stores), and the
  true zero is ``zero_point + 2**(b-1)`` (``2**(b-1)`` when symmetric: no zero point is saved).
* ``weight_packed`` int32 ``[N, ceil(K*b/32)]`` packs along K; since compressed-tensors 0.18 as one
  little-endian bit stream (value ``i`` at stream bits ``[b*i, b*i+b)``, straddling words for 3/5/6/7
  bits); before 0.18 with ``32 // b`` values per word, padded (``Scheme.legacy_packing``).
* ``weight_zero_point`` (asymmetric group/channel) packs along N: int32 ``[ceil(N*b/32), G]``; asymmetric
  tensor strategy keeps it unpacked (int8 ``[1]``). ``weight_shape`` int64 ``[2]`` = ``(N, K)``.
* naive/int-quantized keep ``weight`` as int8 ``[N, K]`` holding ``q``, and ``weight_zero_point`` int8 unpacked.
* ``weight_scale`` by strategy: tensor ``[1]``, channel ``[N, 1]``, group ``[N, K/g]``, block
  ``[ceil(N/bn), ceil(K/bk)]``; its dtype is the model's (bfloat16 or float16, sometimes float32).
* ``weight_g_idx`` int32 ``[K]`` (act-order "group", written up to compressed-tensors 0.18).

Scales of a block spanning several rows are expanded to one row each in the canonical form and must
agree again when written back.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..affine import AffineWeight
from ..enums import FORMAT
from ..spec import Scheme
from .bitpack import pack_bits, packed_length, unpack_bits
from .tensors import check_against

PACKED = FORMAT.PACK_QUANTIZED
UNPACKED = (FORMAT.NAIVE_QUANTIZED, FORMAT.INT_QUANTIZED)
INT_FORMATS = (PACKED, *UNPACKED)
SCALE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def block_of(scheme: Scheme) -> tuple[int, int]:
    """The (rows, cols) one weight scale covers (group: ``(1, group_size)``)."""
    return scheme.scale_block or (1, scheme.group_size)


def is_tensor_strategy(scheme: Scheme) -> bool:
    return scheme.per_tensor_scale


def scale_shape(scheme: Scheme) -> tuple[int, ...]:
    """``weight_scale``'s shape for the scheme's strategy (see the module docstring)."""
    bn, bk = block_of(scheme)
    if is_tensor_strategy(scheme):
        return (1,)
    return -(-scheme.out_features // bn), -(-scheme.in_features // bk)


def _legacy_words(count: int, bits: int) -> int:
    return -(-count // (32 // bits))


def words_along(count: int, bits: int, legacy: bool) -> int:
    """int32 words holding ``count`` values of ``bits`` bits (dense stream, or the pre-0.18 padded words)."""
    return _legacy_words(count, bits) if legacy and 32 % bits else packed_length(count, bits, 32)


def pack(values: torch.Tensor, bits: int, dim: int, legacy: bool = False) -> torch.Tensor:
    """Unsigned ``bits``-bit values -> int32 words along ``dim`` (0 or 1) as compressed-tensors packs them."""
    if not legacy or 32 % bits == 0:
        return pack_bits(values, bits, torch.int32, dim=dim, name="codes")
    per = 32 // bits
    v = values.to(torch.int64).movedim(dim, -1)
    pad = -v.shape[-1] % per
    v = torch.nn.functional.pad(v, (0, pad)).reshape(*v.shape[:-1], -1, per)
    shifts = torch.arange(per, dtype=torch.int64) * bits
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def unpack(words: torch.Tensor, bits: int, count: int, dim: int, legacy: bool = False,
           name: str = "weight_packed") -> torch.Tensor:
    """int32 words -> ``count`` unsigned values along ``dim`` (uint8)."""
    if words.dtype != torch.int32:
        raise ValueError(f"{name}: expected torch.int32 words, got {words.dtype}")
    if not legacy or 32 % bits == 0:
        return unpack_bits(words, bits, count, dim=dim, name=name)
    per = 32 // bits
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    shifts = torch.arange(per, dtype=torch.int64) * bits
    v = (w[..., None] >> shifts) & ((1 << bits) - 1)
    return v.reshape(*w.shape[:-1], -1)[..., :count].movedim(-1, dim).to(torch.uint8).contiguous()


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]]:
    """Expected shape and allowed dtypes of every weight tensor of a compressed-tensors integer module."""
    b, n, k = scheme.bits, scheme.out_features, scheme.in_features
    g = scale_shape(scheme)
    out: dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]] = {"weight_scale": (g, SCALE_DTYPES)}
    if scheme.format is PACKED:
        out["weight_packed"] = ((n, words_along(k, b, scheme.legacy_packing)), (torch.int32,))
        out["weight_shape"] = ((2,), (torch.int64, torch.int32))
        if not scheme.sym:
            tensor = is_tensor_strategy(scheme)
            zshape = (1,) if tensor else (words_along(g[0], b, scheme.legacy_packing), g[1])
            out["weight_zero_point"] = (zshape, (torch.int8,) if tensor else (torch.int32,))
    else:
        out["weight"] = ((n, k), (torch.int8,))
        if not scheme.sym:
            out["weight_zero_point"] = (g, (torch.int8,))
    if scheme.desc_act:
        out["weight_g_idx"] = ((k,), (torch.int32, torch.int64))
    return out


def _expand_rows(t: torch.Tensor, scheme: Scheme) -> torch.Tensor:
    """Per-block values ``[Rb, G]`` (or ``[1]``) -> one row per output channel ``[N, G]``."""
    n = scheme.out_features
    t = t.reshape(1, 1) if t.dim() == 1 else t
    return t.repeat_interleave(block_of(scheme)[0], 0)[:n]


def _check_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> torch.dtype:
    check_against(tensors, checkpoint_shapes(scheme),
                  f"{scheme.format.value} {scheme.bits}-bit {'sym' if scheme.sym else 'asym'} K={scheme.in_features} "
                  f"N={scheme.out_features} block {block_of(scheme)}")
    if scheme.format is PACKED:
        shape = [int(v) for v in tensors["weight_shape"].tolist()]
        if shape != [scheme.out_features, scheme.in_features]:
            raise ValueError(f"weight_shape: says {shape}, but the layer is [{scheme.out_features}, "
                             f"{scheme.in_features}]")
    return tensors["weight_scale"].dtype


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> AffineWeight:
    """Decode a compressed-tensors integer module into the canonical form."""
    _check_tensors(tensors, scheme)
    b, k = scheme.bits, scheme.in_features
    offset = 1 << (b - 1)
    if scheme.format is PACKED:
        codes = unpack(tensors["weight_packed"], b, k, dim=1, legacy=scheme.legacy_packing)
    else:
        q = tensors["weight"].to(torch.int32)
        if q.numel() and (int(q.min()) < -offset or int(q.max()) >= offset):
            raise ValueError(f"weight: {b}-bit values must be in {-offset}..{offset - 1}; found "
                             f"{int(q.min())}..{int(q.max())}")
        codes = (q + offset).to(torch.uint8)
    g = scale_shape(scheme)
    scales = _expand_rows(tensors["weight_scale"], scheme).clone(memory_format=torch.contiguous_format)
    if scheme.sym:
        zeros = torch.full(scales.shape, offset, dtype=torch.int32)
    elif scheme.format is PACKED and not is_tensor_strategy(scheme):
        zeros = unpack(tensors["weight_zero_point"], b, g[0], dim=0, legacy=scheme.legacy_packing,
                       name="weight_zero_point").to(torch.int32)
        zeros = _expand_rows(zeros, scheme)
    else:
        zeros = _expand_rows(tensors["weight_zero_point"].to(torch.int32) + offset, scheme)
    bk = block_of(scheme)[1]
    if scheme.desc_act:
        g_idx = tensors["weight_g_idx"].to(torch.int32).clone()
    else:
        g_idx = torch.arange(k, dtype=torch.int32) // bk
    return AffineWeight(codes=codes.contiguous(), scales=scales, zeros=zeros.contiguous(), g_idx=g_idx, bits=b,
                        group_size=min(bk, k), sym=scheme.sym)


def _collapse_rows(t: torch.Tensor, scheme: Scheme, name: str) -> torch.Tensor:
    """One row per block of ``bn`` rows; raises if rows of one block disagree (the layout cannot hold it)."""
    bn = block_of(scheme)[0]
    if bn == 1:
        return t
    n = scheme.out_features
    pad = -n % bn
    full = torch.cat([t, t[-1:].expand(pad, -1)]) if pad else t
    blocks = full.reshape(-1, bn, t.shape[1])
    if not bool((blocks == blocks[:, :1]).all()):
        raise ValueError(f"{name}: rows inside one {bn}-row block differ; {scheme.format.value} with block "
                         f"{block_of(scheme)} keeps one value per block")
    return blocks[:, 0]


def to_checkpoint(q: AffineWeight, scheme: Scheme, scale_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The compressed-tensors tensors of ``q`` in ``scheme``'s format (``scale_dtype``: keep ``q``'s by default)."""
    b, n, k = scheme.bits, scheme.out_features, scheme.in_features
    if (q.out_features, q.in_features, q.bits) != (n, k, b):
        raise ValueError(f"weight: expected [{n}, {k}] {b}-bit codes, got [{q.out_features}, {q.in_features}] "
                         f"{q.bits}-bit")
    offset = 1 << (b - 1)
    bk = block_of(scheme)[1]
    plain = torch.arange(k, dtype=torch.int32) // bk
    if not scheme.desc_act and not torch.equal(q.g_idx.to(torch.int32), plain):
        raise ValueError(f"g_idx: the weight's groups are not k // {bk}; write it with desc_act (weight_g_idx)")
    if scheme.sym and bool((q.zeros != offset).any()):
        raise ValueError(f"zeros: symmetric {scheme.format.value} keeps no zero points (all must be {offset})")
    dtype = scale_dtype or q.scales.dtype
    if dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype: expected bfloat16, float16 or float32, got {dtype}")
    scales = _collapse_rows(q.scales, scheme, "scales").to(dtype)
    if not torch.equal(scales.double(), _collapse_rows(q.scales, scheme, "scales").double()):
        raise ValueError(f"scales: not exactly representable in {dtype}")
    tensor = is_tensor_strategy(scheme)
    out: dict[str, torch.Tensor] = {"weight_scale": scales.reshape(1).clone() if tensor else scales.contiguous()}
    if scheme.format is PACKED:
        out["weight_packed"] = pack(q.codes, b, dim=1, legacy=scheme.legacy_packing)
        out["weight_shape"] = torch.tensor([n, k], dtype=torch.int64)
    else:
        out["weight"] = (q.codes.to(torch.int16) - offset).to(torch.int8).contiguous()
    if not scheme.sym:
        zeros = _collapse_rows(q.zeros, scheme, "zeros")
        if scheme.format is PACKED and not tensor:
            out["weight_zero_point"] = pack(zeros, b, dim=0, legacy=scheme.legacy_packing)
        else:
            z = (zeros.to(torch.int16) - offset).to(torch.int8)
            out["weight_zero_point"] = z.reshape(1).clone() if tensor else z.contiguous()
    if scheme.desc_act:
        out["weight_g_idx"] = q.g_idx.to(torch.int32).clone()
    return out
