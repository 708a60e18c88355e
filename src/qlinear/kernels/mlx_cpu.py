"""``MlxCpuLinear``: MLX affine weights (mlx-lm checkpoints) on CPU through qlinear's int4 kernels.

``MlxTorchLinear`` decodes every weight in every forward (720 ms for 4096x14336 at M=1 on one thread, 68x dense
bf16). MLX's weight is ``w = s q + b`` per group, with a float bias ``b``; the int4 runtime's form is ``(q' - 8)
scale + offset`` (``runtime_from_pairs``). The codes move up by ``c`` (``SHIFT``), chosen so that the offset is
small for MLX's usual bias (``b`` near ``-2^(bits-1) s``: the group's minimum), since it is rounded to bfloat16:

* 1 to 4-bit codes: ``q' = q + 8 - 2^(bits-1)``, one 4-bit part, scale ``s``, offset ``2^(bits-1) s + b``;
* 5, 6 and 8-bit codes: ``q' = q + c`` (``136 - 2^(bits-1)``; 0 for 8 bits, which has no room) split exactly
  into ``q' = 16 h + l``, two 4-bit parts along K (each input channel read twice): ``h`` with scale ``16 s`` and
  offset 0, ``l`` with scale ``s`` and offset ``(136 - c) s + b``.

The arithmetic is the CPU int4 kernels' (bfloat16 weights and activations, float32 sums; the pairs rounded once
to bfloat16), so float32 activations stay on the exact ``MlxTorchLinear``. The runtime holds every code, so the
file's words are dropped and rebuilt from it when read or saved (``resident_codes.py``).
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import mlx
from ..target import Target
from .cpu_int4 import Int4PositionsForward, ops_reasons
from .int4pack_runtime import Int4PackRuntime, runtime_from_pairs
from .mlx_torch import MlxTorchLinear
from .resident_codes import CodesInRuntime

BF16 = torch.bfloat16


def split(bits: int) -> bool:
    """Do ``bits``-bit codes take two nibble parts?"""
    return bits > 4


def shift(bits: int) -> int:
    """What each code gains before it is cut into 4-bit parts (module docstring)."""
    if not split(bits):
        return 8 - (1 << (bits - 1))
    return 0 if bits == 8 else 136 - (1 << (bits - 1))


def runtime_of_mlx(codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int,
                   group_size: int) -> tuple[Int4PackRuntime, torch.Tensor | None]:
    """``(runtime, rows)`` of MLX codes ``[N, K]`` with ``scales`` / ``biases [N, K / group_size]``: ``rows`` is
    the input channel of each K position (None: in order)."""
    s, b = scales.float(), biases.float()
    c = shift(bits)
    moved = codes.to(torch.int32) + c
    if not split(bits):
        parts, pairs = moved, [(s, (8 - c) * s + b)]
    else:
        parts = torch.cat([moved >> 4, moved & 15], dim=1)
        pairs = [(16 * s, torch.zeros_like(s)), (s, (136 - c) * s + b)]
    stacked = torch.cat([torch.stack([sc.t(), off.t()], dim=2) for sc, off in pairs]).to(BF16)
    rt = runtime_from_pairs(parts, stacked, group_size)
    k = codes.shape[1]
    return rt, (torch.arange(k).repeat(2) if split(bits) else None)


def codes_of_mlx(rt: Int4PackRuntime, bits: int, n: int, k: int) -> torch.Tensor:
    """``runtime_of_mlx`` undone: the codes ``[N, K]`` uint8 (the two nibble parts joined, the shift taken off)."""
    if not split(bits):
        moved = rt.codes(n, k).to(torch.int32)
    else:
        both = rt.codes(n, 2 * k).to(torch.int32)
        moved = (both[:, :k] << 4) | both[:, k:]
    return (moved - shift(bits)).to(torch.uint8)


class MlxCpuLinear(Int4PositionsForward, CodesInRuntime, MlxTorchLinear):
    """MLX affine weights (1-6 and 8 bits, groups 32/64/128) on CPU as 4-bit parts on the int4 kernels (bfloat16)."""

    backend = BACKEND.MLX_CPU
    caps = Caps(formats={FORMAT.MLX: 60}, bits=frozenset(mlx.BITS), group_sizes=frozenset(mlx.GROUP_SIZES),
                desc_act=frozenset({False}), sym=None, devices=frozenset({DEVICE.CPU}),
                dtypes=frozenset({torch.float16, BF16}),  # bfloat16 arithmetic: float32 stays on MlxTorchLinear
                pack_dtypes=frozenset({torch.int32}), in_divisible=32)
    codes_buffer = "weight"

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return ops_reasons(target)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        s = problem.scheme
        form = "two exact 4-bit nibble parts merged along K" if split(s.bits) else "one 4-bit part"
        return (f"{mlx.describe(s)}: codes moved up by {shift(s.bits)} as {form}, scales and offsets in bfloat16 "
                "pairs, on the int4 kernels by M (native AVX512-BF16 / AMX, the int4pack op, decode + bfloat16 GEMM)")

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight", "scales", "biases", "bias")

    def checkpoint_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {name: (shape, dtypes[0]) for name, (shape, dtypes) in mlx.checkpoint_shapes(self.scheme).items()}

    def rebuilt_words(self) -> torch.Tensor:
        s = self.scheme
        return mlx.pack(codes_of_mlx(self._rt, s.bits, s.out_features, s.in_features), s.bits)

    def prepare(self) -> None:
        """Check the scales and biases, build the runtime from the words and drop them (read back from the current
        runtime when they were dropped before)."""
        super().prepare()
        s = self.scheme
        codes = mlx.unpack(self.weight, s.bits, s.in_features)
        rt, rows = runtime_of_mlx(codes, self.scales, self.biases, s.bits, s.group_size)
        self.keep_words_unless(rt.readable())
        self._rt, self._rows = rt, rows
        self.drop_codes_buffer()


KERNELS = (MlxCpuLinear,)
