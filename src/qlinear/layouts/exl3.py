"""EXL3 (ExLlamaV3) trellis layout: where the bits of a quantized linear sit and what they decode to.

A module stores (exllamav3's names):

- ``trellis`` int16 ``[K/16, N/16, 16*bits]``: one 16x16 weight tile (16 inputs x 16 outputs) per ``[kt, nt]``, coded
  as 256 symbols of ``bits`` bits in a tail-biting trellis. Read the tile's words in pairs with the pair swapped
  (word ``j ^ 1``: the producer streams 32-bit little-endian words high half first), the bitstream is most
  significant bit first; symbol ``t`` is bits ``[t*bits, (t+1)*bits)``. The 16-bit *state* of position ``t`` is
  the 16 stream bits ending with symbol ``t``, the stream read cyclically (so the first states take their high
  bits from the end of the tile). Stream position ``t`` sits at tile row ``r`` / column ``c`` given by the
  tensor-core fragment order (``tile_position``).
- the codebook maps a state to a float16 value (``codebook_table``): ``3inst`` (default, no marker tensor),
  ``mcg`` (marker ``mcg``) and ``mul1`` (marker ``mul1``); a marker is an int32 scalar holding the codebook's
  multiplier. The values are those of exllamav3's CUDA ``decode_3inst<cb>``: two float16 halves added with one
  rounding (``__hadd``), or ``fma(1024 + bytesum, k_inv, k_bias)`` in float16 for mul1.
- ``suh`` float16 ``[K]`` / ``svh`` float16 ``[N]``: input and output scales (older files: ``su`` / ``sv``, int16
  bitfields of +-1 signs, bit ``i`` of word ``j`` is element ``16 j + i``, set = -1).
- optional ``bias`` ``[N]``.

The weight (``[K, N]``, ``y = x @ W``) is ``W = H(diag(suh) H(inner)) diag(svh)``, ``H`` the orthonormal 128-point
Sylvester-Hadamard transform applied blockwise along K (left) and N (right). Half-integer rates of exllamav3 >= 1.6
(``trellis`` last dim ``16*bits`` odd multiple of 8) are not handled here (``shape_errors`` says so).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

CODEBOOKS = ("3inst", "mcg", "mul1")
#: The value the producer writes in each codebook's marker tensor (as uint32; stored as int32).
MARKERS = {"mcg": 0xCBAC1FED, "mul1": 0x83DCD12D}
HAD = 128  # Hadamard block (exllamav3's had_k = had_n = 128)
TILE = 16
_MULT_3INST, _ADD_3INST = 89226354, 64248484
_LOP3_MASK, _LOP3_XOR = 0x8FFF8FFF, 0x3B603B60
_MUL1_ACC = 1024  # float16 0x6400 plus the byte sum (< 1024) is the integer 1024 + sum
_MUL1_INV_BITS, _MUL1_BIAS_BITS = 0x1EEE, 0xC931


class Exl3LayoutError(ValueError):
    """An EXL3 tensor that does not fit its layer (names the tensor, the expected and the found value)."""


@dataclass(frozen=True)
class Exl3Params:
    """EXL3 structure of one layer (``Scheme.layout_params``): trellis bits, codebook, sign storage."""

    bits: int
    codebook: str = "3inst"
    #: Scales stored as ``su``/``sv`` packed sign bitfields instead of float16 ``suh``/``svh``.
    packed_signs: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.bits, int) or isinstance(self.bits, bool) or not 1 <= self.bits <= 8:
            raise Exl3LayoutError(f"EXL3 bits: expected an integer in 1..8, got {self.bits!r}")
        if self.codebook not in CODEBOOKS:
            raise Exl3LayoutError(f"EXL3 codebook: expected one of {', '.join(CODEBOOKS)}, got {self.codebook!r}")

    @property
    def words(self) -> int:
        """int16 words per 16x16 tile."""
        return TILE * self.bits

    @property
    def scale_names(self) -> tuple[str, str]:
        return ("su", "sv") if self.packed_signs else ("suh", "svh")


def shape_errors(in_features: int, out_features: int) -> list[str]:
    """Why an EXL3 layer of this shape cannot exist (the 128-point Hadamard blocks)."""
    return [f"{name} {v} is not a multiple of {HAD} (EXL3's Hadamard block)"
            for name, v in (("in_features", in_features), ("out_features", out_features)) if v % HAD]


def checkpoint_shapes(params: Exl3Params, k: int, n: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Leaf -> (shape, dtype) of a module's tensors (bias aside)."""
    su, sv = params.scale_names
    scale = (lambda m: ((m // TILE,), torch.int16)) if params.packed_signs else (lambda m: ((m,), torch.float16))
    out = {"trellis": ((k // TILE, n // TILE, params.words), torch.int16), su: scale(k), sv: scale(n)}
    if params.codebook in MARKERS:
        out[params.codebook] = ((), torch.int32)
    return out


def marker_tensor(codebook: str) -> torch.Tensor:
    """The producer's marker scalar for ``codebook`` (int32 holding the multiplier's bits)."""
    v = MARKERS[codebook]
    return torch.tensor(v - (1 << 32) if v >= 1 << 31 else v, dtype=torch.int32)


def check_marker(name: str, t: torch.Tensor) -> None:
    want = MARKERS[name]
    if t.numel() != 1 or int(t.reshape(()).item()) & 0xFFFFFFFF != want:
        found = list(t.shape) if t.numel() != 1 else hex(int(t.item()) & 0xFFFFFFFF)
        raise Exl3LayoutError(f"{name}: expected the int32 scalar marker {want:#x}, found {found}")


def _half_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """int64 values in 0..65535 -> the float16 numbers with those bit patterns, as float32."""
    return bits.to(torch.int32).to(torch.int16).view(torch.float16).float()


@functools.lru_cache(maxsize=16)
def codebook_table(codebook: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """float16 ``[65536]``: the value of every 16-bit state (one shared, read-only tensor per codebook and device).
    Computed in float32, where every step here is exact (two float16 halves of bounded exponent; an 11-bit integer
    times an 11-bit constant plus an 11-bit constant), then rounded once to float16, as the CUDA ``__hadd`` /
    ``__hfma`` round the exact result once."""
    if codebook not in CODEBOOKS:
        raise Exl3LayoutError(f"EXL3 codebook: expected one of {', '.join(CODEBOOKS)}, got {codebook!r}")
    s = torch.arange(1 << 16, dtype=torch.int64, device=device)
    if codebook == "mul1":
        x = (s * MARKERS["mul1"]) & 0xFFFFFFFF
        total = (x & 255) + ((x >> 8) & 255) + ((x >> 16) & 255) + (x >> 24)
        k_inv = _half_of_bits(torch.tensor(_MUL1_INV_BITS)).item()
        k_bias = _half_of_bits(torch.tensor(_MUL1_BIAS_BITS)).item()
        return ((total + _MUL1_ACC).float() * k_inv + k_bias).half()
    x = s * _MULT_3INST + _ADD_3INST if codebook == "3inst" else s * MARKERS["mcg"]
    x = ((x & 0xFFFFFFFF) & _LOP3_MASK) ^ _LOP3_XOR
    return (_half_of_bits(x & 0xFFFF) + _half_of_bits(x >> 16)).half()


def tile_position(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stream position ``t`` (0..255) -> (row, column) in its 16x16 tile: lane ``t // 8`` of an mma fragment holds
    rows ``2(lane % 4) + {0, 1, 8, 9}`` of column ``lane // 4`` (items 0..3), then the same rows of column + 8."""
    lane, item = t // 8, t % 8
    row = 2 * (lane % 4) + (item % 2) + 8 * ((item // 2) % 2)
    col = lane // 4 + 8 * (item // 4)
    return row, col


def stream_index() -> torch.Tensor:
    """int64 ``[16, 16]``: the stream position of each tile row/column (inverse of ``tile_position``)."""
    t = torch.arange(256)
    row, col = tile_position(t)
    out = torch.empty(256, dtype=torch.int64)
    out[row * TILE + col] = t
    return out.view(TILE, TILE)


def _state_words(bits: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For stream positions ``positions``: the tile word indices holding each state's two 16-bit halves (pairs
    swapped) and the right shift that aligns the state in their 32-bit concatenation."""
    nw = TILE * bits
    start = (positions * bits + bits - 16) % (nw * 16)  # first bit of each state in the cyclic stream
    w = start // 16
    return w ^ 1, ((w + 1) % nw) ^ 1, 16 - start % 16


def _states(trellis: torch.Tensor, bits: int, positions: torch.Tensor) -> torch.Tensor:
    idx0, idx1, shift = (v.to(trellis.device) for v in _state_words(bits, positions))
    words = trellis.to(torch.int32) & 0xFFFF
    # int32 is enough: the arithmetic shift by at most 16 leaves the low 16 bits as a logical shift would
    return (((words[..., idx0] << 16) | words[..., idx1]) >> shift.to(torch.int32)) & 0xFFFF


def tile_states(trellis: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 ``[..., 256]`` states (stream order) of int16 tiles ``[..., 16*bits]`` (module docstring)."""
    return _states(trellis, bits, torch.arange(256))


def inner_weight(trellis: torch.Tensor, bits: int, table: torch.Tensor, t0: int = 0,
                 t1: int | None = None) -> torch.Tensor:
    """The float16 inner weight ``[K, 16 (t1 - t0)]`` of output tiles ``t0:t1`` (before the Hadamard transforms)."""
    part = trellis[:, t0:t1]
    kt, nt = part.shape[:2]
    vals = table[_states(part, bits, stream_index().view(-1))]  # [kt, nt, 256]: row-major tiles
    return vals.view(kt, nt, TILE, TILE).permute(0, 2, 1, 3).reshape(kt * TILE, nt * TILE)


def unpack_signs(packed: torch.Tensor) -> torch.Tensor:
    """int16 bitfield ``[L]`` -> float16 ``[16 L]`` of +-1 (bit ``i`` of word ``j`` -> element ``16 j + i``)."""
    bits = (packed.to(torch.int64).unsqueeze(-1) >> torch.arange(16, device=packed.device)) & 1
    return (1 - 2 * bits).reshape(-1).to(torch.float16)


@functools.lru_cache(maxsize=16)
def hadamard(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The orthonormal 128x128 Sylvester-Hadamard matrix (symmetric; one shared, read-only tensor per device and
    dtype); ``+-1/sqrt(128)`` is exact in float32."""
    i = torch.arange(HAD)
    parity = torch.zeros(HAD, HAD, dtype=torch.int64)
    anded = i[:, None] & i[None, :]
    for b in range(7):
        parity ^= (anded >> b) & 1
    return ((1 - 2 * parity).to(torch.float64) / math.sqrt(HAD)).to(device=device, dtype=dtype)


def had_last(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """``x [..., L]`` with the Hadamard transform applied to each 128-block of the last dimension."""
    return (x.reshape(*x.shape[:-1], -1, HAD) @ h).reshape(x.shape)


def check_tensors(tensors: Mapping[str, torch.Tensor], params: Exl3Params, k: int, n: int) -> None:
    """Raise ``Exl3LayoutError`` naming the tensor for a wrong shape / dtype, a bad marker or non-finite scales."""
    for name, (shape, dtype) in checkpoint_shapes(params, k, n).items():
        t = tensors.get(name)
        if t is None:
            raise Exl3LayoutError(f"{name}: missing (EXL3 {params.bits}-bit {params.codebook}, [{k}, {n}])")
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise Exl3LayoutError(f"{name}: expected shape {list(shape)} dtype {dtype}, found shape "
                                  f"{list(t.shape)} dtype {t.dtype}")
    for name in params.scale_names if not params.packed_signs else ():
        if not bool(torch.isfinite(tensors[name]).all()):
            raise Exl3LayoutError(f"{name}: scales must be finite; found NaN or infinity")
    if params.codebook in MARKERS:
        check_marker(params.codebook, tensors[params.codebook])


def scale_vectors(tensors: Mapping[str, torch.Tensor], params: Exl3Params) -> tuple[torch.Tensor, torch.Tensor]:
    """float16 ``(suh [K], svh [N])``, unpacked from ``su``/``sv`` where the file stores signs."""
    su, sv = (tensors[name] for name in params.scale_names)
    return (unpack_signs(su), unpack_signs(sv)) if params.packed_signs else (su, sv)


def dense_weight(tensors: Mapping[str, torch.Tensor], params: Exl3Params) -> torch.Tensor:
    """float32 ``[K, N]`` weight (``y = x @ W``): the float16 inner weight transformed in float32 as GPTQModel's
    ``get_weight_tensor`` does (left Hadamard, ``* suh``, right Hadamard, ``* svh``)."""
    trellis = tensors["trellis"]
    k, n = trellis.shape[0] * TILE, trellis.shape[1] * TILE
    check_tensors(tensors, params, k, n)
    suh, svh = scale_vectors(tensors, params)
    h = hadamard(trellis.device)
    w = inner_weight(trellis, params.bits, codebook_table(params.codebook, trellis.device)).float()
    w = had_last(w.t(), h).t() * suh.float().unsqueeze(1)
    return had_last(w, h) * svh.float().unsqueeze(0)
