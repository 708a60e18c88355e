"""``MlxTorchLinear``: the exact portable kernel for MLX affine weights (mlx-lm checkpoints), any device.

The module's buffers are the checkpoint's own tensors: ``weight`` (uint32 words), ``scales`` and ``biases`` in
their stored dtype, and an optional ``bias``. Each forward decodes a few output rows at a time exactly as
``mx.dequantize`` does (``layouts/mlx.py``: ``scales * q + biases`` in the scales' dtype, each operation rounded
to it), casts them to the activation dtype and multiplies them in; no dense weight outlives a tile. mlx itself is
never imported. On CUDA this kernel is correct but decodes every forward; ``MlxTritonLinear`` is the fast path there
(16-bit activations), ``MlxCpuLinear`` on CPU.
"""

from __future__ import annotations

from typing import Any

import torch

from ..affine import AffineWeight
from ..caps import Caps, Problem
from ..enums import ALL_DEVICES, BACKEND, FORMAT
from ..layouts import mlx
from ..layouts.mlx import MlxWeight
from ..target import Target
from .base import QuantLinear, adopt_dtypes
from .row_tiles import RowTileForward

#: Largest decoded tile (values): about 1 MiB of float32, as the other Torch kernels'.
TILE_ELEMENTS = 1 << 18
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


class MlxTorchLinear(RowTileForward, QuantLinear):
    """MLX affine weights (1-6 and 8 bits, group sizes 32 / 64 / 128), exact as mlx dequantizes them."""

    backend = BACKEND.MLX_TORCH
    caps = Caps(formats={FORMAT.MLX: 50}, bits=frozenset(mlx.BITS), group_sizes=frozenset(mlx.GROUP_SIZES),
                desc_act=frozenset({False}), sym=None, devices=ALL_DEVICES, dtypes=frozenset({F16, BF16, F32}),
                pack_dtypes=frozenset({torch.int32}), in_divisible=32)
    raw_packing = False  # built from an MlxWeight (load_mlx), an AffineWeight (load_affine) or a checkpoint

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        s = problem.scheme
        return mlx.params_errors(s.bits, s.group_size, s.in_features) + cls.runtime_target_reasons(target)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        return (f"{mlx.describe(problem.scheme)}: rows decoded exactly as mx.dequantize, in tiles of about "
                f"{TILE_ELEMENTS} values, each multiplied by torch.matmul (no dense weight kept)")

    # ---------------------------------------------------------------- checkpoint buffers
    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtypes) in mlx.checkpoint_shapes(self.scheme).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtypes[0]))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=F16) if bias else None)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # scales, biases and bias keep the checkpoint's float dtype (MLX computes in it).
        adopt_dtypes(self, state_dict, prefix, ("scales", "biases", "bias"), mlx.SCALE_DTYPES)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def load_mlx(self, w: MlxWeight, bias: torch.Tensor | None = None) -> None:
        """Encode ``w`` into the checkpoint buffers, bit-exactly as mlx writes them."""
        s = self.scheme
        if (w.out_features, w.in_features, w.bits, w.group_size) != (s.out_features, s.in_features, s.bits,
                                                                     s.group_size):
            raise ValueError(f"weight: expected [{s.out_features}, {s.in_features}] {s.bits}-bit group size "
                             f"{s.group_size} for this layer, got [{w.out_features}, {w.in_features}] {w.bits}-bit "
                             f"group size {w.group_size}")
        state = mlx.to_checkpoint(w)
        if bias is not None:
            if self.bias is None:
                raise ValueError("bias given but the layer was built without one (bias=False)")
            if tuple(bias.shape) != (s.out_features,) or bias.dtype not in mlx.SCALE_DTYPES:
                raise ValueError(f"bias: expected a float16/bfloat16/float32 [{s.out_features}] tensor, got "
                                 f"{bias.dtype} shape {list(bias.shape)}")
            state["bias"] = bias.detach()
        elif self.bias is not None:
            state["bias"] = torch.zeros(s.out_features, dtype=w.scales.dtype)
        self.load_state_dict(state, strict=True)

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        """A GPTQ/AWQ-style weight, when MLX holds it exactly (``mlx_convert.from_affine``; refused otherwise)."""
        from ..mlx_convert import from_affine

        self.check_fits(q)
        self.load_mlx(from_affine(q, group_size=self.scheme.group_size), bias)

    def mlx_weight(self) -> MlxWeight:
        """The canonical MLX form of the buffers (validated; on the CPU)."""
        tensors = {"weight": self.weight.cpu(), "scales": self.scales.cpu(), "biases": self.biases.cpu()}
        return mlx.from_checkpoint(tensors, self.scheme)

    def affine(self) -> AffineWeight:
        """The integer-affine form, where the biases are exact integer zero points (``mlx_convert.to_affine``)."""
        from ..mlx_convert import to_affine

        return to_affine(self.mlx_weight())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as ``mx.dequantize`` gives it (in the scales' dtype), then cast to ``dtype``."""
        return self.mlx_weight().dequantize(dtype).to(self.weight.device)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [self.weight, self.scales, self.biases, self.bias]

    # ---------------------------------------------------------------- runtime
    def prepare(self) -> None:
        """Check the scales and biases once (shape, dtype, finite); the words need no check (any bits decode)."""
        mlx.check_groups(self.scales, self.biases, self.out_features, self.scheme.num_groups)
        super().prepare()

    def decode_rows(self, n0: int, n1: int, dtype: torch.dtype) -> torch.Tensor:
        """Output rows ``n0:n1`` as ``mx.dequantize`` computes them, cast to ``dtype``."""
        s = self.scheme
        codes = mlx.unpack(self.weight[n0:n1], s.bits, s.in_features)
        return mlx.affine_values(codes, self.scales[n0:n1], self.biases[n0:n1], s.group_size).to(dtype)

    def tile_rows(self) -> int:
        return max(16, TILE_ELEMENTS // self.in_features // 16 * 16)


KERNELS = (MlxTorchLinear,)
