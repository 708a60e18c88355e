"""Round-to-nearest float quantizers: a float weight -> ``FloatWeight`` in FP8, NVFP4 or MXFP4.

They follow the producers' own recipes, so a layer made here is the layer those tools would write:

* FP8 (compressed-tensors, transformers): per block ``scale = amax / 448`` (E5M2: ``/ 57344``), codes
  ``fp8(w / scale)``; GPTQModel's "inverse" rule stores ``scale_inv = 448 / amax`` and codes
  ``fp8(w * scale_inv)``. An all-zero block gets scale 1.
* NVFP4 (compressed-tensors): ``global = 448 * 6 / amax(W)``; per 16 values ``scale = e4m3(global * amax / 6)``
  and codes ``e2m1(w / (scale / global))``.
* MXFP4 (OCP MX): per 32 values the E8M0 exponent ``floor(log2(amax)) - 2`` (E2M1's largest exponent), codes
  ``e2m1(w / 2**exponent)``.
"""

from __future__ import annotations

import torch

from .blockfloat import FloatWeight, ScaleRule, scale_grid
from .floats import Element, decode, encode


def _blocks(w: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``w [N, K]`` zero-padded and viewed as ``[Rb, bn, Cb, bk]``."""
    n, k = w.shape
    rb, cb = scale_grid(n, k, block)
    padded = torch.nn.functional.pad(w, (0, cb * block[1] - k, 0, rb * block[0] - n))
    return padded.reshape(rb, block[0], cb, block[1])


def _check(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"weight: expected a 2-D float [out_features, in_features] tensor, got "
                         f"{weight.dtype} shape {tuple(weight.shape)}")
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("weight: contains NaN or infinity; cannot choose scales")
    return weight.detach().to(torch.float32).cpu()


def _expand(s: torch.Tensor, block: tuple[int, int], n: int, k: int) -> torch.Tensor:
    return s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:n, :k]


def quantize_fp8(weight: torch.Tensor, block: tuple[int, int] | None = None, element: Element | str = Element.E4M3,
                 scale_dtype: torch.dtype = torch.float32, rule: ScaleRule | str = ScaleRule.MULTIPLY) -> FloatWeight:
    """FP8 with one scale per ``block`` (default ``(1, K)``: per output channel)."""
    w = _check(weight)
    n, k = w.shape
    element, rule = Element(element), ScaleRule(rule)
    if element is Element.E2M1:
        raise ValueError("element: quantize_fp8 makes FP8 (float8_e4m3fn or float8_e5m2); use quantize_nvfp4")
    block = block or (1, k)
    amax = _blocks(w, block).abs().amax(dim=(1, 3))
    if rule is ScaleRule.DIVIDE:
        scales = torch.where(amax > 0, element.max / amax.clamp(min=torch.finfo(torch.float32).tiny), 1.0)
        scales = scales.to(scale_dtype)
        scaled = w * _expand(scales.float(), block, n, k)
    else:
        scales = torch.where(amax > 0, amax / element.max, 1.0).to(scale_dtype)
        scaled = w / _expand(scales.float(), block, n, k)
    codes = encode(scaled.clamp(-element.max, element.max), element)
    return FloatWeight(codes=codes, element=element, scales=scales, block=block, rule=rule)


def quantize_nvfp4(weight: torch.Tensor) -> FloatWeight:
    """NVFP4: E2M1 codes in blocks of 16 with E4M3 scales under a float32 global scale."""
    w = _check(weight)
    n, k = w.shape
    if k % 16:
        raise ValueError(f"weight: NVFP4 needs in_features divisible by 16, got {k}")
    amax = w.abs().amax()
    glob = (448.0 * 6.0 / amax).reshape(1) if amax > 0 else torch.ones(1)
    local = glob * w.reshape(n, k // 16, 16).abs().amax(dim=2) / 6.0
    s8 = encode(local.clamp(max=448.0), Element.E4M3)
    s8 = torch.where(s8 == 0, torch.tensor(1, dtype=torch.uint8), s8)  # never a zero scale: 2**-9 instead
    eff = decode(s8, Element.E4M3) / glob
    codes = encode((w / eff.repeat_interleave(16, 1)).clamp(-6.0, 6.0), Element.E2M1)
    return FloatWeight(codes=codes, element=Element.E2M1, scales=s8.view(torch.float8_e4m3fn), block=(1, 16),
                       global_scale=glob.to(torch.float32))


def quantize_mxfp4(weight: torch.Tensor) -> FloatWeight:
    """MXFP4: E2M1 codes in blocks of 32 with power-of-two E8M0 scales."""
    w = _check(weight)
    n, k = w.shape
    if k % 32:
        raise ValueError(f"weight: MXFP4 needs in_features divisible by 32, got {k}")
    amax = w.reshape(n, k // 32, 32).abs().amax(dim=2)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-38))) - 2, torch.zeros_like(amax))
    e8 = (exp + 127).clamp(0, 254).to(torch.uint8)
    scale = torch.exp2(e8.to(torch.float32) - 127)
    codes = encode((w / scale.repeat_interleave(32, 1)).clamp(-6.0, 6.0), Element.E2M1)
    return FloatWeight(codes=codes, element=Element.E2M1, scales=e8, block=(1, 32))
