"""MLX modules for weights leaving qlinear: what an MLX holder's ``to_mlx()`` returns.

Imported only by ``to_mlx()`` (this module imports ``mlx``). An integer-affine weight MLX holds exactly becomes
mlx's own ``nn.QuantizedLinear`` (the module mlx-lm builds and saves). Groups of 16, which MLX lacks, become
``Group16Linear``: the codes once, with group-32 scales and biases for the even half-groups and for the odd ones;
each product sees only its half-groups' inputs (the others zeroed), so each half's weights are exact and the
other half's contribute exactly zero.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import torch

from .affine import AffineWeight
from .bnb_weight import INV127
from .layouts import mlx as layout
from .layouts.mlx import MlxWeight
from .mlx_convert import MlxConversionError, from_affine


def to_mx(t: torch.Tensor) -> mx.array:
    """A copy of ``t`` as an ``mx.array`` of the same dtype (bfloat16 through float32, exactly)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return mx.array(t.float().numpy()).astype(mx.bfloat16)
    return mx.array(t.numpy())


def quantized_linear(w: MlxWeight, bias: torch.Tensor | None) -> nn.QuantizedLinear:
    """mlx's ``QuantizedLinear`` holding ``w`` (and ``bias``) as stored. Its constructor's random weight is lazy
    and replaced before anything evaluates it."""
    layer = nn.QuantizedLinear(w.in_features, w.out_features, bias=bias is not None, group_size=w.group_size,
                               bits=w.bits)
    layer.weight = to_mx(layout.pack(w.codes, w.bits))
    layer.scales = to_mx(w.scales)
    layer.biases = to_mx(w.biases)
    if bias is not None:
        layer.bias = to_mx(bias)
    return layer


