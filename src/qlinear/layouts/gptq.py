"""GPTQ continuous layout: formats ``gptq`` (v1 zero points) and ``gptq_v2`` (true zero points).

``qweight [ceil(K*b/W), N]`` packs codes along K, ``qzeros [G, ceil(N*b/W)]`` packs zero points
along N, both as one little-endian bit stream (see ``bitpack``); ``scales [G, N]`` float16 and
``g_idx [K]`` int32 (formats.md 2.2). 3-bit is int32 words only.

Zero points (formats.md 2.3). v2 stores the true zero ``z``; v1 stores ``z - 1``. The reference
(GPTQModel) converts 2/4/8-bit words by adding or subtracting a whole-word constant (``0x11111111``
for 4-bit int32, ``0x55555555`` 2-bit, ``0x01010101`` 8-bit), so a zero point of 0 borrows from the
next field: v2 fields 0,1,..,7 (``0x76543210``) become ``0x654320FF`` (fields F,F,0,2,..,6).

* Reading v1 (2/4/8 bits) adds the same whole-word constant, carries included: the exact inverse
  of what GPTQModel writes, and identical to adding 1 per field wherever no field holds ``maxq``
  (a stored ``maxq`` can only come from a zero point of 0, which no per-field writer can express).
  3-bit words (the reference wraps each field) are read per field.
* Writing v1 stores ``z - 1`` per field and refuses ``z = 0``: a v1 word holding it decodes
  differently in per-field readers (AutoGPTQ's kernels, vLLM's) than in GPTQModel, so qlinear never
  writes one (use ``checkpoint_format='gptq_v2'``). ``z = maxq`` is ordinary: v1 field ``maxq - 1``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..affine import AffineWeight
from ..enums import FORMAT, METHOD
from ..spec import Scheme
from . import planar
from .bitpack import pack_bits, packed_length, unpack_bits, word_bits_of
from .tensors import require_tensors

CONTINUOUS_BITS = (2, 3, 4, 8)
#: Scale dtypes a GPTQ layout may hold: checkpoints on disk use float16; a layout re-encoded in memory from
#: another format (compressed-tensors' bfloat16 or float32 scales) keeps that format's scales exactly.
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GPTQ_LAYOUT_FORMATS = (FORMAT.GPTQ, FORMAT.GPTQ_V2, FORMAT.GPTQ_P)


def _check_layout(bits: int, dtype: torch.dtype, name: str) -> int:
    """Word bits of ``dtype`` after checking ``bits`` and the dtype fit the continuous layout."""
    w = word_bits_of(dtype, name)
    if bits not in CONTINUOUS_BITS:
        raise ValueError(f"bits: continuous GPTQ packing holds 2, 3, 4 or 8 bits, got {bits!r} "
                         "(5, 6 and 7 bits exist only as planar checkpoint_format='gptq_p')")
    if bits == 3 and dtype != torch.int32:
        raise ValueError(f"{name}: 3-bit GPTQ is packed in torch.int32 words only, got {dtype}")
    return w


def _check_2d(t: torch.Tensor, name: str, what: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        found = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name}: expected a 2-D {what} tensor, got shape {found}")


def _check_words(t: torch.Tensor, name: str, shape: tuple[int, int], dtype: torch.dtype | None = None) -> None:
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")


def pack_qweight(codes_kn: torch.Tensor, bits: int, pack_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Codes ``[K, N]`` -> ``qweight [ceil(K*b/W), N]`` (packed along K)."""
    _check_2d(codes_kn, "codes", "[in_features, out_features]")
    _check_layout(bits, pack_dtype, "pack_dtype")
    return pack_bits(codes_kn, bits, pack_dtype, dim=0, name="codes")


