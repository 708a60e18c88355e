"""BitBLAS serialized layout (GPTQModel 7.7 ``checkpoint_format: bitblas``, quant_method gptq or awq).

What GPTQModel's ``BitblasLinear`` / ``AWQBitBlasKernel`` save per module (BitBLAS 0.1.0.post1 operator built with
``A_dtype=float16`` (bfloat16 models are computed in float16 too), ``layout="nt"``, ``propagate_b=False``,
``storage_dtype=int8``, ``zeros_mode="quantized"``):

* ``qweight`` int8 ``[N, K*bits/8]``: the unsigned codes of each output row packed along K, ``8/bits`` codes per
  byte, the first in the low bits (BitBLAS ``general_compress`` / ``QuantCompress``). For 2 and 4 bits the operator
  enables ``fast_decoding``, so every little-endian int32 word of a row (``32/bits`` consecutive codes) is then
  permuted for the LOP3 float16 decoder (``LOP3Permutate``): code ``i`` of the word moves to bit
  ``16 (i % 2) + bits (i // 2)`` (even codes in the low half, odd in the high half); for 2 bits bytes 1 and 2 of the
  word are then swapped. 8-bit codes are stored as plain bytes.
* ``scales`` float16 ``[N, G]`` (the operator's compute dtype).
* ``qzeros`` int8 ``[G, N*bits/8]``: true zero points packed along N like the codes (no permutation), asymmetric
  only. Symmetric GPTQ layers use BitBLAS's signed ``int{bits}`` weight type: no zeros (an empty ``[0]`` buffer) and
  the stored unsigned code ``q`` means ``q - 2**(bits-1)``, so the canonical zero is ``2**(bits-1)``.
* ``bias`` float16 ``[N]`` (optional). No ``g_idx``: GPTQModel forces ``desc_act`` off for this format.

The value is ``scales[n, k // gs] * (q - z)``. AWQ layers are always stored asymmetric (unsigned codes + zeros).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..affine import AffineWeight
from ..enums import FORMAT, METHOD
from ..spec import Scheme
from .tensors import require_tensors

#: Bit widths GPTQModel's BitBLAS kernels take (AWQ: 4 only).
BITBLAS_BITS = (2, 4, 8)
#: Bit widths whose words carry the LOP3 fast-decoding permutation (float16 activations).
LOP3_BITS = (2, 4)
SCALE_DTYPES = (torch.float16, torch.bfloat16)


def zeros_stored(scheme: Scheme) -> bool:
    """True when the module holds packed zero points (asymmetric GPTQ, and every AWQ module)."""
    return scheme.method is METHOD.AWQ or not scheme.sym


def layout_errors(scheme: Scheme) -> list[str]:
    """Why ``scheme`` has no BitBLAS encoding (empty when it has one)."""
    b, k, n = scheme.bits, scheme.in_features, scheme.out_features
    errors = []
    if b not in BITBLAS_BITS or (scheme.method is METHOD.AWQ and b != 4):
        errors.append(f"bits {b}: BitBLAS checkpoints are {'4' if scheme.method is METHOD.AWQ else '2, 4 or 8'}-bit")
        return errors
    if scheme.desc_act:
        errors.append("desc_act: BitBLAS checkpoints have no g_idx (GPTQModel forces desc_act off)")
    if b in LOP3_BITS and (k * b) % 32:
        errors.append(f"in_features {k}: a row of {b}-bit codes must fill whole 32-bit words (K*bits % 32 == 0)")
    if (n * b) % 8:
        errors.append(f"out_features {n}: packed zero points need N*bits % 8 == 0")
    if k % scheme.group_size:
        errors.append(f"in_features {k}: not a multiple of group_size {scheme.group_size}")
    return errors


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Expected shape and dtype of every stored tensor (``qzeros`` is ``[0]`` for symmetric GPTQ)."""
    b, k, n, g = scheme.bits, scheme.in_features, scheme.out_features, scheme.num_groups
    zeros = (g, n * b // 8) if zeros_stored(scheme) else (0,)
    return {"qweight": ((n, k * b // 8), torch.int8), "scales": ((n, g), torch.float16), "qzeros": (zeros, torch.int8)}


# ---------------------------------------------------------------- bit packing (general_compress and LOP3)
def compress(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes ``[R, C]`` -> int8 ``[R, C*bits/8]``, ``8/bits`` per byte, first in the low bits."""
    per = 8 // bits
    c = codes.to(torch.int32).reshape(codes.shape[0], -1, per)
    shifts = bits * torch.arange(per, dtype=torch.int32, device=codes.device)
    return (c << shifts).sum(-1).to(torch.uint8).view(torch.int8)


def decompress(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """int8 ``[R, count*bits/8]`` -> uint8 codes ``[R, count]`` (inverse of ``compress``)."""
    per = 8 // bits
    shifts = bits * torch.arange(per, dtype=torch.int32, device=packed.device)
    c = (packed.view(torch.uint8).to(torch.int32)[..., None] >> shifts) & ((1 << bits) - 1)
    return c.reshape(packed.shape[0], count).to(torch.uint8)


def _destinations(bits: int) -> torch.Tensor:
    """Bit position, in the permuted int32 word, of code ``i`` of the compressed word (module docstring)."""
    i = torch.arange(32 // bits, dtype=torch.int64)
    dest = 16 * (i % 2) + bits * (i // 2)
    if bits == 2:  # then bytes 1 and 2 of the word trade places
        byte = dest // 8
        dest = torch.where(byte == 1, dest + 8, torch.where(byte == 2, dest - 8, dest))
    return dest


def _words(row_bytes: torch.Tensor) -> torch.Tensor:
    """int8 ``[R, 4W]`` -> int64 ``[R, W]`` little-endian unsigned 32-bit words."""
    r = row_bytes.view(torch.uint8).to(torch.int64).reshape(row_bytes.shape[0], -1, 4)
    return (r << (8 * torch.arange(4, device=r.device))).sum(-1)


def _bytes(words: torch.Tensor) -> torch.Tensor:
    """int64 ``[R, W]`` unsigned 32-bit words -> int8 ``[R, 4W]`` (little-endian)."""
    b = (words[..., None] >> (8 * torch.arange(4, device=words.device))) & 0xFF
    return b.reshape(words.shape[0], -1).to(torch.uint8).view(torch.int8)


def lop3_permute(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Compressed rows -> BitBLAS's LOP3 fast-decoding word order (``bits`` 2 or 4)."""
    w, mask = _words(packed), (1 << bits) - 1
    out = torch.zeros_like(w)
    for i, d in enumerate(_destinations(bits).tolist()):
        out |= ((w >> (bits * i)) & mask) << d
    return _bytes(out)


def lop3_unpermute(stored: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``lop3_permute``."""
    w, mask = _words(stored), (1 << bits) - 1
    out = torch.zeros_like(w)
    for i, d in enumerate(_destinations(bits).tolist()):
        out |= ((w >> d) & mask) << (bits * i)
    return _bytes(out)


def pack_qweight(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``[N, K]`` -> stored ``qweight`` int8 ``[N, K*bits/8]``."""
    packed = compress(codes, bits)
    return lop3_permute(packed, bits) if bits in LOP3_BITS else packed


def unpack_qweight(qweight: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Stored ``qweight`` -> uint8 codes ``[N, K]``."""
    packed = lop3_unpermute(qweight, bits) if bits in LOP3_BITS else qweight
    return decompress(packed, bits, k)


# ---------------------------------------------------------------- canonical form
def _check_scheme(scheme: Scheme) -> None:
    if scheme.format is not FORMAT.BITBLAS or scheme.method not in (METHOD.GPTQ, METHOD.AWQ):
        raise ValueError(f"scheme: expected a gptq or awq bitblas scheme, got {scheme.method.value} "
                         f"{scheme.format.value}")
    errors = layout_errors(scheme)
    if errors:
        raise ValueError(f"scheme: no BitBLAS layout for {scheme.bits}-bit K={scheme.in_features} "
                         f"N={scheme.out_features}: {'; '.join(errors)}")


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> AffineWeight:
    """Decode stored ``qweight``, ``scales``, ``qzeros`` into the canonical form."""
    _check_scheme(scheme)
    if not zeros_stored(scheme) and "qzeros" not in tensors:  # GPTQModel saves an empty one; accept none too
        tensors = {**tensors, "qzeros": torch.empty(0, dtype=torch.int8)}
    require_tensors(tensors, checkpoint_shapes(scheme), scheme, {"scales": SCALE_DTYPES[1:]})
    b, k, n, g = scheme.bits, scheme.in_features, scheme.out_features, scheme.num_groups
    codes = unpack_qweight(tensors["qweight"], b, k)
    if zeros_stored(scheme):
        zeros = decompress(tensors["qzeros"], b, n).t().to(torch.int32).contiguous()
    else:
        zeros = torch.full((n, g), 1 << (b - 1), dtype=torch.int32)
    g_idx = torch.arange(k, dtype=torch.int32) // scheme.group_size
    return AffineWeight(codes=codes, scales=tensors["scales"].clone(), zeros=zeros, g_idx=g_idx, bits=b,
                        group_size=scheme.group_size, sym=scheme.sym)


def to_checkpoint(q: AffineWeight, scheme: Scheme, scale_dtype: torch.dtype = torch.float16
                  ) -> dict[str, torch.Tensor]:
    """Encode ``q`` as GPTQModel writes a BitBLAS module (``qweight``, ``scales``, ``qzeros``)."""
    _check_scheme(scheme)
    b, k, n = scheme.bits, scheme.in_features, scheme.out_features
    if (q.out_features, q.in_features, q.bits) != (n, k, b) or q.num_groups != scheme.num_groups:
        raise ValueError(f"weight: expected [{n}, {k}] {b}-bit with {scheme.num_groups} groups, got "
                         f"[{q.out_features}, {q.in_features}] {q.bits}-bit with {q.num_groups} groups")
    if q.desc_act:
        raise ValueError("g_idx: act-order (desc_act) grouping; BitBLAS checkpoints group input k as k // group_size")
    if not zeros_stored(scheme) and not bool((q.zeros == 1 << (b - 1)).all()):
        bad = (q.zeros != 1 << (b - 1)).nonzero()[0].tolist()
        raise ValueError(f"zeros: a symmetric BitBLAS layer has zero {1 << (b - 1)} everywhere (signed int{b}); "
                         f"found {int(q.zeros[bad[0], bad[1]])} at [out={bad[0]}, group={bad[1]}]")
    scales = q.scales.to(scale_dtype)
    if not torch.equal(scales.double(), q.scales.double()):
        raise ValueError(f"scales: not exactly representable in {scale_dtype}")
    qzeros = compress(q.zeros.t().contiguous(), b) if zeros_stored(scheme) else torch.empty(0, dtype=torch.int8)
    return {"qweight": pack_qweight(q.codes, b), "scales": scales.contiguous(), "qzeros": qzeros}