class Group16Linear(nn.Module):
    """Groups of 16 as two group-32 quantized products over masked inputs (see the module docstring)."""

    def __init__(self, even: MlxWeight, odd: MlxWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.bits = even.bits
        self.weight = to_mx(layout.pack(even.codes, even.bits))
        self.scales_even, self.biases_even = to_mx(even.scales), to_mx(even.biases)
        self.scales_odd, self.biases_odd = to_mx(odd.scales), to_mx(odd.biases)
        if bias is not None:
            self.bias = to_mx(bias)
        self.even_inputs = mx.array((np.arange(even.in_features) // 16) % 2 == 0)
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        even = self.even_inputs.astype(x.dtype)
        y = mx.quantized_matmul(x * even, self.weight, self.scales_even, self.biases_even, transpose=True,
                                group_size=32, bits=self.bits)
        y = y + mx.quantized_matmul(x * (1 - even), self.weight, self.scales_odd, self.biases_odd, transpose=True,
                                    group_size=32, bits=self.bits)
        return y + self.bias if "bias" in self else y


def group16_linear(q: AffineWeight, bias: torch.Tensor | None) -> Group16Linear:
    """``Group16Linear`` for a weight in groups of 16 (refused, as ``from_affine`` refuses, when MLX cannot hold
    either half exactly)."""
    if q.desc_act:
        raise MlxConversionError("g_idx: the weight is act-order (desc_act); MLX groups are contiguous input channels")
    if q.in_features % 32:
        raise MlxConversionError(f"in_features: groups of 16 run as two group-32 products, which need in_features "
                                 f"a multiple of 32; got {q.in_features}")
    g_idx = torch.arange(q.in_features, dtype=torch.int32) // 32
    halves = [AffineWeight(q.codes, q.scales[:, h::2], q.zeros[:, h::2], g_idx, q.bits, 32, q.sym) for h in (0, 1)]
    return Group16Linear(from_affine(halves[0]), from_affine(halves[1]), bias)


#: activation dtypes a rotated module carries its cos/sin for (formed per dtype, as the reference forms them)
ROTATION_DTYPES = {torch.float16: mx.float16, torch.bfloat16: mx.bfloat16, torch.float32: mx.float32}


class RotatedLinear(nn.Module):
    """ParoQuant: the input transform (channel scales, then ``krot`` rounds of pair rotations through gather maps,
    each operation in the input's dtype, as ``layouts/paroquant.rotate``), then the quantized product."""

    def __init__(self, maps: list[torch.Tensor], cos_sin: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]],
                 channel_scales: torch.Tensor, linear: nn.Module) -> None:
        super().__init__()
        self.maps = [to_mx(m.to(torch.int32)) for m in maps]
        self.cos = {str(ROTATION_DTYPES[d]): to_mx(c) for d, (c, _) in cos_sin.items()}
        self.sin = {str(ROTATION_DTYPES[d]): to_mx(s) for d, (_, s) in cos_sin.items()}
        self.channel_scales = to_mx(channel_scales.reshape(-1))
        self.linear = linear
        self.freeze()

    def rotate(self, x: mx.array) -> mx.array:
        if not self.maps:
            return x
        k = x.shape[-1]
        half = k // 2
        cos, sin = self.cos[str(x.dtype)], self.sin[str(x.dtype)]
        out = x.reshape(-1, k) * self.channel_scales.astype(x.dtype)
        for r, m in enumerate(self.maps[:-1]):
            z = mx.take(out, m, axis=1)
            xi, xj = z[:, :half], z[:, half:]
            out = mx.concatenate([xi * cos[r] + xj * sin[r], -xi * sin[r] + xj * cos[r]], axis=1)
        return mx.take(out, self.maps[-1], axis=1).reshape(x.shape)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear(self.rotate(x))


class Int8ActLinear(nn.Module):
    """QQQ (W4A8) as ``QQQTorchLinear`` computes it: each input row quantized to int8 (``s1 = max|x| / 127`` in x's
    dtype, ``clip(round(x / s1))`` half to even), the int8 weight as an 8-bit MLX weight (code ``w + 128``, scale 1,
    bias -128: exact), the integer sums exact (K chunks of ``CHUNK``, each below 2^24 in float32, added in int32),
    then ``(acc * s1 * s_channel)`` rounded to x's dtype, plus the bias in that dtype."""

    CHUNK = 512

    def __init__(self, w8: torch.Tensor, channel_scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        n, k = w8.shape
        self.weight = to_mx(layout.pack((w8.to(torch.int16) + 128).to(torch.uint8), 8))
        self.scales = to_mx(torch.ones(n, k // 32))
        self.biases = to_mx(torch.full((n, k // 32), -128.0))
        self.channel_scales = to_mx(channel_scales.float())
        if bias is not None:
            self.bias = to_mx(bias)
        self.freeze()

    def __call__(self, x: mx.array) -> mx.array:
        k = x.shape[-1]
        x2 = x.reshape(-1, k)
        s1 = (mx.abs(x2).max(axis=-1, keepdims=True) / 127.0).astype(mx.float32)
        xq = mx.clip(mx.round(x2 / mx.where(s1 == 0, 1.0, s1)), -128, 127)
        total = None
        for c in range(0, k, self.CHUNK):
            e = min(k, c + self.CHUNK)
            part = mx.quantized_matmul(xq[:, c:e], self.weight[:, c // 4:e // 4], self.scales[:, c // 32:e // 32],
                                       self.biases[:, c // 32:e // 32], transpose=True, group_size=32, bits=8)
            total = part.astype(mx.int32) if total is None else total + part.astype(mx.int32)
        y = (total.astype(mx.float32) * s1 * self.channel_scales).astype(x.dtype)
        if "bias" in self:
            y = y + self.bias.astype(x.dtype)
        return y.reshape(*x.shape[:-1], -1)


def _nibbles(codes: torch.Tensor) -> mx.array:
    """4-bit codes ``[N, K]`` as bytes over the flattened weight, low nibble first (``_unpack`` undoes it)."""
    c = codes.to(torch.uint8).reshape(-1)
    c = torch.cat([c, c.new_zeros(c.numel() % 2)])
    return to_mx(c[0::2] | (c[1::2] << 4))


def _unpack(packed: mx.array, shape: tuple[int, int]) -> mx.array:
    n, k = shape
    return mx.stack([packed & 15, packed >> 4], axis=-1).reshape(-1)[:n * k].reshape(n, k)


class TableLinear(nn.Module):
    """Codes looked up in a value table and scaled in float32, the weight rounded once to the input's dtype and
    multiplied in: bitsandbytes NF4/FP4 (blocks of ``blocksize`` over the flattened weight, ``value * absmax``)
    and the float formats (FP8 / FP4 codes, ``[bn, bk]`` blocks, ``value * factor`` or ``value / factor``). MLX has
    no mode for these tables, so the weight is decoded inside each call (a transient array, as qlinear's Torch
    kernels decode tiles) rather than kept."""

    def __init__(self, codes: torch.Tensor, table: torch.Tensor, factors: torch.Tensor, block: tuple[int, int] | int,
                 divide: bool, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.bits = 4 if table.numel() == 16 else 8  # a 16-value table: two codes a byte
        self.weight = _nibbles(codes) if self.bits == 4 else to_mx(codes.to(torch.uint8))
        self.table = to_mx(table.float())
        self.factors = to_mx(factors.float())
        self.block, self.divide, self.shape = block, divide, tuple(codes.shape)
        if bias is not None:
            self.bias = to_mx(bias)
        self.freeze()

    def weight_values(self) -> mx.array:
        """The float32 weight ``[N, K]``, as the producer dequantizes it."""
        n, k = self.shape
        codes = _unpack(self.weight, self.shape) if self.bits == 4 else self.weight
        v = mx.take(self.table, codes.astype(mx.int32))
        if isinstance(self.block, int):  # flat blocks (bitsandbytes), the last one possibly partial
            bs = self.block
            flat = mx.pad(v.reshape(-1), (0, -(-n * k // bs) * bs - n * k))
            return (flat.reshape(-1, bs) * self.factors[:, None]).reshape(-1)[:n * k].reshape(n, k)
        bn, bk = self.block
        f = mx.repeat(mx.repeat(self.factors, bn, axis=0), bk, axis=1)[:n, :k]
        return v / f if self.divide else v * f

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight_values().astype(x.dtype).T
        return y + self.bias.astype(x.dtype) if "bias" in self else y


class Int8RowLinear(nn.Module):
    """bitsandbytes LLM.int8 weights: ``(q * SCB) * float32(1/127)`` in float32 per call (bitsandbytes' order of
    the two rounded products), cast to the input's dtype and multiplied in."""

    def __init__(self, codes: torch.Tensor, scb: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = to_mx(codes.to(torch.int8))
        self.scb = to_mx(scb.float())
        self.inv127 = mx.array(INV127, dtype=mx.float32)
        if bias is not None:
            self.bias = to_mx(bias)
        self.freeze()

    def weight_values(self) -> mx.array:
        return self.weight.astype(mx.float32) * self.scb[:, None] * self.inv127

    def __call__(self, x: mx.array) -> mx.array:
        y = x @ self.weight_values().astype(x.dtype).T
        return y + self.bias.astype(x.dtype) if "bias" in self else y
