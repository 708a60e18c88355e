"""Marlin's tile layout (formats.md 2.8): GPTQ/AWQ words and canonical codes to and from Marlin tiles, 4 and 8 bits.

Weight. ``qweight [K/16, N*16*b/32]`` int32, tiles of 16 (K) x 64 (N) stored in ``(k_tile, n_tile)`` row-major
order, ``1024*b/32`` words each. Inside a tile, lane ``t`` (0..31) and sub-tile ``j`` (0..3) take
``r = 2*(t % 4)`` and ``c = 16*j + t // 4``; 4-bit word ``4t + j`` holds, low nibble first, the codes at
``(r, c), (r+8, c), (r, c+8), (r+8, c+8), (r+1, c), (r+9, c), (r+1, c+8), (r+9, c+8)``; 8-bit words
``8t + 2j`` and ``+1`` hold ``(r, ·), (r+8, ·), (r+1, ·), (r+9, ·)`` at column ``c`` and then ``c + 8``.
Act-order: row ``k`` of the tiled matrix is source row ``perm[k]``, ``perm = argsort(g_idx)``, and the kernel
gets ``g_idx[perm]`` (sorted) with ``perm``.

Scales ``[G, N]`` keep their values, reordered: grouped (``G > 1``, i.e. ``gs < K``) by an 8x8 transpose
inside every 64 consecutive values (``GROUP_PERM``), channelwise (``G == 1``) and the bias by ``SINGLE_PERM``
inside every 32. Zero points (the AWQ/uint4 path) take the 64-block rule always, then the interleave
``[0,2,4,6,1,3,5,7]`` (8-bit ``[0,2,1,3]``) inside every ``32/b`` columns, packed low field first ->
``[G, N*b/32]``. Everything here is a reshape plus a gather through a small index computed once per width.
"""

from __future__ import annotations

from functools import cache

import torch

from .bitpack import pack_bits, unpack_bits

TILE_K, TILE_N = 16, 64
MARLIN_BITS = (4, 8)
#: new[8i + j] = old[i + 8j] within every 64 values (grouped scales, every zero-point row).
GROUP_PERM = tuple(i + 8 * j for i in range(8) for j in range(8))
#: new[8i + e] = old[2i + (0, 1, 8, 9, 16, 17, 24, 25)[e]] within every 32 values (channelwise scales, bias).
SINGLE_PERM = tuple(2 * i + e for i in range(4) for e in (0, 1, 8, 9, 16, 17, 24, 25))
#: Marlin zero points: slot i of each 32/b columns holds column ZP_INTERLEAVE[b][i] (before packing).
ZP_INTERLEAVE = {4: (0, 2, 4, 6, 1, 3, 5, 7), 8: (0, 2, 1, 3)}
#: AWQ words as vLLM's / GPTQModel's ``awq_marlin_repack`` and ``awq_to_marlin_zero_points`` read them: field i
#: holds logical column AWQ_ORDER[b][i]. For 8 bits this is not ``layouts.awq``'s natural order (see the docs).
AWQ_ORDER = {4: (0, 2, 4, 6, 1, 3, 5, 7), 8: (0, 2, 1, 3)}


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def check_bits(bits: int) -> int:
    """Codes per int32 word; raises unless ``bits`` is 4 or 8 (the only Marlin widths)."""
    _need(isinstance(bits, int) and not isinstance(bits, bool) and bits in MARLIN_BITS,
          f"bits: Marlin tiles hold 4 or 8 bits, got {bits!r}")
    return 32 // bits


def check_shape(in_features: int, out_features: int) -> None:
    """Raise unless ``K % 16 == 0`` and ``N % 64 == 0`` (whole 16 x 64 tiles)."""
    _need(in_features > 0 and in_features % TILE_K == 0,
          f"in_features: Marlin tiles need K a positive multiple of {TILE_K}, got {in_features}")
    _need(out_features > 0 and out_features % TILE_N == 0,
          f"out_features: Marlin tiles need N a positive multiple of {TILE_N}, got {out_features}")


