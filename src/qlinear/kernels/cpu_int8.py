"""Native 8-bit GPTQ on torch's ``_weight_int8pack_mm`` (CPU): ``TorchInt8Linear`` (explicit only).

``prepare()`` centres the codes on 128: ``q - 128`` always fits int8, whatever the zero points, so the
operand is exact for symmetric and asymmetric weights alike (``q - z`` would not: for an 8-bit
asymmetric zero it spans -255..255). The zero point then enters as ``s * (128 - z)`` times the sum of
each group's activations: one small ``[M, G] @ [G, N]`` GEMM, skipped when every ``z`` is 128.

The op takes one scale per output channel, so a grouped weight runs one op call per group (groups are
made contiguous along K first, act-order included) and the calls are summed in float32. The op also
needs K a multiple of 16: on torch 2.13 CPU any other K gives silently wrong results or a segfault
(K = 24: 59 % error; K = 196: crash), so each group's block is padded with zero columns to a multiple
of 16. The operand is int8 ``[N, K]`` (plus that padding): the size of the 8-bit codes, not an expansion.
Activations are computed in bfloat16 (the op's only fast dtype here: float32 is about ten times slower)
and cast back. The op's cost grows with M row by row; above ``INT8PACK_MAX_M`` rows each group's
operand is decoded to bfloat16 in tiles of rows and multiplied by a bfloat16 GEMM instead.

``TorchInt8AwqLinear`` stays retired (planned/cpu.py): building it raises ``RetiredKernelError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F

from .gptq_base import GPTQQuantLinear
from .planned import cpu as declared

BF16 = torch.bfloat16
#: ``_weight_int8pack_mm`` is only right for K a multiple of this (measured, torch 2.13 CPU).
OP_K = 16
#: Largest M that runs the op; above it, rows of the int8 operand are decoded to bfloat16 for a GEMM.
#: Measured by ``python benchmarks/cpu_linear.py --crossover --reps 7`` on 2026-12-02 (one thread, AMX
#: Xeon, torch 2.13; a loaded machine): op vs decode ms at M = 16: 26 vs 28 (4096x4096), 88 vs 92
#: (4096x14336); at M = 32: 47 vs 28 and 170 vs 108.
INT8PACK_MAX_M = 16
#: Decoded elements per tile: about 1 MiB of bfloat16.
TILE_ELEMENTS = 1 << 19


@dataclass(eq=False)
class Int8PackRuntime:
    """Kernel-private tensors: group-major int8 operand, per-group bf16 scales, zero correction, K order."""

    operand: torch.Tensor  # flat int8: group g is a contiguous [N, width_g] block at offset N * sum(width[:g])
    scales: torch.Tensor  # [G, N] bf16, one op call each
    correction: torch.Tensor | None  # [G, N] float32 s * (128 - z); None when all zero
    order: torch.Tensor | None  # input channel read at each position (groups contiguous); None: plain
    starts: tuple[int, ...]  # first position of each group, then K
    widths: tuple[int, ...]  # each group's count rounded up to a multiple of 16 (the op's K rule)
    group_of: torch.Tensor  # [K] group of each position (for the group sums)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.operand, self.scales, self.correction, self.order, self.group_of) if t is not None]


def build_runtime(layer: GPTQQuantLinear) -> Int8PackRuntime:
    """Centre the 8-bit codes on 128 and lay them out group by group for ``_weight_int8pack_mm``."""
    q = layer.affine()
    if q.bits != 8:
        raise ValueError(f"bits: _weight_int8pack_mm takes 8-bit codes, got {q.bits}-bit")
    k = q.in_features
    g_idx = q.g_idx.long()
    order = torch.argsort(g_idx, stable=True)
    plain = torch.equal(order, torch.arange(k))
    counts = torch.bincount(g_idx, minlength=q.num_groups)
    starts = [0, *torch.cumsum(counts, 0).tolist()]
    codes = q.codes if plain else q.codes[:, order]
    centred = (codes.to(torch.int16) - 128).to(torch.int8)
    widths = [-(-(b - a) // OP_K) * OP_K for a, b in pairwise(starts)]
    operand = torch.cat([F.pad(centred[:, a:b], (0, wd - (b - a))).reshape(-1)
                         for (a, b), wd in zip(pairwise(starts), widths, strict=True)])
    scales = q.scales.t().to(BF16).contiguous()
    correction = (128 - q.zeros.t().float()) * scales.float()
    return Int8PackRuntime(operand=operand, scales=scales,
                           correction=correction.contiguous() if bool(correction.any()) else None,
                           order=None if plain else order, starts=tuple(int(s) for s in starts),
                           widths=tuple(widths),
                           group_of=g_idx[order].contiguous())


def group_matmul(xg: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, use_op: bool) -> torch.Tensor:
    """``xg [M, w]`` bf16 times one group's ``s * w`` (``w [N, w]`` int8): the op, or tiles of rows decoded
    to bfloat16 (about 1 MiB each) and a bfloat16 GEMM, which is faster for many rows."""
    if use_op:
        return torch.ops.aten._weight_int8pack_mm(xg, w, scales)
    n, width = w.shape
    rows = max(1, TILE_ELEMENTS // width)
    out = torch.empty(xg.shape[0], n, dtype=BF16)
    for r0 in range(0, n, rows):
        tile = w[r0:r0 + rows].to(BF16).mul_(scales[r0:r0 + rows, None])
        out[:, r0:r0 + rows] = xg @ tile.t()
    return out


class TorchInt8Linear(GPTQQuantLinear):
    """8-bit GPTQ (any declared group, act-order, sym or asym) as a centred INT8 operand on CPU."""

    backend = declared.TorchInt8Linear.backend
    caps = declared.TorchInt8Linear.caps

    def prepare(self) -> None:
        self._rt = build_runtime(self)
        super().prepare()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.in_features, self.out_features
        self.check_input(x, "cpu")
        self.ensure_prepared()
        rt = self._rt
        xb = x.reshape(-1, k).to(BF16)
        if xb.shape[0] == 0:
            return x.new_zeros(*x.shape[:-1], n)
        if rt.order is not None:
            xb = xb.index_select(1, rt.order)
        use_op = xb.shape[0] <= INT8PACK_MAX_M
        y: torch.Tensor | None = None
        offset = 0
        for g, ((a, b), wd) in enumerate(zip(pairwise(rt.starts), rt.widths, strict=True)):
            if a == b:
                continue
            w = rt.operand[offset:offset + n * wd].view(n, wd)
            offset += n * wd
            part = group_matmul(F.pad(xb[:, a:b], (0, wd - (b - a))).contiguous(), w, rt.scales[g], use_op)
            y = part.float() if y is None else y.add_(part)
        if y is None:
            y = xb.new_zeros(xb.shape[0], n, dtype=torch.float32)
        if rt.correction is not None:
            sums = torch.zeros(xb.shape[0], rt.scales.shape[0]).index_add_(1, rt.group_of, xb.float())
            y = y + sums @ rt.correction
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], n)


KERNELS = (TorchInt8Linear,)
