"""Portable GPTQ kernels in plain torch: ``TorchLinear`` and ``TorchQuantEmbeddings``.

Weights stay packed between forwards. Each forward decodes the weight in row tiles of at most
``TILE_ELEMENTS`` values and multiplies tile by tile, so no dense ``[K, N]`` weight ever exists,
not even inside a forward.
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem
from ..enums import ALL_DEVICES, BACKEND, FORMAT
from ..target import Target
from .gptq_base import GPTQQuantLinear

#: Largest decoded tile (values). 2**22 float32 = 16 MiB: big enough for full-speed GEMMs on CPU.
TILE_ELEMENTS = 1 << 22

TORCH_GPTQ_CAPS = Caps(
    formats={FORMAT.GPTQ: 20, FORMAT.GPTQ_V2: 20, FORMAT.GPTQ_P: 20},
    bits=frozenset({2, 3, 4, 5, 6, 7, 8}),
    group_sizes=frozenset({-1, 16, 32, 64, 128, 256, 512, 1024}),
    devices=ALL_DEVICES,
    # float32 is a deliberate widening of the reference (float16, bfloat16): the decode is exact in
    # float32 and CPU users often run float32 models.
    dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
    pack_dtypes=frozenset({torch.int8, torch.int16, torch.int32}),
    auto_padding=True,
    training=True,
)


def _planar_reasons(problem: Problem) -> list[str]:
    s = problem.scheme
    if s.format is not FORMAT.GPTQ_P:
        return []
    return [f"{name} {v} not a multiple of 32 (gptq_p packs blocks of 32 codes)"
            for name, v in (("in_features", s.in_features), ("out_features", s.out_features)) if v % 32]


class TorchLinear(GPTQQuantLinear):
    """GPTQ continuous (v1, v2) or planar words, 2-8 bits, decoded tile by tile in each forward."""

    backend = BACKEND.GPTQ_TORCH
    caps = TORCH_GPTQ_CAPS

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return _planar_reasons(problem)

    def tile_rows(self) -> int:
        """Input channels decoded per tile: a multiple of the code block, about TILE_ELEMENTS values."""
        block = self.code_block
        rows = max(block, TILE_ELEMENTS // max(1, self.out_features) // block * block)
        return min(rows, -(-self.in_features // block) * block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.in_features, self.out_features
        if x.shape[-1] != k:
            raise ValueError(f"input: expected last dimension {k} (in_features), got shape {tuple(x.shape)}")
        if x.dtype not in self.caps.dtypes:
            raise ValueError(f"input: dtype {x.dtype} not supported; expected float16, bfloat16 or float32")
        self.ensure_prepared()
        x2 = x.reshape(-1, k)
        scales = self.scales.to(torch.float32)
        zeros = self.true_zeros().to(x.device)
        g_idx = self.g_idx.long()
        step = self.tile_rows()
        out: torch.Tensor | None = None
        for k0 in range(0, k, step):
            k1 = min(k, k0 + step)
            g = g_idx[k0:k1]
            w = (self.codes_rows(k0, k1).to(torch.float32) - zeros[g]).mul_(scales[g]).to(x.dtype)
            part = x2[:, k0:k1] @ w
            del w
            if k0 == 0 and k1 == k:  # one tile: the product is already the answer
                out = part
            elif out is None:  # several tiles: accumulate in float32
                out = part.float()
            else:
                out.add_(part)
        y = out.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], n)


class TorchQuantEmbeddings(GPTQQuantLinear):
    """A GPTQ-packed embedding table ``[num_embeddings, embedding_dim]``: looks up and decodes only the
    rows asked for. ``out_features`` = num_embeddings, ``in_features`` = embedding_dim."""

    backend = BACKEND.GPTQ_TORCH
    caps = TORCH_GPTQ_CAPS.but(auto_selectable=False, training=False)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return _planar_reasons(problem)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"ids: expected an integer tensor of token ids, got {ids.dtype}")
        flat = ids.reshape(-1).long()
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.out_features):
            raise ValueError(f"ids: must be in 0..{self.out_features - 1}; found {int(flat.min())}..{int(flat.max())}")
        self.ensure_prepared()
        from ..layouts import gptq, planar

        s = self.scheme
        cols = self.qweight.index_select(1, flat)
        if s.format is FORMAT.GPTQ_P:
            codes = planar.planar_unpack_rows(cols, s.bits, s.in_features)
        else:
            codes = gptq.unpack_qweight(cols, s.bits, s.in_features)
        g = self.g_idx.long()
        zeros = self.true_zeros()[:, flat][g]
        scales = self.scales.to(torch.float32)[:, flat][g]
        rows = ((codes.to(torch.float32) - zeros) * scales).t().to(self.dtype)
        return rows.reshape(*ids.shape, s.in_features)


KERNELS = (TorchLinear, TorchQuantEmbeddings)
