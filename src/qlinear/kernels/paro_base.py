"""Checkpoint buffers of a ParoQuant module: AWQ GEMM codes plus the input rotation (``layouts/paroquant.py``).

The layer's scheme is the ParoQuant one (method and format ``paroquant``), so the AWQ helpers that read the
scheme's format are answered here for the GEMM words the codes are. ``prepare()`` validates the rotation and
builds its gather maps; ``rotate_input`` applies it with the reference's roundings in the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..affine import AffineWeight
from ..caps import Problem
from ..enums import FORMAT
from ..layouts import awq, paroquant
from ..layouts.bitpack import unpack_bits
from ..spec import Scheme
from ..target import Target
from .awq_base import AwqQuantLinear
from .base import adopt_dtypes

ROTATION = ("theta", "pairs", "channel_scales")


@dataclass(frozen=True)
class RotationOperands:
    """A prepared transform for one input dtype and device: the plan, ``cos``/``sin [krot, K/2]`` and
    ``scales [K]`` in that dtype, and the group-local gather maps (``paroquant.group_maps``, the Triton kernel's)."""

    plan: paroquant.RotationPlan
    cos: torch.Tensor
    sin: torch.Tensor
    scales: torch.Tensor
    group_maps: torch.Tensor


def shape_reasons(scheme: Scheme) -> list[str]:
    """Why a ParoQuant layer of this shape has no encoding (empty when it has one)."""
    out = []
    if scheme.out_features % 8:
        out.append(f"out_features {scheme.out_features} not a multiple of 8 (4-bit AWQ GEMM words hold 8 columns)")
    gs, k = scheme.group_size, scheme.in_features
    if k % gs or gs % 2:
        out.append(f"group size {gs} must be even and divide in_features {k} (rotations pair channels in a group)")
    return out


class ParoQuantBase(AwqQuantLinear):
    """AWQ GEMM ``qweight``/``qzeros``/``scales`` plus ``theta``/``pairs``/``channel_scales`` as stored."""

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return shape_reasons(problem.scheme) + cls.runtime_target_reasons(target)

    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16) -> None:
        self._awq = paroquant.awq_scheme(scheme)
        self._rotation: paroquant.RotationPlan | None = None
        self._operands: dict[tuple[torch.dtype, torch.device], RotationOperands] = {}
        super().__init__(scheme, bias=bias, dtype=dtype)

    @property
    def krot(self) -> int:
        return paroquant.params_of(self.scheme).krot

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtype) in awq.checkpoint_shapes(self._awq).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        for name, t in paroquant.identity_rotation(self.scheme).items():
            self.register_buffer(name, t)
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float16) if bias else None)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # keep the stored dtypes (bfloat16 scales, float32 angles) instead of rounding them into float16
        adopt_dtypes(self, state_dict, prefix, ("scales", "bias"), awq.SCALE_DTYPES)
        adopt_dtypes(self, state_dict, prefix, ("theta", "channel_scales"), paroquant.ROTATION_DTYPES)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @property
    def zeros_buffer(self) -> torch.Tensor:
        return self.qzeros

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        """Encode the codes (the rotation is set apart, ``load_rotation``; a fresh layer holds the identity)."""
        self.check_fits(q)
        self.write_checkpoint(awq.to_checkpoint(q, FORMAT.GEMM, scale_dtype=self.scales.dtype), bias)

    def load_rotation(self, pairs: torch.Tensor, theta: torch.Tensor, channel_scales: torch.Tensor) -> None:
        """Set the input transform (validated; ``theta``/``channel_scales`` keep their float dtype)."""
        scales = channel_scales.reshape(1, -1) if channel_scales.dim() == 1 else channel_scales
        paroquant.check_rotation(pairs, theta, scales, self.scheme.group_size)
        want = paroquant.rotation_shapes(self.scheme)
        for name, t in (("pairs", pairs), ("theta", theta), ("channel_scales", scales)):
            if tuple(t.shape) != want[name][0]:
                raise paroquant.RotationError(f"{name}: expected shape {list(want[name][0])} for this layer "
                                              f"(krot={self.krot}), got {list(t.shape)}")
        dev = self.qweight.device
        self.pairs = pairs.detach().to(dev, torch.int16).contiguous()
        self.theta = theta.detach().to(dev).contiguous()
        self.channel_scales = scales.detach().to(dev).contiguous()
        self._runtime_key = None

    def affine(self) -> AffineWeight:
        names = awq.checkpoint_shapes(self._awq)
        return awq.from_checkpoint({n: getattr(self, n).cpu() for n in names}, self._awq)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [self.qweight, self.qzeros, self.scales, self.bias, self.pairs, self.theta, self.channel_scales]

    def prepare(self) -> None:
        self._rotation = paroquant.plan_rotation(self.pairs, self.theta, self.channel_scales, self.scheme.group_size)
        self._operands = {}
        super().prepare()

    def rotation_operands(self, dtype: torch.dtype, device: torch.device) -> RotationOperands:
        """The transform's operands for inputs of ``dtype`` on ``device`` (built once per pair; call after
        ``ensure_prepared``)."""
        assert self._rotation is not None
        key = (dtype, device)
        if key not in self._operands:
            plan = self._rotation
            cos, sin = paroquant.cos_sin(self.theta, dtype)
            self._operands[key] = RotationOperands(
                paroquant.RotationPlan(tuple(m.to(device) for m in plan.maps), plan.identity, plan.perm.to(device)),
                cos.to(device).contiguous(), sin.to(device).contiguous(),
                self.channel_scales.to(device=device, dtype=dtype).reshape(-1).contiguous(),
                paroquant.group_maps(plan.perm.to(device), self.scheme.group_size))
        return self._operands[key]

    def rotate_input(self, x: torch.Tensor) -> torch.Tensor:
        """The producer's input transform of ``x``, in torch (call after ``ensure_prepared``)."""
        ops = self.rotation_operands(x.dtype, x.device)
        return paroquant.rotate(x, ops.plan, ops.cos, ops.sin, ops.scales)

    # ------------------------------------------------------------------ AWQ GEMM decode (the scheme says paroquant)
    @property
    def code_block(self) -> int:
        return 1

    def slot_columns(self) -> torch.Tensor | None:
        return awq.gemm_slot_columns(self.out_features, 4).to(self.qweight.device)

    def codes_rows(self, k0: int, k1: int, slot_order: bool = False) -> torch.Tensor:
        if slot_order:
            return unpack_bits(self.qweight[k0:k1], 4, self.out_features, dim=1, name="qweight")
        return awq.unpack_gemm(self.qweight[k0:k1], 4, self.out_features)

    def group_scales(self) -> torch.Tensor:
        return self.scales.float()

    def true_zeros(self) -> torch.Tensor:
        return awq.unpack_gemm(self.qzeros, 4, self.out_features, "qzeros").float()
