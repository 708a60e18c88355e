"""``ParoCpuLinear``: ParoQuant layers on CPU through qlinear's int4 kernels (native AVX512-BF16 / AMX, the int4pack
op).

``ParoLinear`` decodes the whole AWQ weight in every forward (277 ms for 4096x14336 at M=1 on one thread, 26x dense
bf16: ``docs/performance.md``). A ParoQuant weight is an ordinary 4-bit AWQ GEMM weight behind an input transform,
so here the product runs on the int4 runtime the AWQ CPU kernels use (``Int4PackMixin``: built once at ``prepare``,
``qweight`` dropped and rebuilt word for word when saved), in their arithmetic (bfloat16 weights and activations,
float32 sums), as ``ParoQuantTritonLinear`` runs the GPU kernels' rather than GPTQModel's float16 decode.

The transform is linear and stays inside each group, so it is one ``gs x gs`` matrix per group: the channel scales
and every round composed in float64 from the angles as the reference rounds them for the input dtype, stored in
bfloat16 (``gs / N`` bytes a weight: 0.14 bits for 4096x14336 at groups of 128) and applied as one batched
bfloat16 matmul. The reference's eight rounds in torch, each rounded to the input dtype, took 115 ms at M = 256 on
K = 14336 here (against 34 ms for the product); the matmul drops the per-round roundings, so it is closer to the
exact transform than the reference is. Groups wider than ``MATRIX_MAX_GROUP`` keep the reference's rounds.
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import awq, paroquant
from ..target import Target
from .cpu_int4 import Int4PackMixin, ops_reasons
from .paro_base import ROTATION, ParoQuantBase
from .planned.other import ParoLinear as _Declared

#: the widest group whose transform is kept as a matrix (``gs * K`` bfloat16 values a layer)
MATRIX_MAX_GROUP = 256


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

    def prepare(self) -> None:
        self._matrices: dict[torch.dtype, torch.Tensor] = {}
        super().prepare()

    def group_matrices(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The transform for inputs of ``dtype`` as bfloat16 ``[K / gs, gs, gs]`` (row ``i`` of group ``g``: where
        local channel ``i`` goes), or None (identity, or groups too wide); built once per dtype."""
        gs, k = self.scheme.group_size, self.in_features
        assert self._rotation is not None  # after ensure_prepared
        if self._rotation.identity or not 0 < gs <= MATRIX_MAX_GROUP or k % gs:
            return None
        if dtype not in self._matrices:
            cos, sin = paroquant.cos_sin(self.theta, dtype)  # the reference's angles for this dtype
            scales = self.channel_scales.to(dtype).double().reshape(-1)
            basis = torch.eye(gs, dtype=torch.float64).repeat(1, k // gs)  # row i: local channel i of every group
            plan = paroquant.RotationPlan(tuple(m.cpu() for m in self._rotation.maps), False, self._rotation.perm)
            rows = paroquant.rotate(basis, plan, cos.double().cpu(), sin.double().cpu(), scales.cpu())
            self._matrices[dtype] = rows.reshape(gs, k // gs, gs).transpose(0, 1).to(torch.bfloat16).contiguous()
        return self._matrices[dtype]

    def rotate_input(self, x: torch.Tensor) -> torch.Tensor:
        """The transform as one batched matmul per forward (``group_matrices``), else the reference's rounds."""
        mats = self.group_matrices(x.dtype)
        if mats is None:
            return super().rotate_input(x)
        gs = self.scheme.group_size
        xg = x.reshape(-1, self.in_features // gs, gs).to(torch.bfloat16).transpose(0, 1)  # [G, M, gs]
        return torch.bmm(xg, mats).transpose(0, 1).reshape(x.shape).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "cpu")
        self.ensure_prepared()
        return super().forward(self.rotate_input(x))


KERNELS = (ParoCpuLinear,)
