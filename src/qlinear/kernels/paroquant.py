"""ParoQuant kernels: the input rotation (``layouts/paroquant.py``) followed by a 4-bit AWQ GEMM product.

``ParoLinear`` (exact, any device): the rotation with GPTQModel's roundings, then ``AwqTorchLinear``'s row-tile
product. ``ParoQuantTritonLinear`` (CUDA): the same rotation in torch, then qlinear's AWQ/GPTQ Triton kernels
(``TritonQuantMixin``: the codes re-packed along K once at ``prepare``). Both keep the reference's declaration;
gradients flow to the inputs (the rotation is differentiable torch, the products are the AWQ kernels' own).
"""

from __future__ import annotations

import torch

from ..caps import Problem
from ..target import Target
from .paro_base import ROTATION, ParoQuantBase, shape_reasons
from .planned.other import ParoLinear as _DeclaredTorch
from .planned.other import ParoQuantTritonLinear as _DeclaredTriton
from .torch_awq import AwqTorchLinear
from .triton.runtime import interpreting
from .triton_gptq import TritonQuantMixin


class ParoLinear(ParoQuantBase, AwqTorchLinear):
    """ParoQuant checkpoint buffers; rotated inputs times AWQ codes decoded tile by tile in each forward."""

    backend = _DeclaredTorch.backend
    caps = _DeclaredTorch.caps

    def _tile(self, k0: int, k1: int, zeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """GPTQModel dequantizes in the stored scales' dtype and then casts to the input's (a float16 weight
        rounded again for bfloat16 inputs): the same two roundings here."""
        return super()._tile(k0, k1, zeros, scales, self.scales.dtype).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        self.ensure_prepared()
        return AwqTorchLinear.forward(self, self.rotate_input(x))


class ParoQuantTritonLinear(TritonQuantMixin, ParoQuantBase):
    """ParoQuant checkpoint buffers; rotated inputs (torch) into qlinear's 4-bit Triton kernels."""

    backend = _DeclaredTriton.backend
    caps = _DeclaredTriton.caps

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return shape_reasons(problem.scheme) + cls.runtime_target_reasons(target)

    def checkpoint_names(self) -> list[str]:
        """The code tensors ``release_checkpoint`` may drop: the rotation is needed by every forward."""
        return [n for n in super().checkpoint_names() if n not in ROTATION]

    def rotate_input(self, x: torch.Tensor) -> torch.Tensor:
        """The transform in one Triton launch (``triton/paro_rotate.py``, bit-identical to the torch one), or in
        torch where gradients must reach ``x``."""
        ops = self.rotation_operands(x.dtype, x.device)
        if ops.plan.identity or (torch.is_grad_enabled() and x.requires_grad):
            return super().rotate_input(x)
        from .triton.paro_rotate import rotate

        x2 = x.reshape(-1, self.in_features)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = rotate(x2, ops.group_maps, ops.cos, ops.sin, ops.scales, self.scheme.group_size, interpreting())
        return out.reshape(x.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input: expected last dimension {self.in_features} (in_features), got shape "
                             f"{tuple(x.shape)}")
        if x.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"input: dtype {x.dtype} not supported; expected float16 or bfloat16")
        if x.device.type != "cuda" and not interpreting():
            raise ValueError(f"input: {type(self).__name__} runs on CUDA tensors, got one on {x.device} "
                             "(TRITON_INTERPRET=1 runs the kernels on CPU tensors, for testing)")
        self.ensure_prepared()
        return super().forward(self.rotate_input(x))


KERNELS = (ParoLinear, ParoQuantTritonLinear)
