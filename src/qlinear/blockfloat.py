"""The canonical form of float-quantized weights (FP8, NVFP4, MXFP4): the float sibling of ``AffineWeight``.

``w[n, k] = value(codes[n, k]) * scale[n // bn, k // bk]`` where ``value`` is the element format's
decoding (``floats``) and ``scale`` is one block's scale, kept exactly as the checkpoint stores it:

* ``scales`` in their stored dtype (float32/bfloat16/float16 for FP8; float8 E4M3 for NVFP4; uint8 E8M0
  exponents for MX formats), shape ``[ceil(N/bn), ceil(K/bk)]``;
* an optional per-tensor ``global_scale`` that divides every block scale (compressed-tensors' NVFP4:
  ``scale = weight_scale / weight_global_scale``);
* ``rule``: whether the stored scale multiplies (everyone but GPTQModel) or divides (GPTQModel's FP8
  ``weight_scale_inv``, "inverse" semantics) the element value.

Keeping the stored scale and its rule (rather than a converted float32 multiplier) is what makes every
conversion lossless and ``dequantize`` bit-exact with the producer's own decoding, which computes in
float32 in this order: ``value * (scale / global)``, or ``value / scale``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import torch

from .floats import Element, decode, e8m0_decode
from .spec import ConfigError

#: Dtypes a block scale may be stored in (uint8 means E8M0 exponents).
SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.uint8)


class ScaleRule(str, Enum):
    """How a stored block scale combines with the element value."""

    MULTIPLY = "multiply"
    DIVIDE = "divide"


def scale_grid(out_features: int, in_features: int, block: tuple[int, int]) -> tuple[int, int]:
    """Scale tensor shape for a weight ``[N, K]`` cut into ``block = (rows, cols)`` tiles (edges padded)."""
    bn, bk = block
    return -(-out_features // bn), -(-in_features // bk)


def block_scale_values(scales: torch.Tensor, global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Stored block scales as float32 values: E8M0 exponents decoded, E4M3 widened, then ``/ global``."""
    s = e8m0_decode(scales) if scales.dtype == torch.uint8 else scales.to(torch.float32)
    if global_scale is not None:
        s = s / global_scale.to(torch.float32).reshape(())
    return s


@dataclass(frozen=True, eq=False)
class FloatWeight:
    """Float element codes ``[N, K]`` with block scales as stored (see the module docstring)."""

    codes: torch.Tensor
    element: Element
    scales: torch.Tensor
    block: tuple[int, int]
    global_scale: torch.Tensor | None = None
    rule: ScaleRule = ScaleRule.MULTIPLY

    def __post_init__(self) -> None:
        object.__setattr__(self, "element", Element(self.element))
        object.__setattr__(self, "rule", ScaleRule(self.rule))
        object.__setattr__(self, "block", tuple(int(b) for b in self.block))
        check_float_weight(self)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    def scale_values(self) -> torch.Tensor:
        """The per-block factor as float32 (for ``DIVIDE`` the divisor)."""
        return block_scale_values(self.scales, self.global_scale)

    def expanded_scales(self) -> torch.Tensor:
        """The block factor of every weight element, ``[N, K]`` float32 (for reference code and tests)."""
        bn, bk = self.block
        s = self.scale_values().repeat_interleave(bn, 0).repeat_interleave(bk, 1)
        return s[:self.out_features, :self.in_features]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[N, K]``, computed in float32 in the producers' order, then cast."""
        v = decode(self.codes, self.element)
        s = self.expanded_scales()
        w = v / s if self.rule is ScaleRule.DIVIDE else v * s
        return w.to(dtype)


def check_float_weight(w: FloatWeight) -> None:
    """Raise ``ValueError`` naming the tensor, what was expected and what was found."""
    codes, scales = w.codes, w.scales
    if codes.dim() != 2:
        raise ValueError(f"codes: expected a 2-D [out_features, in_features] tensor, got shape {tuple(codes.shape)}")
    if codes.dtype != torch.uint8:
        raise ValueError(f"codes: expected torch.uint8 bit patterns, got {codes.dtype}")
    if w.element is Element.E2M1 and codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes: FP4 codes are 4-bit (0..15), found {int(codes.max())}")
    if len(w.block) != 2 or min(w.block) <= 0:
        raise ConfigError(f"block: expected (rows, cols) positive, got {w.block}")
    n, k = codes.shape
    want = scale_grid(n, k, w.block)
    if scales.dtype not in SCALE_DTYPES:
        raise ValueError(f"scales: expected one of {', '.join(map(str, SCALE_DTYPES))}, got {scales.dtype}")
    if tuple(scales.shape) != want:
        raise ValueError(f"scales: expected shape {list(want)} for a [{n}, {k}] weight in blocks of {w.block}, "
                         f"got {list(scales.shape)}")
    if w.global_scale is not None and w.global_scale.numel() != 1:
        raise ValueError(f"global_scale: expected one value, got shape {tuple(w.global_scale.shape)}")
    if w.global_scale is not None:
        g = float(w.global_scale.float().reshape(()))
        if not math.isfinite(g) or g == 0:
            raise ValueError(f"global_scale: the per-tensor divisor must be finite and non-zero; found {g}")
    values = block_scale_values(scales, w.global_scale)
    bad = ~torch.isfinite(values) | (values == 0) if w.rule is ScaleRule.DIVIDE else ~torch.isfinite(values)
    if bad.any():
        r, c = bad.nonzero()[0].tolist()
        what = "finite and non-zero (the rule divides by it)" if w.rule is ScaleRule.DIVIDE else "finite"
        raise ValueError(f"scales: every block scale must be {what}; found {values[r, c].item()} at block "
                         f"[{r}, {c}] (rows {r * w.block[0]}.., cols {c * w.block[1]}..)")
    if w.element is not Element.E2M1:
        special = (codes & 0x7F) == 0x7F if w.element is Element.E4M3 else (codes >> 2 & 0x1F) == 0x1F
        if special.any():
            r, c = special.nonzero()[0].tolist()
            raise ValueError(f"codes: {w.element.value} code 0x{int(codes[r, c]):02x} at [out={r}, in={c}] is not a "
                             "finite value (NaN or infinity)")
