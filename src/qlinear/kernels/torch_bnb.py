"""``BitsAndBytesTorchLinear``: the exact portable kernel for bitsandbytes weights (NF4, FP4, LLM.int8), any device.

Each forward decodes a few output rows at a time into the activation dtype, exactly as bitsandbytes
dequantizes them (``BnbQuantLinear.decode_rows``: 4-bit, ``table[code] * absmax`` in float32 rounded to
the weight's stored dtype; 8-bit, ``(q * SCB) * float32(1/127)``), and multiplies them in; no dense weight
outlives a tile. bitsandbytes itself is never imported. ``_native`` is the hook for a native CPU kernel
(None: the tiles run).
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem
from ..enums import ALL_DEVICES, BACKEND, DEVICE, FORMAT
from ..layouts import bnb
from ..target import Target
from .bnb_base import TILE_ELEMENTS, BnbQuantLinear
from .row_tiles import RowTileForward

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
PACK_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64})


class BitsAndBytesTorchLinear(RowTileForward, BnbQuantLinear):
    """bitsandbytes 4-bit (NF4 / FP4, any blocksize, double-quantized or not) and 8-bit weights, exact, any device.

    Ranked below the bitsandbytes package's own kernel (40) for AUTO, which passes that one over wherever it
    is not exact (``BitsAndBytesLinear.auto_reasons``) or not installed."""

    backend = BACKEND.BITSANDBYTES_TORCH
    caps = Caps(formats={FORMAT.BITSANDBYTES: 30}, bits=frozenset({4, 8}), group_sizes=None, desc_act=None, sym=None,
                devices=ALL_DEVICES, dtypes=frozenset({F16, BF16, F32}), pack_dtypes=PACK_DTYPES)

    def _native(self, x2: torch.Tensor) -> torch.Tensor | None:
        """qlinear's native CPU kernel (``native_lut4``: the float32 weight ``table[c] * absmax`` unrounded, exact
        products, float32 sums), or None to run the tiles (8-bit, another device, a K the blocks do not divide,
        an M above the measured crossover with dense, or no native extra)."""
        s = self.scheme
        k, n, bs = self.in_features, self.out_features, s.blocksize
        if s.bits != 4 or x2.device.type != "cpu" or k % 2 or k % bs or 2 * self.weight.numel() != k * n:
            return None
        from . import native_lut4

        codes = self.weight.view(self.out_features, k // 2)
        return native_lut4.linear(x2, codes, self._absmax.view(self.out_features, k // bs), self._table, bs)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        s = problem.scheme
        tiles = (f"{bnb.describe(s)}: rows decoded exactly as bitsandbytes dequantizes, in tiles of about "
                 f"{TILE_ELEMENTS} values, each multiplied by torch.matmul (no dense weight kept)")
        if s.bits != 4 or not any(d.kind is DEVICE.CPU for d in target.devices):
            return tiles
        from . import native_lut4

        return f"{tiles}; on this CPU: {native_lut4.describe(s.in_features, s.blocksize, problem.dtype)}"


KERNELS = (BitsAndBytesTorchLinear,)
