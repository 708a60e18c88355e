"""MLX affine quantization, as ``mx.quantize`` and mlx-lm checkpoints store it (formats.md, MLX).

| tensor | shape | dtype | holds |
|---|---|---|---|
| ``weight`` | ``[N, K * bits / 32]`` | uint32 | the codes as one little-endian bit stream per row |
| ``scales`` | ``[N, K / gs]`` | the model's float dtype | per group |
| ``biases`` | ``[N, K / gs]`` | same as ``scales`` | per group: the value of code 0 |

Facts checked against mlx 0.32.4 (tests/test_mlx_layout.py runs it):

* bits 1, 2, 3, 4, 5, 6, 8 and group sizes 32, 64, 128 only; K a multiple of the group size.
* Code ``k`` of a row occupies bits ``k*bits .. k*bits + bits - 1`` of the row's stream, word ``i`` holding stream
  bits ``32 i .. 32 i + 31`` (least significant first): 3, 5 and 6-bit codes straddle words. Every 32 codes fill
  exactly ``bits`` words, so the layout repeats with that period.
* ``w = scales * q + biases`` computed in the scales' dtype, each operation rounded to it (the product, then the
  sum): float16 and bfloat16 results are not the single rounding of the exact value.
* MLX's quantizer makes zero exactly representable: per group it scales towards the larger-magnitude edge, so scales
  are negative in about half of the groups, and a constant group gets a tiny negative scale (-1.2e-7) and the
  constant as bias.

``MlxWeight`` keeps codes ``[N, K]`` uint8 and the scales and biases as stored; it is lossless both ways.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..enums import FORMAT, METHOD
from ..spec import Scheme
from .tensors import check_against

BITS = (1, 2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WORD_MASK = 0xFFFFFFFF
#: Codes per period of the layout: 32 codes of ``b`` bits fill exactly ``b`` words.
PERIOD = 32


@dataclass(frozen=True, eq=False)
class MlxWeight:
    """Codes ``[N, K]`` uint8, scales and biases ``[N, K / group_size]`` in one float dtype, as stored."""

    codes: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor
    bits: int
    group_size: int

    def __post_init__(self) -> None:
        check_weight(self.codes, self.scales, self.biases, self.bits, self.group_size)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    @property
    def num_groups(self) -> int:
        return self.scales.shape[1]

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight ``[N, K]`` exactly as ``mx.dequantize`` gives it (in the scales' dtype), then cast to
        ``dtype`` when one is given."""
        w = affine_values(self.codes, self.scales, self.biases, self.group_size)
        return w if dtype is None else w.to(dtype)


def params_errors(bits: int, group_size: int, in_features: int) -> list[str]:
    """Why ``bits`` / ``group_size`` / ``in_features`` cannot be an MLX affine layer."""
    out = []
    if bits not in BITS:
        out.append(f"bits: MLX affine quantization holds {', '.join(map(str, BITS))} bits; got {bits!r}")
    if group_size not in GROUP_SIZES:
        out.append(f"group_size: MLX affine quantization uses {', '.join(map(str, GROUP_SIZES))}; got {group_size!r}")
    elif in_features % group_size:
        out.append(f"in_features {in_features} is not a multiple of the group size {group_size}")
    return out


def check_params(bits: int, group_size: int, in_features: int) -> None:
    errors = params_errors(bits, group_size, in_features)
    if errors:
        raise ValueError("; ".join(errors))


