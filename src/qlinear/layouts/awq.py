"""AWQ layouts (formats.md 2.5-2.7): ``gemm``, ``gemv``, ``gemv_fast`` and ``llm-awq``, to and from AffineWeight.

All four hold true zero points and no ``g_idx`` (input channel ``k`` is in group ``k // gs``), so a weight
whose g_idx is act-order has no AWQ encoding and is refused.

* ``gemm``: ``qweight [K, N/pf]``, ``qzeros [G, N/pf]`` int32 packed along N, ``pf = 32/b`` fields per
  word; ``scales [G, N]`` float16 (bfloat16 read and written on request). 4-bit words use the AWQ
  interleave (slot ``i`` holds column ``8c + ORDER[i]``); 2- and 8-bit words hold columns in natural
  order, as GPTQModel's ``pack_awq_cpu`` (the only AWQ packer with other widths) writes them. 3, 5, 6
  and 7 bits do not fill a word evenly and no AWQ packer or reader defines them: refused.
* ``gemv``: ``qweight [N, K/8]`` sequential nibbles along K; ``qzeros [N, zw]`` sequential nibbles along
  groups; ``scales [N, 8*zw]`` float16; unused slots and padding columns zero (``zeros_width``).
* ``gemv_fast`` / ``llm-awq``: ``qweight [N/4, K]`` int16 (4x8 transpose inside 32-wide K blocks, then 4
  rows interleaved per 64-wide K chunk); ``scales`` and the scaled negative zeros ``-s*z`` as
  ``[8*zw, N]`` float16, padding rows zero. The zero buffer is ``qzeros`` (gemv_fast) or ``scaled_zeros``.

Decoding gemv_fast zero points. The buffer holds ``fp16(-(s*z))``. For a finite nonzero scale the rounding
error is at most ``2**-11 * s*z`` (exact in the subnormal range, where ``s`` and ``s*z`` are multiples of
``2**-24``), so ``round(-zbuf/s)`` recovers any ``z < 1024`` exactly: every weight the packers write decodes
to its integer zero. ``zeros_from_scaled`` re-encodes the recovered ``z`` and raises unless it reproduces
the stored value, naming the first entry that does not (a checkpoint whose zero is not an integer has no
canonical form; its kernels can still use the buffer as it is). A zero scale decodes to ``z = 0``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..affine import AffineWeight
from ..enums import FORMAT, METHOD
from ..spec import AWQ_LAYOUT_BITS, Scheme, default_pack_dtype
from .bitpack import pack_bits, unpack_bits
from .tensors import require_tensors

ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)
#: gemv_fast: new position p of a 32-wide K block takes old position FAST_PERM[p] (a 4x8 transpose).
FAST_PERM = tuple(8 * (p % 4) + p // 4 for p in range(32))
INTERLEAVE, KSTRIDE = 4, 64
AWQ_LAYOUT_FORMATS = (FORMAT.GEMM, FORMAT.GEMV, FORMAT.GEMV_FAST, FORMAT.LLM_AWQ)
FAST_FORMATS = (FORMAT.GEMV_FAST, FORMAT.LLM_AWQ)
SCALE_DTYPES = (torch.float16, torch.bfloat16)


def field_order(bits: int) -> tuple[int, ...]:
    """Logical column held by each slot of a GEMM word: the AWQ interleave for 4-bit, natural otherwise."""
    if bits not in AWQ_LAYOUT_BITS[FORMAT.GEMM]:
        raise ValueError(f"bits: AWQ GEMM words hold 2, 4 or 8 bits (32/b fields per int32 word), got {bits!r}; "
                         "no AWQ packer defines 3, 5, 6 or 7-bit words")
    return ORDER if bits == 4 else tuple(range(32 // bits))


def zeros_width(in_features: int, group_size: int) -> int:
    """``calculate_zeros_width``: int32 words of zero points per row in the GEMV layouts (8 groups a word).

    ``ceil(ceil(K/gs)/8)`` rounded up to a multiple of 1 (gs >= 128), 2 (gs = 64) or 4 (gs = 32). The
    reference floors ``K/gs``; the two agree wherever the reference can hold all ``ceil(K/gs)`` groups.
    """
    mult = 1 if group_size >= 128 else {64: 2, 32: 4}.get(group_size)
    if mult is None:
        raise ValueError(f"group_size: the AWQ GEMV zeros-width rule has no width for group size {group_size} "
                         "(accepts 32, 64 or >= 128; -1 means in_features)")
    groups = -(-in_features // group_size)
    base = -(-groups // 8)
    return -(-base // mult) * mult


def zeros_name(fmt: FORMAT | str) -> str:
    """Name of the zero-point buffer: ``scaled_zeros`` for llm-awq, ``qzeros`` for the others."""
    return "scaled_zeros" if FORMAT(fmt) is FORMAT.LLM_AWQ else "qzeros"


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# ---------------------------------------------------------------- GEMM words (packed along N)
def gemm_slot_columns(n: int, bits: int) -> torch.Tensor:
    """Logical column held by each slot of a row of GEMM words: slot ``pf*c + i`` holds ``pf*c + order[i]``."""
    pf, order = 32 // bits, field_order(bits)
    return (torch.arange(0, n, pf)[:, None] + torch.tensor(order)[None, :]).reshape(-1)


def pack_gemm(codes: torch.Tensor, bits: int, name: str = "codes") -> torch.Tensor:
    """Rows of codes ``[R, N]`` -> int32 words ``[R, N/pf]``, slot ``i`` of word ``c`` = column ``pf*c + order[i]``."""
    field_order(bits)
    pf = 32 // bits
    _need(codes.dim() == 2, f"{name}: expected a 2-D [rows, out_features] tensor, got shape {tuple(codes.shape)}")
    n = codes.shape[1]
    _need(n % pf == 0, f"{name}: out_features {n} is not a multiple of {pf}: AWQ GEMM packs {pf} "
                       f"{bits}-bit columns per int32 word and has no partial words")
    return pack_bits(codes[:, gemm_slot_columns(n, bits)], bits, torch.int32, dim=1, name=name)


def unpack_gemm(words: torch.Tensor, bits: int, out_features: int, name: str = "qweight") -> torch.Tensor:
    """int32 words ``[R, N/pf]`` -> codes ``[R, N]`` uint8 (the AWQ interleave undone)."""
    field_order(bits)
    pf = 32 // bits
    _need(words.dim() == 2 and words.dtype == torch.int32 and words.shape[1] * pf == out_features,
          f"{name}: expected int32 words of shape [rows, N/{pf}] for N={out_features} at {bits} bits, "
          f"got {words.dtype} {list(words.shape)}")
    slots = unpack_bits(words, bits, out_features, dim=1, name=name)
    inv = torch.empty(out_features, dtype=torch.long)
    inv[gemm_slot_columns(out_features, bits)] = torch.arange(out_features)
    return slots[:, inv.to(slots.device)]


# ---------------------------------------------------------------- GEMV_FAST words
def pack_fast(codes_nk: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[N, K]`` -> int16 ``qweight [N/4, K]`` (formats.md 2.7)."""
    n, k = codes_nk.shape
    _need(n % INTERLEAVE == 0, f"codes: out_features {n} is not a multiple of {INTERLEAVE} (gemv_fast interleaves "
                               f"{INTERLEAVE} output rows)")
    _need(k % KSTRIDE == 0, f"codes: in_features {k} is not a multiple of {KSTRIDE} (gemv_fast packs K in "
                            f"chunks of {KSTRIDE})")
    perm = torch.tensor(FAST_PERM, device=codes_nk.device)
    p = codes_nk.reshape(n, k // 32, 32)[:, :, perm].reshape(n // 4, 4, k // 64, 64)
    flat = p.transpose(1, 2).reshape(n // 4, k // 64, 256)
    return pack_bits(flat, 4, torch.int16, dim=2, name="codes").reshape(n // 4, k)


def unpack_fast(qweight: torch.Tensor, out_features: int) -> torch.Tensor:
    """int16 ``qweight [N/4, K']`` (K' a multiple of 64, any 64-aligned column slice) -> codes ``[N, K']``."""
    r, k = qweight.shape
    _need(qweight.dtype == torch.int16 and r * 4 == out_features and k % KSTRIDE == 0,
          f"qweight: expected int16 words of shape [{out_features // 4}, K] with K a multiple of {KSTRIDE}, "
          f"got {qweight.dtype} {list(qweight.shape)}")
    flat = unpack_bits(qweight.reshape(r, k // 64, 64), 4, 256, dim=2, name="qweight")
    p = flat.reshape(r, k // 64, 4, 64).transpose(1, 2).reshape(out_features, k // 32, 32)
    inv = torch.empty(32, dtype=torch.long)
    inv[list(FAST_PERM)] = torch.arange(32)
    return p[:, :, inv.to(p.device)].reshape(out_features, k)


def scaled_zeros(scales_gn: torch.Tensor, zeros_gn: torch.Tensor) -> torch.Tensor:
    """``fp16(-(s*z))`` as the packers compute it (float16 ``s`` times float32 ``z``, one rounding)."""
    out = -(scales_gn.to(torch.float16).float() * zeros_gn.float()).to(torch.float16)
    if not bool(torch.isfinite(out).all()):
        g, n = (~torch.isfinite(out)).nonzero()[0].tolist()
        raise ValueError(f"zeros: scaled zero -s*z = -{scales_gn[g, n].item()}*{int(zeros_gn[g, n])} at (group {g}, "
                         f"out column {n}) overflows float16, the dtype gemv_fast stores it in")
    return out


def zeros_from_scaled(zbuf_gn: torch.Tensor, scales_gn: torch.Tensor, bits: int, name: str = "qzeros") -> torch.Tensor:
    """Integer zeros ``[G, N]`` from scaled negative zeros; raises where no integer ``z`` reproduces ``zbuf``."""
    s, zb = scales_gn.double(), zbuf_gn.double()
    z = torch.where(s != 0, torch.round(-zb / torch.where(s != 0, s, 1.0)), 0.0)
    z = torch.nan_to_num(z, nan=-1.0, posinf=-1.0, neginf=-1.0)
    ok = (z >= 0) & (z <= (1 << bits) - 1)
    zi = torch.where(ok, z, 0.0).to(torch.int32)
    ok &= scaled_zeros(scales_gn, zi) == zbuf_gn
    if not bool(ok.all()):
        g, n = (~ok).nonzero()[0].tolist()
        raise ValueError(f"{name}: scaled zero {zbuf_gn[g, n].item()} at (group {g}, out column {n}) is not -s*z for "
                         f"an integer z in 0..{(1 << bits) - 1} with s = {scales_gn[g, n].item()}: this weight has no "
                         "integer zero point, so it has no canonical (GPTQ/AWQ GEMM) form")
    return zi


# ---------------------------------------------------------------- whole checkpoints
def _format(fmt: FORMAT | str) -> FORMAT:
    fmt = FORMAT(fmt)
    _need(fmt in AWQ_LAYOUT_FORMATS,
          f"fmt: expected one of {', '.join(f.value for f in AWQ_LAYOUT_FORMATS)}, got {fmt.value!r}")
    return fmt


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Expected shape and dtype of every checkpoint tensor for ``scheme`` (raises if it has no AWQ layout)."""
    fmt, b = _format(scheme.format), scheme.bits
    k, n, g, gs = scheme.in_features, scheme.out_features, scheme.num_groups, scheme.group_size
    _need(b in AWQ_LAYOUT_BITS[fmt], f"bits: AWQ {fmt.value} holds bits "
                                     f"{', '.join(map(str, AWQ_LAYOUT_BITS[fmt]))}, got {b}")
    word = default_pack_dtype(fmt)
    _need(scheme.pack_dtype == word, f"pack_dtype: AWQ {fmt.value} checkpoints store {word} words, "
                                     f"got {scheme.pack_dtype}")
    if fmt is FORMAT.GEMM:
        pf = 32 // b
        _need(n % pf == 0, f"out_features: {n} is not a multiple of {pf}: AWQ GEMM packs {pf} {b}-bit columns "
                           "per int32 word and has no partial words")
        return {"qweight": ((k, n // pf), torch.int32), "qzeros": ((g, n // pf), torch.int32),
                "scales": ((g, n), torch.float16)}
    zw = zeros_width(k, gs)
    if fmt is FORMAT.GEMV:
        _need(k % 8 == 0, f"in_features: {k} is not a multiple of 8 (gemv packs 8 input channels per int32 word)")
        return {"qweight": ((n, k // 8), torch.int32), "qzeros": ((n, zw), torch.int32),
                "scales": ((n, zw * 8), torch.float16)}
    _need(k % KSTRIDE == 0 and n % INTERLEAVE == 0, f"in_features {k} / out_features {n}: {fmt.value} needs K a "
                                                    f"multiple of {KSTRIDE} and N a multiple of {INTERLEAVE}")
    return {"qweight": ((n // 4, k), torch.int16), zeros_name(fmt): ((zw * 8, n), torch.float16),
            "scales": ((zw * 8, n), torch.float16)}


def _padded(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = length
    out = torch.zeros(shape, dtype=t.dtype, device=t.device)
    out.narrow(dim, 0, t.shape[dim]).copy_(t)
    return out


def _scales(scales_gn: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    _need(dtype in SCALE_DTYPES, f"scale_dtype: expected torch.float16 or torch.bfloat16, got {dtype}")
    out = scales_gn.to(dtype)
    if not bool(torch.isfinite(out).all()):
        g, n = (~torch.isfinite(out)).nonzero()[0].tolist()
        raise ValueError(f"scales: {scales_gn[g, n].item()} at (group {g}, out column {n}) is not finite as {dtype}")
    return out


def to_checkpoint(q: AffineWeight, fmt: FORMAT | str,
                  scale_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """The AWQ checkpoint tensors of ``q`` in ``fmt`` (``scale_dtype`` bfloat16 only for gemm)."""
    fmt = _format(fmt)
    if q.desc_act:
        raise ValueError("g_idx: act-order grouping (desc_act) has no AWQ encoding: AWQ layouts carry no g_idx and "
                         "group input channel k as k // group_size; keep this weight in a GPTQ format")
    scheme = Scheme(bits=q.bits, group_size=q.group_size, in_features=q.in_features, out_features=q.out_features,
                    sym=q.sym, method=METHOD.AWQ, format=fmt)
    shapes = checkpoint_shapes(scheme)
    codes, zeros = q.codes.detach().cpu(), q.zeros.detach().cpu()
    scales = _scales(q.scales.detach().cpu().t(), scale_dtype if fmt is FORMAT.GEMM else torch.float16)
    qweight = qweight_of(codes, fmt, q.bits)
    if fmt is FORMAT.GEMM:
        return {"qweight": qweight, "qzeros": pack_gemm(zeros.t(), q.bits, "zeros"), "scales": scales.contiguous()}
    rows = shapes["scales"][0][0 if fmt in FAST_FORMATS else 1]
    if fmt is FORMAT.GEMV:
        return {"qweight": qweight, "qzeros": pack_bits(_padded(zeros, rows, 1), 4, torch.int32, dim=1, name="zeros"),
                "scales": _padded(scales.t(), rows, 1)}
    return {"qweight": qweight, zeros_name(fmt): _padded(scaled_zeros(scales, zeros.t()), rows, 0),
            "scales": _padded(scales, rows, 0)}


def qweight_of(codes_nk: torch.Tensor, fmt: FORMAT | str, bits: int) -> torch.Tensor:
    """Codes ``[N, K]`` -> the ``qweight`` words of ``fmt`` (gemm: rows of K, interleaved columns; gemv: along K;
    gemv_fast / llm-awq: the fast interleave)."""
    fmt = _format(fmt)
    if fmt is FORMAT.GEMM:
        return pack_gemm(codes_nk.t(), bits)
    if fmt is FORMAT.GEMV:
        return pack_bits(codes_nk, 4, torch.int32, dim=1)
    return pack_fast(codes_nk)


def check_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> None:
    """Raise unless every checkpoint tensor of ``scheme`` is present with its shape and dtype (GEMM scales
    may also be bfloat16: they are read as they are)."""
    extra = {"scales": tuple(SCALE_DTYPES)} if scheme.format is FORMAT.GEMM else None
    require_tensors(tensors, checkpoint_shapes(scheme), scheme, extra)


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> AffineWeight:
    """Decode AWQ checkpoint tensors into an AffineWeight (plain g_idx, true zeros, ``[N, G]`` scales)."""
    if scheme.method is not METHOD.AWQ:
        raise ValueError(f"scheme: expected method 'awq', got {scheme.method.value!r}")
    fmt = _format(scheme.format)
    check_tensors(tensors, scheme)
    b, k, n, g = scheme.bits, scheme.in_features, scheme.out_features, scheme.num_groups
    t = {name: tensors[name].detach().cpu() for name in checkpoint_shapes(scheme)}
    if fmt is FORMAT.GEMM:
        codes = unpack_gemm(t["qweight"], b, n).t()
        zeros = unpack_gemm(t["qzeros"], b, n, "qzeros").t().to(torch.int32)
        scales = t["scales"].t()
    elif fmt is FORMAT.GEMV:
        codes = unpack_bits(t["qweight"], 4, k, dim=1, name="qweight")
        zeros = unpack_bits(t["qzeros"], 4, g, dim=1, name="qzeros").to(torch.int32)
        scales = t["scales"][:, :g]
    else:
        name = zeros_name(fmt)
        codes = unpack_fast(t["qweight"], n)
        scales = t["scales"][:g].t()
        zeros = zeros_from_scaled(t[name][:g], t["scales"][:g], b, name).t()
    g_idx = torch.arange(k, dtype=torch.int32) // scheme.group_size
    return AffineWeight(codes=codes.contiguous(), scales=scales.clone(memory_format=torch.contiguous_format),
                        zeros=zeros.contiguous(), g_idx=g_idx, bits=b, group_size=scheme.group_size, sym=scheme.sym)
