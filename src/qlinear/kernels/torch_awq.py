"""Portable AWQ GEMM kernel in plain torch: ``AwqTorchLinear``.

Weights stay packed between forwards. Each forward decodes the weight in row tiles of at most
``TILE_ELEMENTS`` values and multiplies tile by tile (as ``TorchLinear`` does for GPTQ), so no dense
``[K, N]`` weight exists between forwards, nor a whole one inside a forward of a large layer.

The declaration is the reference's (bits 2..8), with float32 activations added as for ``TorchLinear``: the
decode is exact in float32, and CPU users often run float32 models. AWQ GEMM words exist for 2, 4 and 8 bits
only (``layouts/awq``), so a 3, 5, 6 or 7-bit AWQ scheme is refused where it is made (``Scheme``);
2-bit words hold 16 columns, so 2-bit layers also need ``out_features % 16 == 0``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..caps import Problem
from ..enums import BACKEND, FORMAT
from ..spec import AWQ_LAYOUT_BITS
from ..target import Target
from .awq_base import AwqQuantLinear
from .planned.awq import AwqTorchLinear as _Declared

#: Largest decoded tile (values). 2**22 float32 = 16 MiB: big enough for full-speed GEMMs on CPU.
TILE_ELEMENTS = 1 << 22


class AwqTorchLinear(AwqQuantLinear):
    """AWQ GEMM words (2, 4 or 8 bits) decoded tile by tile in each forward; runs on every device."""

    backend = BACKEND.AWQ_TORCH
    caps = replace(_Declared.caps, dtypes=_Declared.caps.dtypes | {torch.float32})  # deliberate widening

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        s = problem.scheme
        if s.format is not FORMAT.GEMM:
            return []
        if s.bits not in AWQ_LAYOUT_BITS[FORMAT.GEMM]:
            return [f"{s.bits}-bit AWQ GEMM words do not exist (32/b fields per int32 word: 2, 4 or 8 bits)"]
        pf = 32 // s.bits
        if s.out_features % pf:
            return [f"out_features {s.out_features} not a multiple of {pf} ({s.bits}-bit AWQ GEMM words hold "
                    f"{pf} columns)"]
        return []

    def tile_rows(self) -> int:
        """Input channels decoded per tile: about TILE_ELEMENTS values, whole groups where one fits."""
        rows = max(1, TILE_ELEMENTS // max(1, self.out_features))
        gs = self.scheme.group_size
        return min(self.in_features, rows // gs * gs if rows >= gs else rows)

    def _tile(self, k0: int, k1: int, zeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Weight rows ``k0:k1`` in slot order, ``(q - z) * s`` in float32 then ``dtype``; whole groups broadcast."""
        codes = self.codes_rows(k0, k1, slot_order=True).to(torch.float32)
        gs, rows = self.scheme.group_size, k1 - k0
        if k0 % gs == 0 and rows % gs == 0:
            g0, ng = k0 // gs, rows // gs
            w = codes.view(ng, gs, -1).sub_(zeros[g0:g0 + ng, None]).mul_(scales[g0:g0 + ng, None])
            return w.view(rows, -1).to(dtype)
        g = self.group_index(k0, k1)
        return codes.sub_(zeros[g]).mul_(scales[g]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.in_features, self.out_features
        self.check_input(x)
        self.ensure_prepared()
        x2 = x.reshape(-1, k)
        scales, zeros, slots = self.group_scales(), self.true_zeros(), self.slot_columns()
        if slots is not None:  # compute in the words' column order; one output permutation at the end
            scales, zeros = scales[:, slots], zeros[:, slots]
        step = self.tile_rows()
        out: torch.Tensor | None = None
        for k0 in range(0, k, step):
            k1 = min(k, k0 + step)
            w = self._tile(k0, k1, zeros, scales, x.dtype)
            part = x2[:, k0:k1] @ w
            del w
            if k0 == 0 and k1 == k:  # one tile: the product is already the answer
                out = part
            elif out is None:  # several tiles: accumulate in float32
                out = part.float()
            else:
                out.add_(part)
        y = out.to(x.dtype)
        if slots is not None:
            y = torch.empty_like(y).index_copy_(1, slots, y)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], n)


KERNELS = (AwqTorchLinear,)
