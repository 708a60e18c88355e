"""Small floating-point element formats (FP8 E4M3/E5M2, FP4 E2M1) and power-of-two E8M0 scales, as codes.

A code is the raw bit pattern in a ``uint8`` (an FP4 code in the low nibble). Decoding is a table lookup
built from the format definition, so it is exact on every device and independent of torch's own float8
casts (which some CPUs run slowly and older GPUs not at all). Encoding rounds to nearest, ties to even,
and saturates at the format's largest finite value, as the quantizers that produce these weights do.

* E4M3 (``float8_e4m3fn``): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; ``S.1111.111``
  is NaN; largest finite 448; smallest subnormal ``2**-9``.
* E5M2 (``float8_e5m2``): 1-5-2, bias 15, IEEE-like (infinities and NaNs at exponent 31); largest 57344.
* E2M1 (FP4): 1-2-1, bias 1: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; no NaN or infinity.
* E8M0 (MX block scales): an unsigned biased exponent, ``2 ** (e - 127)``; ``255`` is NaN.
"""

from __future__ import annotations

import functools
from enum import Enum

import torch


class Element(str, Enum):
    """A small float element format (the value each code of a float-quantized weight stands for)."""

    E4M3 = "float8_e4m3fn"
    E5M2 = "float8_e5m2"
    E2M1 = "float4_e2m1"

    @classmethod
    def _missing_(cls, value: object) -> Element | None:
        aliases = {"e4m3": cls.E4M3, "e4m3fn": cls.E4M3, "fp8": cls.E4M3, "float8_e4m3": cls.E4M3,
                   "e5m2": cls.E5M2, "e2m1": cls.E2M1, "fp4": cls.E2M1, "float4_e2m1fn_x2": cls.E2M1}
        if isinstance(value, str) and value.strip().lower() in aliases:
            return aliases[value.strip().lower()]
        if isinstance(value, torch.dtype):
            return {torch.float8_e4m3fn: cls.E4M3, torch.float8_e5m2: cls.E5M2}.get(value)
        raise ValueError(f"unknown float element format {value!r}; expected one of: "
                         f"{', '.join(m.value for m in cls)} (or e4m3, e5m2, e2m1)")

    @property
    def bits(self) -> int:
        return 4 if self is Element.E2M1 else 8

    @property
    def max(self) -> float:
        """Largest finite magnitude."""
        return {Element.E4M3: 448.0, Element.E5M2: 57344.0, Element.E2M1: 6.0}[self]

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype whose bytes are these codes (None for FP4, which torch holds only as pairs)."""
        return {Element.E4M3: torch.float8_e4m3fn, Element.E5M2: torch.float8_e5m2}.get(self)

    def __str__(self) -> str:
        return self.value


def _value(code: int, exp_bits: int, man_bits: int, bias: int) -> float:
    """The value of one code from the bit layout (NaN/inf handled by the callers' tables)."""
    sign = -1.0 if code >> (exp_bits + man_bits) & 1 else 1.0
    e = code >> man_bits & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - man_bits)
    return sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias)


@functools.cache
def _table(element: Element) -> tuple[float, ...]:
    if element is Element.E4M3:
        return tuple(float("nan") if c & 0x7F == 0x7F else _value(c, 4, 3, 7) for c in range(256))
    if element is Element.E5M2:
        def one(c: int) -> float:
            if c >> 2 & 0x1F == 0x1F:
                return float("nan") if c & 3 else (float("-inf") if c & 0x80 else float("inf"))
            return _value(c, 5, 2, 15)
        return tuple(one(c) for c in range(256))
    return tuple(_value(c, 2, 1, 1) for c in range(16))


def value_table(element: Element | str, dtype: torch.dtype = torch.float32,
                device: torch.device | str | None = None) -> torch.Tensor:
    """Every code's value (256 entries for FP8, 16 for FP4) as a tensor, for decoding by lookup."""
    return torch.tensor(_table(Element(element)), dtype=dtype, device=device)


def decode(codes: torch.Tensor, element: Element | str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of ``codes`` (uint8 bit patterns) in ``dtype`` (exact for float32, float16 and bfloat16)."""
    element = Element(element)
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes: expected torch.uint8 bit patterns, got {codes.dtype}")
    if element is Element.E2M1 and codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes: FP4 codes are 4-bit (0..15), found {int(codes.max())}")
    return value_table(element, dtype, codes.device)[codes.long()]


def encode(values: torch.Tensor, element: Element | str) -> torch.Tensor:
    """The nearest code of every value (ties to even mantissa, saturating at the largest finite value).

    NaN is refused: a quantizer never produces one, and no format here keeps it meaningfully.
    """
    element = Element(element)
    v = values.detach().to(torch.float64)
    if v.numel() and bool(torch.isnan(v).any()):
        raise ValueError("values: NaN has no code to round to")
    table = torch.tensor(_table(element), dtype=torch.float64, device=v.device)
    half = 1 << (element.bits - 1)
    mags = table[:half]  # non-negative codes 0..half-1, ascending (NaN at the top of E4M3, inf in E5M2)
    finite = torch.isfinite(mags)
    mags, idx = mags[finite], torch.arange(half, device=v.device)[finite]
    a = v.abs().clamp(max=float(mags[-1]))
    hi = torch.searchsorted(mags, a.contiguous()).clamp(max=len(mags) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - mags[lo], mags[hi] - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (idx[hi] % 2 == 0) & (hi != lo))
    code = torch.where(take_hi, idx[hi], idx[lo])
    return (code | torch.where(torch.signbit(v), half, 0)).to(torch.uint8)  # -0.0 keeps its sign, as IEEE casts do


def e8m0_decode(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``2 ** (e - 127)`` for uint8 E8M0 exponents; raises on 255 (NaN)."""
    if codes.dtype != torch.uint8:
        raise ValueError(f"scales: expected torch.uint8 E8M0 exponents, got {codes.dtype}")
    if codes.numel() and bool((codes == 255).any()):
        at = (codes == 255).nonzero()[0].tolist()
        raise ValueError(f"scales: E8M0 exponent 255 (NaN) at {at}")
    return torch.exp2(codes.to(torch.float64) - 127).to(dtype)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """FP4 codes ``[N, K]`` (K even) -> ``[N, K/2]`` bytes, column ``2j`` in the low nibble."""
    if codes.dim() != 2 or codes.shape[1] % 2:
        raise ValueError(f"codes: expected [N, K] with K even, got shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return (c[:, 0::2] & 0xF) | ((c[:, 1::2] & 0xF) << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """``[N, K/2]`` bytes -> FP4 codes ``[N, K]`` (inverse of ``pack_nibbles``)."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(f"weight_packed: expected a 2-D torch.uint8 tensor, got {packed.dtype} "
                         f"shape {tuple(packed.shape)}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], -1)