def unpack_qweight(qweight: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """``qweight [ceil(K*b/W), N]`` -> codes ``[K, N]`` uint8."""
    _check_2d(qweight, "qweight", "[packed rows, out_features]")
    w = _check_layout(bits, qweight.dtype, "qweight")
    _check_words(qweight, "qweight", (packed_length(in_features, bits, w), qweight.shape[1]))
    return unpack_bits(qweight, bits, in_features, dim=0, name="qweight")


def _first_zero(zeros_gn: torch.Tensor) -> tuple[int, int]:
    g, n = (zeros_gn == 0).nonzero()[0].tolist()
    return g, n


def _v1_zero_error(g: int, n: int, bits: int) -> ValueError:
    return ValueError(
        f"zeros: true zero point 0 at (group {g}, out column {n}) has no GPTQ v1 encoding that every reader "
        f"decodes the same: v1 stores z-1, which wraps to {(1 << bits) - 1}, and the reference's whole-word "
        "v1<->v2 arithmetic borrows from the neighbouring field; write checkpoint_format='gptq_v2' instead")


def pack_qzeros(zeros_gn: torch.Tensor, bits: int, pack_dtype: torch.dtype = torch.int32,
                v1: bool = False) -> torch.Tensor:
    """True zeros ``[G, N]`` -> ``qzeros [G, ceil(N*b/W)]`` (packed along N); ``v1`` stores ``z - 1`` per field."""
    _check_2d(zeros_gn, "zeros", "[num_groups, out_features]")
    _check_layout(bits, pack_dtype, "pack_dtype")
    if zeros_gn.dtype not in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        raise ValueError(f"zeros: expected an integer dtype (true zero points), got {zeros_gn.dtype}")
    maxq = (1 << bits) - 1
    if zeros_gn.numel() and (int(zeros_gn.min()) < 0 or int(zeros_gn.max()) > maxq):
        raise ValueError(f"zeros: true zero points must be in 0..{maxq} for {bits} bits; "
                         f"found {int(zeros_gn.min())}..{int(zeros_gn.max())}")
    fields = zeros_gn
    if v1:
        if zeros_gn.numel() and bool((zeros_gn == 0).any()):
            raise _v1_zero_error(*_first_zero(zeros_gn), bits)
        fields = zeros_gn.to(torch.int64) - 1
    return pack_bits(fields, bits, pack_dtype, dim=1, name="zeros")


def unpack_qzeros(qzeros: torch.Tensor, bits: int, out_features: int, v1: bool = False) -> torch.Tensor:
    """``qzeros [G, ceil(N*b/W)]`` -> true zeros ``[G, N]`` int32; ``v1`` undoes the offset as GPTQModel does."""
    _check_2d(qzeros, "qzeros", "[num_groups, packed columns]")
    w = _check_layout(bits, qzeros.dtype, "qzeros")
    _check_words(qzeros, "qzeros", (qzeros.shape[0], packed_length(out_features, bits, w)))
    if v1 and w % bits == 0:
        qzeros = _add_one_per_field(qzeros, bits, w)
    fields = unpack_bits(qzeros, bits, out_features, dim=1, name="qzeros").to(torch.int32)
    if v1 and w % bits:
        fields = (fields + 1) & ((1 << bits) - 1)
    return fields


def _add_one_per_field(words: torch.Tensor, bits: int, w: int) -> torch.Tensor:
    """Add a 1 to every field of every word as one word-wide addition (carries cross fields), mod 2^W."""
    one_per_field = sum(1 << (bits * j) for j in range(w // bits))
    if w == 64:  # int64 addition wraps modulo 2^64: exactly the word arithmetic wanted
        return words + (one_per_field - (1 << 64) if one_per_field >= 1 << 63 else one_per_field)
    out = (words.to(torch.int64) + one_per_field) & ((1 << w) - 1)
    return torch.where(out >= 1 << (w - 1), out - (1 << w), out).to(words.dtype)


def zeros_v1_to_v2(qzeros: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    """Re-encode packed v1 zero points as v2 (the reference's inverse, see the module docstring)."""
    return pack_qzeros(unpack_qzeros(qzeros, bits, out_features, v1=True), bits, qzeros.dtype)


def zeros_v2_to_v1(qzeros: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    """Re-encode packed v2 zero points as v1 (``field - 1`` per field); raises on a zero point of 0."""
    return pack_qzeros(unpack_qzeros(qzeros, bits, out_features), bits, qzeros.dtype, v1=True)


def _format(fmt: FORMAT | str) -> FORMAT:
    fmt = FORMAT(fmt)
    if fmt not in GPTQ_LAYOUT_FORMATS:
        raise ValueError(f"fmt: expected one of {', '.join(f.value for f in GPTQ_LAYOUT_FORMATS)}, got {fmt.value!r}")
    return fmt


def _scales(scales_ng: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    if dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype: expected one of {', '.join(map(str, SCALE_DTYPES))}, got {dtype}")
    out = scales_ng.detach().t().to(dtype).clone(memory_format=torch.contiguous_format)
    if out.numel() and not bool(torch.isfinite(out).all()):
        g, n = (~torch.isfinite(out)).nonzero()[0].tolist()
        raise ValueError(f"scales: {scales_ng[n, g].item()} at (out column {n}, group {g}) is not finite as "
                         f"{dtype}, the dtype these GPTQ scales are stored in")
    return out


def qweight_of(codes_nk: torch.Tensor, fmt: FORMAT | str, bits: int, pack_dtype: torch.dtype = torch.int32
               ) -> torch.Tensor:
    """Codes ``[N, K]`` -> the ``qweight`` words of ``fmt`` (planar rows for ``gptq_p``, else packed along K)."""
    codes_kn = codes_nk.t().contiguous()
    if _format(fmt) is FORMAT.GPTQ_P:
        if pack_dtype != torch.int32:
            raise ValueError(f"pack_dtype: planar gptq_p is packed in torch.int32 words only, got {pack_dtype}")
        return planar.planar_pack_rows(codes_kn, bits)
    return pack_qweight(codes_kn, bits, pack_dtype)


def to_checkpoint(q: AffineWeight, fmt: FORMAT | str, pack_dtype: torch.dtype = torch.int32,
                  scale_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """The checkpoint tensors ``qweight``, ``qzeros``, ``scales`` (float16 unless asked), ``g_idx`` (int32) of ``q``.

    ``gptq`` writes v1 zero points, ``gptq_v2`` true ones, ``gptq_p`` planar words with true zeros.
    """
    fmt = _format(fmt)
    qweight = qweight_of(q.codes.detach(), fmt, q.bits, pack_dtype)
    zeros_gn = q.zeros.detach().t().contiguous()
    if fmt is FORMAT.GPTQ_P:
        qzeros = planar.planar_pack_cols(zeros_gn, q.bits)
    else:
        qzeros = pack_qzeros(zeros_gn, q.bits, pack_dtype, v1=fmt is FORMAT.GPTQ)
    return {"qweight": qweight, "qzeros": qzeros, "scales": _scales(q.scales, scale_dtype),
            "g_idx": q.g_idx.detach().to(torch.int32).clone(memory_format=torch.contiguous_format)}


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Expected shape and dtype of every checkpoint tensor for ``scheme``."""
    w = word_bits_of(scheme.pack_dtype)
    b, k, n, g = scheme.bits, scheme.in_features, scheme.out_features, scheme.num_groups
    return {"qweight": ((packed_length(k, b, w), n), scheme.pack_dtype),
            "qzeros": ((g, packed_length(n, b, w)), scheme.pack_dtype),
            "scales": ((g, n), torch.float16),
            "g_idx": ((k,), torch.int32)}


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> AffineWeight:
    """Decode GPTQ checkpoint tensors (``qweight``, ``qzeros``, ``scales``, ``g_idx``) into an AffineWeight."""
    if scheme.method is not METHOD.GPTQ:
        raise ValueError(f"scheme: expected method 'gptq', got {scheme.method.value!r}")
    fmt = _format(scheme.format)
    require_tensors(tensors, checkpoint_shapes(scheme), scheme, {"scales": SCALE_DTYPES[1:]})
    g_idx = tensors["g_idx"]
    if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= scheme.num_groups):
        raise ValueError(f"g_idx: group ids must be in 0..{scheme.num_groups - 1}; "
                         f"found {int(g_idx.min())}..{int(g_idx.max())}")
    b, k, n = scheme.bits, scheme.in_features, scheme.out_features
    if fmt is FORMAT.GPTQ_P:
        codes_kn = planar.planar_unpack_rows(tensors["qweight"], b, k)
        zeros_gn = planar.planar_unpack_cols(tensors["qzeros"], b, n).to(torch.int32)
    else:
        codes_kn = unpack_qweight(tensors["qweight"], b, k)
        zeros_gn = unpack_qzeros(tensors["qzeros"], b, n, v1=fmt is FORMAT.GPTQ)
    scales = tensors["scales"].t().clone(memory_format=torch.contiguous_format)  # never alias the caller's
    return AffineWeight(codes=codes_kn.t().contiguous(), scales=scales,
                        zeros=zeros_gn.t().contiguous(), g_idx=g_idx.clone(), bits=b,
                        group_size=scheme.group_size, sym=scheme.sym)
