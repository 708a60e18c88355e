"""The forward every exact "decode a few rows, multiply them in" kernel shares (FP8/FP4, bitsandbytes).

A class mixing this in provides ``decode_rows(n0, n1, dtype)`` (the float weight of output rows ``n0:n1``,
exactly as its producer dequantizes), ``tile_rows()`` (how many rows one tile holds) and ``_native(x2)`` (a
native kernel's product, or None). No dense weight outlives a tile.
"""

from __future__ import annotations

import torch


class RowTileForward:
    """``forward``: a native kernel's product when it takes the call, else row tiles decoded and multiplied."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.out_features  # type: ignore[attr-defined]
        self.check_input(x)  # type: ignore[attr-defined]
        self.ensure_prepared()  # type: ignore[attr-defined]
        x2 = x.reshape(-1, self.in_features)  # type: ignore[attr-defined]
        y = self._native(x2)
        if y is None:
            y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
            step = self.tile_rows()  # type: ignore[attr-defined]
            for n0 in range(0, n, step):
                n1 = min(n, n0 + step)
                torch.matmul(x2, self.decode_rows(n0, n1, x.dtype).t(), out=y[:, n0:n1])  # type: ignore
        if self.bias is not None:  # type: ignore[attr-defined]
            y += self.bias.to(x.dtype)  # type: ignore[attr-defined]
        return y.reshape(*x.shape[:-1], n)

    def _native(self, x2: torch.Tensor) -> torch.Tensor | None:
        return None
