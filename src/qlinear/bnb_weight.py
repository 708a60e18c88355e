"""The canonical forms of bitsandbytes weights: 4-bit look-up-table codes (NF4, FP4) and LLM.int8 rows.

4-bit (``BnbWeight``): the weight ``[N, K]`` is flattened row-major and cut into blocks of ``blocksize``
consecutive values (a block may straddle rows); each code indexes a 16-entry float32 table and is scaled by
its block's ``absmax``::

    w.flat[i] = table[codes.flat[i]] * absmax[i // blocksize]      (a float32 product, rounded once to a dtype)

``dtype`` is the weight's dtype before quantization: ``dequantize_4bit`` rounds into it, while bitsandbytes'
``matmul_4bit`` rounds the same products into the activation dtype. With double
quantization ``absmax`` is stored as uint8 codes into a 256-entry float32 map, scaled per ``nested.blocksize``
absmax values, plus one float32 offset; its float32 value is, in this order,
``(nested.quant_map[absmax[j]] * nested.absmax[j // nested.blocksize]) + offset``.

8-bit (``BnbInt8Weight``): int8 codes ``[N, K]`` and one float32 ``SCB`` (the row's absolute maximum) per
row; ``w[n, k] = (codes[n, k] * SCB[n]) * float32(1/127)``, two float32 products in that order.

Everything is kept as stored (absmax codes, maps, offset), so writing a checkpoint back is lossless and
``dequantize`` reproduces bitsandbytes' own ``dequantize_4bit`` / ``int8_vectorwise_dequant`` bit for bit.
The stored ``quant_map`` must equal bitsandbytes' table for ``quant_type``: its kernels decode with that
built-in table and never read the stored copy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

#: bitsandbytes' NF4 table (QLoRA's NormalFloat: normal quantiles scaled to [-1, 1]), as float32 values.
NF4_VALUES = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
              -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
              0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
              0.7229568362236023, 1.0)
#: bitsandbytes' FP4 magnitudes in code order (bit 3 is the sign), before the division by their maximum, 12.
FP4_MAGNITUDES = (0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0)
QUANT_TYPES = ("nf4", "fp4")
#: Block sizes bitsandbytes' 4-bit quantize and dequantize accept.
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
#: The dtypes bitsandbytes dequantizes 4-bit weights into (the weight's dtype before quantization).
WEIGHT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: float32(1 / 127): LLM.int8 multiplies by it rather than dividing by 127.
INV127 = 7.874015718698502e-3


@functools.cache
def _table(quant_type: str) -> torch.Tensor:
    if quant_type == "nf4":
        return torch.tensor(NF4_VALUES, dtype=torch.float32)
    mags = torch.tensor(FP4_MAGNITUDES, dtype=torch.float32)
    return torch.cat((mags, -mags)) / 12.0  # float32 division, as the table is built there (-0 reads as +0 below)


def code_table(quant_type: str, device: torch.device | str | None = None) -> torch.Tensor:
    """The 16 float32 values of ``quant_type``'s codes (a fresh tensor)."""
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type: expected one of {', '.join(QUANT_TYPES)}, got {quant_type!r}")
    t = _table(quant_type).clone()
    t[t == 0] = 0.0  # FP4's code 8 is -0 in sign-magnitude; bitsandbytes' table holds +0
    return t if device is None else t.to(device)


@dataclass(frozen=True, eq=False)
class NestedAbsmax:
    """Double quantization of ``absmax``: 8-bit codes into ``quant_map`` scaled per block, plus ``offset``."""

    quant_map: torch.Tensor  # float32 [256]
    absmax: torch.Tensor  # float32 [ceil(num_blocks / blocksize)]
    blocksize: int
    offset: float  # a float32 value, kept as the Python float bitsandbytes wrote