def _tensor(t: object, name: str, dims: int) -> torch.Tensor:
    _need(isinstance(t, torch.Tensor), f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    _need(t.dim() == dims, f"{name}: expected a {dims}-D tensor, got shape {list(t.shape)}")
    return t


def _words(t: object, name: str, shape: tuple[int, int]) -> torch.Tensor:
    t = _tensor(t, name, 2)
    _need(t.dtype == torch.int32, f"{name}: expected dtype torch.int32, got {t.dtype}")
    _need(tuple(t.shape) == shape, f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    return t


def tile_source(bits: int) -> torch.Tensor:
    """For every code slot of one tile's words (word after word, low field first), the index ``r*64 + c`` of the
    code it holds within the 16 x 64 tile (1024 entries, a permutation)."""
    check_bits(bits)
    return torch.tensor(_tile_source(bits))


@cache
def _tile_source(bits: int) -> tuple[int, ...]:
    t = torch.arange(32).view(32, 1, 1, 1)
    j = torch.arange(4).view(1, 4, 1, 1)
    if bits == 4:  # one word per (t, j), 8 nibbles
        rows, cols = torch.tensor([[0, 8, 0, 8, 1, 9, 1, 9]]), torch.tensor([[0, 0, 8, 8, 0, 0, 8, 8]])
    else:  # two words per (t, j): column c, then c + 8; 4 bytes each
        rows, cols = torch.tensor([[0, 8, 1, 9]] * 2), torch.tensor([[0] * 4, [8] * 4])
    r = 2 * (t % 4) + rows
    c = 16 * j + t // 4 + cols
    return tuple((r * TILE_N + c).reshape(-1).tolist())


def _check_perm(perm: torch.Tensor | None, k: int) -> torch.Tensor | None:
    if perm is None:
        return None
    perm = _tensor(perm, "perm", 1)
    _need(not perm.dtype.is_floating_point and perm.dtype != torch.bool,
          f"perm: expected an integer tensor, got {perm.dtype}")
    _need(perm.numel() == k, f"perm: expected {k} entries (one per input channel), got {perm.numel()}")
    p = perm.long().cpu()
    _need(torch.equal(torch.sort(p).values, torch.arange(k)), f"perm: expected a permutation of 0..{k - 1}")
    return p


def pack_weight(codes_kn: torch.Tensor, bits: int, perm: torch.Tensor | None = None) -> torch.Tensor:
    """Codes ``[K, N]`` (uint8) -> Marlin ``qweight [K/16, N*16*b/32]`` int32; row ``k`` tiled is ``perm[k]``."""
    pf = check_bits(bits)
    codes = _tensor(codes_kn, "codes", 2)
    k, n = codes.shape
    check_shape(k, n)
    p = _check_perm(perm, k)
    if p is not None:
        codes = codes[p.to(codes.device)]
    tiles = codes.reshape(k // TILE_K, TILE_K, n // TILE_N, TILE_N).permute(0, 2, 1, 3).reshape(k // 16, n // 64, -1)
    slots = tiles[:, :, tile_source(bits).to(codes.device)]
    return pack_bits(slots, bits, torch.int32, dim=2, name="codes").reshape(k // TILE_K, n * TILE_K // pf)


def unpack_weight(qweight: torch.Tensor, bits: int, in_features: int, out_features: int,
                  perm: torch.Tensor | None = None) -> torch.Tensor:
    """Marlin ``qweight`` -> codes ``[K, N]`` uint8 in source row order (``perm`` undone)."""
    pf = check_bits(bits)
    k, n = in_features, out_features
    check_shape(k, n)
    words = _words(qweight, "qweight", (k // TILE_K, n * TILE_K // pf))
    p = _check_perm(perm, k)
    slots = unpack_bits(words.reshape(k // TILE_K, n // TILE_N, -1), bits, TILE_K * TILE_N, dim=2, name="qweight")
    tiles = torch.empty_like(slots)
    tiles[:, :, tile_source(bits).to(slots.device)] = slots
    codes = tiles.reshape(k // TILE_K, n // TILE_N, TILE_K, TILE_N).permute(0, 2, 1, 3).reshape(k, n)
    if p is None:
        return codes.contiguous()
    out = torch.empty_like(codes)
    out[p.to(codes.device)] = codes
    return out


# ---------------------------------------------------------------- GPTQ and AWQ words (the repack ops)
def gptq_to_marlin(qweight: torch.Tensor, bits: int, perm: torch.Tensor | None = None) -> torch.Tensor:
    """GPTQ ``qweight [K*b/32, N]`` (fields along K) -> Marlin tiles, as ``gptq_marlin_repack`` computes them."""
    pf = check_bits(bits)
    words = _tensor(qweight, "qweight", 2)
    _need(words.dtype == torch.int32, f"qweight: expected GPTQ int32 words, got {words.dtype}")
    codes = unpack_bits(words, bits, words.shape[0] * pf, dim=0, name="qweight")
    return pack_weight(codes, bits, perm)


def marlin_to_gptq(qweight: torch.Tensor, bits: int, in_features: int, out_features: int,
                   perm: torch.Tensor | None = None) -> torch.Tensor:
    """Marlin tiles -> GPTQ ``qweight [K*b/32, N]`` (the inverse of ``gptq_to_marlin``)."""
    codes = unpack_weight(qweight, bits, in_features, out_features, perm)
    return pack_bits(codes, bits, torch.int32, dim=0, name="codes")


def _awq_columns(n: int, bits: int) -> torch.Tensor:
    """Logical column held by each field of a row of AWQ words (``AWQ_ORDER`` repeated along N)."""
    pf = 32 // bits
    return (torch.arange(0, n, pf)[:, None] + torch.tensor(AWQ_ORDER[bits])[None, :]).reshape(-1)


def unpack_awq(words: torch.Tensor, bits: int, name: str = "qweight") -> torch.Tensor:
    """AWQ words ``[R, N*b/32]`` -> values ``[R, N]`` in logical column order (``AWQ_ORDER`` undone)."""
    pf = check_bits(bits)
    words = _tensor(words, name, 2)
    _need(words.dtype == torch.int32, f"{name}: expected AWQ int32 words, got {words.dtype}")
    n = words.shape[1] * pf
    slots = unpack_bits(words, bits, n, dim=1, name=name)
    out = torch.empty_like(slots)
    out[:, _awq_columns(n, bits).to(slots.device)] = slots
    return out


def pack_awq(values_rn: torch.Tensor, bits: int, name: str = "codes") -> torch.Tensor:
    """Values ``[R, N]`` -> AWQ words ``[R, N*b/32]`` with ``AWQ_ORDER`` (the inverse of ``unpack_awq``)."""
    pf = check_bits(bits)
    values = _tensor(values_rn, name, 2)
    _need(values.shape[1] % pf == 0, f"{name}: N={values.shape[1]} is not a multiple of {pf} ({bits}-bit AWQ words)")
    return pack_bits(values[:, _awq_columns(values.shape[1], bits).to(values.device)], bits, torch.int32, dim=1,
                     name=name)


def awq_to_marlin(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """AWQ ``qweight [K, N*b/32]`` (fields along N, interleaved) -> Marlin tiles, as ``awq_marlin_repack`` does."""
    return pack_weight(unpack_awq(qweight, bits), bits)


def marlin_to_awq(qweight: torch.Tensor, bits: int, in_features: int, out_features: int) -> torch.Tensor:
    """Marlin tiles -> AWQ ``qweight [K, N*b/32]`` (the inverse of ``awq_to_marlin``)."""
    return pack_awq(unpack_weight(qweight, bits, in_features, out_features), bits)


# ---------------------------------------------------------------- scales, bias, zero points
def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for new, old in enumerate(perm):
        inv[old] = new
    return tuple(inv)


def _blocks(t: torch.Tensor, perm: tuple[int, ...]) -> torch.Tensor:
    idx = torch.tensor(perm, device=t.device)
    return t.reshape(-1, len(perm))[:, idx].reshape(t.shape).contiguous()


def _scales(s: torch.Tensor, name: str) -> torch.Tensor:
    s = _tensor(s, name, 2)
    _need(s.is_floating_point(), f"{name}: expected a floating dtype, got {s.dtype}")
    _need(s.shape[0] > 0 and s.shape[1] % TILE_N == 0,
          f"{name}: expected shape [G, N] with G >= 1 and N a multiple of {TILE_N}, got {list(s.shape)}")
    return s


def permute_scales(scales_gn: torch.Tensor) -> torch.Tensor:
    """Scales ``[G, N]`` in Marlin's order: the 64-block rule when grouped (``G > 1``, which is ``gs < K``), the
    32-block rule when channelwise (``G == 1``), exactly ``marlin_permute_scales``'s choice."""
    s = _scales(scales_gn, "scales")
    return _blocks(s, GROUP_PERM if s.shape[0] > 1 else SINGLE_PERM)


def unpermute_scales(scales_gn: torch.Tensor) -> torch.Tensor:
    """The inverse of ``permute_scales``."""
    s = _scales(scales_gn, "scales")
    return _blocks(s, _inverse(GROUP_PERM if s.shape[0] > 1 else SINGLE_PERM))


def _bias(bias: torch.Tensor) -> torch.Tensor:
    b = _tensor(bias, "bias", 1)
    _need(b.numel() % TILE_N == 0 and b.numel() > 0,
          f"bias: expected [N] with N a multiple of {TILE_N}, got {list(b.shape)}")
    return b


def permute_bias(bias: torch.Tensor) -> torch.Tensor:
    """Bias ``[N]`` in Marlin's order (the 32-block rule, ``marlin_permute_bias``)."""
    return _blocks(_bias(bias), SINGLE_PERM)


def unpermute_bias(bias: torch.Tensor) -> torch.Tensor:
    """The inverse of ``permute_bias``."""
    return _blocks(_bias(bias), _inverse(SINGLE_PERM))


def pack_zeros(zeros_gn: torch.Tensor, bits: int) -> torch.Tensor:
    """True zero points ``[G, N]`` -> Marlin's ``[G, N*b/32]`` int32 (``marlin_zero_points``)."""
    check_bits(bits)
    z = _tensor(zeros_gn, "zeros", 2)
    _need(not z.dtype.is_floating_point and z.dtype != torch.bool,
          f"zeros: expected an integer dtype (true zero points), got {z.dtype}")
    _need(z.shape[1] % TILE_N == 0, f"zeros: expected [G, N] with N a multiple of {TILE_N}, got {list(z.shape)}")
    z = _blocks(_blocks(z, GROUP_PERM), ZP_INTERLEAVE[bits])
    return pack_bits(z, bits, torch.int32, dim=1, name="zeros")


def unpack_zeros(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """Marlin's packed zero points ``[G, N*b/32]`` -> true zeros ``[G, N]`` int32."""
    pf = check_bits(bits)
    words = _tensor(qzeros, "qzeros", 2)
    _need(words.dtype == torch.int32, f"qzeros: expected int32 words, got {words.dtype}")
    n = words.shape[1] * pf
    _need(n % TILE_N == 0, f"qzeros: expected [G, N*{bits}/32] with N a multiple of {TILE_N}, got {list(words.shape)}")
    z = unpack_bits(words, bits, n, dim=1, name="qzeros").to(torch.int32)
    return _blocks(_blocks(z, _inverse(ZP_INTERLEAVE[bits])), _inverse(GROUP_PERM))


def awq_to_marlin_zeros(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """AWQ ``qzeros [G, N*b/32]`` -> Marlin's packed zero points (``awq_to_marlin_zero_points``)."""
    return pack_zeros(unpack_awq(qzeros, bits, "qzeros"), bits)


def marlin_to_awq_zeros(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """Marlin's packed zero points -> AWQ ``qzeros [G, N*b/32]`` (the inverse of ``awq_to_marlin_zeros``)."""
    return pack_awq(unpack_zeros(qzeros, bits), bits, "zeros")


def sort_g_idx(g_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Act-order: ``(g_idx[perm], perm)`` with ``perm = argsort(g_idx)`` (stable), both int32 [K]."""
    g = _tensor(g_idx, "g_idx", 1)
    _need(not g.dtype.is_floating_point and g.dtype != torch.bool, f"g_idx: expected an integer dtype, got {g.dtype}")
    perm = torch.argsort(g.long(), stable=True)
    return g[perm].to(torch.int32), perm.to(torch.int32)
