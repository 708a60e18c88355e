"""``ParoCpuLinear``: ParoQuant layers on CPU through qlinear's int4 kernels (native AVX512-BF16 / AMX, the int4pack
op).

``ParoLinear`` decodes the whole AWQ weight in every forward (277 ms for 4096x14336 at M=1 on one thread, 26x dense
bf16: ``docs/performance.md``). A ParoQuant weight is an ordinary 4-bit AWQ GEMM weight behind an input transform,
so here the transform runs as the reference does (torch, in the input dtype, its roundings) and the product runs on
the int4 runtime the AWQ CPU kernels use (``Int4PackMixin``: built once at ``prepare``, ``qweight`` dropped and
rebuilt word for word when saved). The arithmetic is those kernels' (bfloat16 weights and activations, float32
sums), as ``ParoQuantTritonLinear`` runs the GPU kernels' rather than GPTQModel's float16 decode.
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import awq
from ..target import Target
from .cpu_int4 import Int4PackMixin, ops_reasons
from .paro_base import ROTATION, ParoQuantBase
from .planned.other import ParoLinear as _Declared


class ParoCpuLinear(Int4PackMixin, ParoQuantBase):
    """ParoQuant (4-bit AWQ codes behind the pairwise rotation and channel scales) on the CPU int4 kernels."""

    backend = BACKEND.PAROQUANT_CPU
    caps = Caps(
        formats={FORMAT.PAROQUANT: 60},
        bits=frozenset({4}),
        group_sizes=_Declared.caps.group_sizes,
        desc_act=_Declared.caps.desc_act,
        sym=_Declared.caps.sym,
        devices=frozenset({DEVICE.CPU}),
        dtypes=frozenset({torch.float16, torch.bfloat16}),
        pack_dtypes=frozenset({torch.int32}),
    )

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return ops_reasons(target)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        return ("the input rotation in torch (the reference's roundings), then the 4-bit AWQ codes on the int4 kernels "
                "by M: " + super().describe_runs(problem, target))

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("qweight", "qzeros", "scales", "bias", *ROTATION)

    def checkpoint_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return awq.checkpoint_shapes(self._awq)

    def words_of(self, codes_nk: torch.Tensor) -> torch.Tensor:
        return awq.qweight_of(codes_nk, FORMAT.GEMM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "cpu")
        self.ensure_prepared()
        return super().forward(self.rotate_input(x))


KERNELS = (ParoCpuLinear,)