@dataclass(frozen=True, eq=False)
class BnbWeight:
    """4-bit NF4 / FP4 codes ``[N, K]`` (uint8, 0..15) with block absmax as stored (see the module docstring)."""

    codes: torch.Tensor
    quant_type: str
    blocksize: int
    absmax: torch.Tensor  # float32 [num_blocks]; uint8 [num_blocks] when ``nested``
    quant_map: torch.Tensor  # float32 [16], as stored
    dtype: torch.dtype = torch.bfloat16
    nested: NestedAbsmax | None = None

    def __post_init__(self) -> None:
        check_bnb_weight(self)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    @property
    def num_blocks(self) -> int:
        return -(-self.codes.numel() // self.blocksize)

    def absmax_values(self) -> torch.Tensor:
        """Every block's absmax as float32 ``[num_blocks]``, computed as bitsandbytes does."""
        return absmax_values(self.absmax, self.nested)

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight ``[N, K]``: float32 products rounded once to ``dtype`` (default the stored ``dtype``, which is
        bitsandbytes' ``dequantize_4bit``; its ``matmul_4bit`` dequantizes into the activation dtype the same way)."""
        values = code_table(self.quant_type, self.codes.device)[self.codes.reshape(-1).long()]
        w = scale_blocks(values, self.absmax_values().to(values.device), self.blocksize, 0)
        return w.reshape(self.codes.shape).to(self.dtype if dtype is None else dtype)


@dataclass(frozen=True, eq=False)
class BnbInt8Weight:
    """LLM.int8 weight: int8 codes ``[N, K]`` and the float32 row scale ``SCB [N]`` (see the module docstring)."""

    codes: torch.Tensor
    scb: torch.Tensor

    def __post_init__(self) -> None:
        check_int8_weight(self)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def in_features(self) -> int:
        return self.codes.shape[1]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float32 weight ``[N, K]`` as bitsandbytes' ``int8_vectorwise_dequant`` computes it, then cast."""
        return int8_rows(self.codes, self.scb).to(dtype)


def int8_rows(codes: torch.Tensor, scb: torch.Tensor) -> torch.Tensor:
    """``(codes * SCB[:, None]) * float32(1/127)`` in float32 (two rounded products, in bitsandbytes' order)."""
    return codes.to(torch.float32) * scb.to(torch.float32)[:, None] * INV127


def absmax_values(absmax: torch.Tensor, nested: NestedAbsmax | None) -> torch.Tensor:
    """Block absmax as float32: the stored one, or the nested decoding ``map[q] * nested_absmax + offset``."""
    if nested is None:
        return absmax.to(torch.float32)
    values = nested.quant_map.to(absmax.device)[absmax.long()]
    scaled = scale_blocks(values, nested.absmax.to(absmax.device), nested.blocksize, 0)
    return scaled + torch.tensor(nested.offset, dtype=torch.float32, device=absmax.device)


def scale_blocks(values: torch.Tensor, scales: torch.Tensor, blocksize: int, start: int) -> torch.Tensor:
    """``values[i] * scales[(start + i) // blocksize]`` for a float32 run of flat positions ``start ..``.

    ``scales`` holds the blocks from ``start // blocksize`` on. Done block-wise on a padded view, so no index
    tensor the size of ``values`` is built."""
    lead = start % blocksize
    total = lead + values.numel()
    nblocks = -(-total // blocksize)
    padded = torch.zeros(nblocks * blocksize, dtype=values.dtype, device=values.device)
    padded[lead:total] = values
    out = padded.view(nblocks, blocksize) * scales[:nblocks, None]
    return out.reshape(-1)[lead:total]


def _fail_if_not_finite(t: torch.Tensor, name: str, what: str) -> None:
    bad = ~torch.isfinite(t)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name}: every {what} must be finite; found {t[i].item()} at index {i}")


def check_bnb_weight(w: BnbWeight) -> None:
    """Raise ``ValueError`` naming the field, what was expected and what was found."""
    codes = w.codes
    if codes.dim() != 2 or codes.dtype != torch.uint8:
        raise ValueError(f"codes: expected a 2-D uint8 [out_features, in_features] tensor, got "
                         f"{codes.dtype} shape {list(codes.shape)}")
    if codes.numel() and int(codes.max()) > 15:
        raise ValueError(f"codes: 4-bit codes are 0..15, found {int(codes.max())}")
    if w.quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type: expected one of {', '.join(QUANT_TYPES)}, got {w.quant_type!r}")
    if w.blocksize not in BLOCKSIZES:
        raise ValueError(f"blocksize: bitsandbytes quantizes 4-bit weights in blocks of "
                         f"{', '.join(map(str, BLOCKSIZES))} values; got {w.blocksize!r}")
    if w.dtype not in WEIGHT_DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(map(str, WEIGHT_DTYPES))}, got {w.dtype}")
    qm = w.quant_map
    if qm.dtype != torch.float32 or tuple(qm.shape) != (16,):
        raise ValueError(f"quant_map: expected float32 [16], got {qm.dtype} shape {list(qm.shape)}")
    table = code_table(w.quant_type, qm.device)
    if not torch.equal(qm, table):
        i = int((qm != table).nonzero()[0, 0])
        raise ValueError(f"quant_map: differs from bitsandbytes' {w.quant_type} table at code {i} (stored "
                         f"{qm[i].item()!r}, table {table[i].item()!r}); bitsandbytes decodes with its built-in table")
    nb = w.num_blocks
    want = torch.uint8 if w.nested is not None else torch.float32
    if w.absmax.dtype != want or tuple(w.absmax.shape) != (nb,):
        what = "uint8 codes (double quantization)" if w.nested is not None else "float32 values"
        raise ValueError(f"absmax: expected {what} of shape [{nb}] (ceil({codes.shape[0]} * {codes.shape[1]} / "
                         f"{w.blocksize}) blocks), got {w.absmax.dtype} shape {list(w.absmax.shape)}")
    if w.nested is None:
        _fail_if_not_finite(w.absmax, "absmax", "block absmax")
        return
    n = w.nested
    if tuple(n.quant_map.shape) != (256,) or n.quant_map.dtype != torch.float32:
        raise ValueError(f"nested_quant_map: expected float32 [256], got {n.quant_map.dtype} "
                         f"shape {list(n.quant_map.shape)}")
    if not isinstance(n.blocksize, int) or n.blocksize <= 0:
        raise ValueError(f"nested_blocksize: expected a positive integer, got {n.blocksize!r}")
    nn = -(-nb // n.blocksize)
    if tuple(n.absmax.shape) != (nn,) or n.absmax.dtype != torch.float32:
        raise ValueError(f"nested_absmax: expected float32 [{nn}] (ceil({nb} blocks / {n.blocksize})), got "
                         f"{n.absmax.dtype} shape {list(n.absmax.shape)}")
    _fail_if_not_finite(n.quant_map, "nested_quant_map", "map value")
    _fail_if_not_finite(n.absmax, "nested_absmax", "nested absmax")
    if not isinstance(n.offset, float) or not math.isfinite(n.offset) or \
            float(torch.tensor(n.offset, dtype=torch.float32)) != n.offset:
        raise ValueError(f"nested_offset: expected a finite float32 value, got {n.offset!r}")


def check_int8_weight(w: BnbInt8Weight) -> None:
    """Raise ``ValueError`` naming the field, what was expected and what was found."""
    codes, scb = w.codes, w.scb
    if codes.dim() != 2 or codes.dtype != torch.int8:
        raise ValueError(f"weight: expected a 2-D int8 [out_features, in_features] tensor, got "
                         f"{codes.dtype} shape {list(codes.shape)}")
    if scb.dtype != torch.float32 or tuple(scb.shape) != (codes.shape[0],):
        raise ValueError(f"SCB: expected float32 [{codes.shape[0]}] (one scale per output row), got "
                         f"{scb.dtype} shape {list(scb.shape)}")
    _fail_if_not_finite(scb, "SCB", "row scale")
