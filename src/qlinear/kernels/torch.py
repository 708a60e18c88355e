"""Portable GPTQ kernels in plain torch: ``TorchLinear`` and ``TorchQuantEmbeddings``.

Weights stay packed between forwards. Each forward decodes the weight in tiles of output columns
(at most ``TILE_ELEMENTS`` values) and multiplies tile by tile into the output, so no dense
``[K, N]`` weight ever exists, not even inside a forward.
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem
from ..enums import ALL_DEVICES, BACKEND, FORMAT
from ..target import Target
from .gptq_base import GPTQQuantLinear

#: Largest decoded tile (values). 2**18 float32 = 1 MiB stays in cache: measured twice as fast as 2**22
#: for a 4096x4096 layer at M=1 (one thread, this repo's CPU; benchmarks/cpu_linear.py).
TILE_ELEMENTS = 1 << 18

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

    def prepare(self) -> None:
        """Note whether groups are contiguous runs of ``group_size`` inputs (no act-order): then a tile's
        scales broadcast per group instead of being gathered per input channel."""
        plain = torch.arange(self.in_features, dtype=torch.int32, device=self.g_idx.device) // self.scheme.group_size
        self._plain_groups = bool(torch.equal(self.g_idx, plain))
        super().prepare()

    def tile_cols(self) -> int:
        """Output columns decoded per tile: about TILE_ELEMENTS values, so a tile stays in cache."""
        return max(16, TILE_ELEMENTS // self.in_features // 16 * 16)

    def _tile(self, n0: int, n1: int, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Decoded weight columns ``n0:n1`` as ``[K, n1 - n0]`` in ``dtype``."""
        codes = self.codes_cols(n0, n1).to(torch.float32)
        s, z = scales[:, n0:n1], zeros[:, n0:n1]
        k, gs = self.in_features, self.scheme.group_size
        if self._plain_groups and k % gs == 0:  # contiguous groups: broadcast one scale row per group
            s, z = s[:, None, :], z[:, None, :]
            return torch.addcmul(-z * s, codes.view(k // gs, gs, -1), s).view(k, -1).to(dtype)
        g = self.g_idx.long()
        return codes.sub_(z[g]).mul_(s[g]).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.in_features, self.out_features
        self.check_input(x)
        self.ensure_prepared()
        x2 = x.reshape(-1, k)
        scales = self.scales.to(torch.float32)
        zeros = self.true_zeros().to(x.device)
        step = self.tile_cols()
        y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            torch.matmul(x2, self._tile(n0, n1, scales, zeros, x.dtype), out=y[:, n0:n1])
        if self.bias is not None:
            y += self.bias.to(x.dtype)
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