def check_weight(codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int,
                 group_size: int) -> None:
    """Raise ``ValueError`` naming the tensor, what was expected and what was found."""
    if not isinstance(codes, torch.Tensor) or codes.dim() != 2 or codes.dtype != torch.uint8:
        found = f"{codes.dtype} shape {list(codes.shape)}" if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise ValueError(f"codes: expected a uint8 [N, K] tensor; got {found}")
    n, k = codes.shape
    check_params(bits, group_size, k)
    if codes.numel() and int(codes.max()) >= 1 << bits:
        raise ValueError(f"codes: {bits}-bit codes must lie in 0..{(1 << bits) - 1}; found {int(codes.max())}")
    check_groups(scales, biases, n, k // group_size)


def check_groups(scales: torch.Tensor, biases: torch.Tensor, n: int, g: int) -> None:
    """Scales and biases: ``[n, g]``, one float dtype MLX stores, finite."""
    for name, t in (("scales", scales), ("biases", biases)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (n, g) or t.dtype not in SCALE_DTYPES:
            found = f"{t.dtype} shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected a float16/bfloat16/float32 tensor of shape [{n}, {g}]; got {found}")
    if biases.dtype != scales.dtype:
        raise ValueError(f"biases: expected the scales' dtype {scales.dtype} (MLX computes in it); got {biases.dtype}")
    for name, t in (("scales", scales), ("biases", biases)):
        bad = ~torch.isfinite(t)
        if bool(bad.any()):
            r, c = bad.nonzero()[0].tolist()
            raise ValueError(f"{name}: every value must be finite; found {t[r, c].item()} at [out={r}, group={c}]")


# ------------------------------------------------------------------------------------------------ bit stream
def _period_map(bits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the 32 codes of one period: word index, shift inside it, the next word's index, and whether the code
    spills into that next word."""
    off = torch.arange(PERIOD, device=device, dtype=torch.int64) * bits
    word, shift = off // 32, off % 32
    spill = shift + bits > 32
    return word, shift, torch.clamp(word + 1, max=bits - 1), spill


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes ``[N, K]`` (K a multiple of 32) -> MLX words ``[N, K * bits / 32]`` uint32."""
    n, k = codes.shape
    if k % PERIOD:
        raise ValueError(f"codes: in_features {k} is not a multiple of {PERIOD} (MLX packs 32 codes per period)")
    word, shift, nxt, spill = _period_map(bits, codes.device)
    c = codes.to(torch.int64).reshape(n, k // PERIOD, PERIOD)
    words = torch.zeros(n, k // PERIOD, bits, dtype=torch.int64, device=codes.device)
    words.index_add_(2, word, (c << shift) & WORD_MASK)  # fields never overlap: adding is or-ing
    words.index_add_(2, nxt, torch.where(spill, c >> (32 - shift).clamp(max=63), 0))
    words = words.reshape(n, k * bits // 32)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32).view(torch.uint32)


def unpack(words: torch.Tensor, bits: int, in_features: int) -> torch.Tensor:
    """MLX words ``[N, K * bits / 32]`` (uint32, or int32 of the same bits) -> codes ``[N, K]`` uint8."""
    n = words.shape[0]
    k = in_features
    w = words.view(torch.int32).to(torch.int64).bitwise_and_(WORD_MASK).reshape(n, k // PERIOD, bits)
    word, shift, nxt, spill = _period_map(bits, words.device)
    lo = w[:, :, word] >> shift
    hi = torch.where(spill, w[:, :, nxt] << (32 - shift), 0)
    return ((lo | hi) & ((1 << bits) - 1)).reshape(n, k).to(torch.uint8)


def affine_values(codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, group_size: int) -> torch.Tensor:
    """``scales * q + biases`` per group, in the scales' dtype with each operation rounded to it (MLX's order)."""
    n, k = codes.shape
    q = codes.to(scales.dtype).view(n, k // group_size, group_size)
    return (q * scales[:, :, None] + biases[:, :, None]).view(n, k)


# ------------------------------------------------------------------------------------------------ checkpoint
def word_count(bits: int, in_features: int) -> int:
    return in_features * bits // 32


def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]]:
    """Tensor name -> (shape, allowed dtypes) of one MLX module (bias aside)."""
    n, k, gs = scheme.out_features, scheme.in_features, scheme.group_size
    check_params(scheme.bits, gs, k)
    g = k // gs
    return {"weight": ((n, word_count(scheme.bits, k)), (torch.uint32,)),
            "scales": ((n, g), SCALE_DTYPES), "biases": ((n, g), SCALE_DTYPES)}


def describe(scheme: Scheme) -> str:
    return f"mlx {scheme.bits}-bit group_size {scheme.group_size} [{scheme.out_features}, {scheme.in_features}]"


def to_checkpoint(w: MlxWeight) -> dict[str, torch.Tensor]:
    """The module tensors ``weight``, ``scales``, ``biases`` exactly as mlx writes them."""
    return {"weight": pack(w.codes, w.bits), "scales": w.scales, "biases": w.biases}


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> MlxWeight:
    """The ``MlxWeight`` of one module's tensors (validated, named in every error)."""
    check_against(tensors, checkpoint_shapes(scheme), describe(scheme))
    codes = unpack(tensors["weight"], scheme.bits, scheme.in_features)
    return MlxWeight(codes, tensors["scales"], tensors["biases"], scheme.bits, scheme.group_size)


def scheme_for(bits: int, group_size: int, in_features: int, out_features: int) -> Scheme:
    """The layer scheme of an MLX module (asymmetric, no act-order; words as int32 in the scheme, uint32 on disk)."""
    check_params(bits, group_size, in_features)
    return Scheme(bits=bits, group_size=group_size, in_features=in_features, out_features=out_features, sym=False,
                  method=METHOD.MLX, format=FORMAT.MLX)
