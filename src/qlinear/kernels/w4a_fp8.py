"""W4AFP8Linear: GPTQ int4 weights with a runtime E4M3 activation operand, on FP8 tensor cores (sm_89 and later).

Declared exactly as the reference's W4AFP8Linear (``planned.float_formats``: explicit or activation-policy
selection only, GPTQ/GPTQ v2 4-bit g128, symmetric, no act-order, int32 words, K % 128, N % 32). It changes the
layer's numbers (activations become E4M3 per token: W4A8), which is why AUTO never picks it; a checkpoint whose
scheme already says so (compressed-tensors' W4AFP8 preset) is realised exactly. The codes stay packed: the
kernel unpacks and converts each tile in registers (``triton/w4afp8.py``), where the reference keeps a full
E4M3 copy of the weight.
"""

from __future__ import annotations

import torch

from ..activations import ActQuant, ActScales, ActStrategy
from ..caps import Problem
from ..floats import Element
from ..target import Target
from .gptq_base import GPTQQuantLinear
from .planned.float_formats import W4AFP8Linear as _Declared


class W4AFP8Linear(GPTQQuantLinear):
    """GPTQ INT4 weights times per-token E4M3 activations (group-wise FP8 GEMM)."""

    backend = _Declared.backend
    caps = _Declared.caps
    raw_packing = True

    @classmethod
    def realises(cls, act: ActQuant) -> bool:
        return (act.element is Element.E4M3 and act.strategy is ActStrategy.TOKEN
                and act.scales is ActScales.DYNAMIC)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        act = problem.scheme.activations
        if act is not None and not cls.realises(act):
            return [f"the checkpoint quantizes activations as {act.describe()}; this kernel makes them E4M3 "
                    "per token"]
        return []

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        if problem.scheme.activations is None:
            return ("W4A8: activations quantized to E4M3 per token before an FP8 tensor-core product (the layer's "
                    "numbers change: explicit selection only)")
        return "the checkpoint's E4M3 per-token activations, multiplied on FP8 tensor cores"

    def prepare(self) -> None:
        """Check the codes are what the kernel assumes (symmetric: every true zero 8; groups in order)."""
        zeros = self.true_zeros()
        if not bool((zeros == 8).all()):
            bad = (zeros != 8).nonzero()[0].tolist()
            raise ValueError(f"qzeros: W4AFP8Linear takes symmetric weights (true zero 8); found "
                             f"{int(zeros[bad[0], bad[1]])} at (group {bad[0]}, out column {bad[1]})")
        plain = torch.arange(self.in_features, device=self.g_idx.device, dtype=torch.int32) // 128
        if not torch.equal(self.g_idx.to(torch.int32), plain):
            raise ValueError("g_idx: W4AFP8Linear takes groups in order (k // 128); this one is act-order")
        super().prepare()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .triton.w4afp8 import w4afp8_linear

        self.check_input(x, "cuda")
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        y = w4afp8_linear(x2, self.qweight, self.scales, bias)
        return y.reshape(*x.shape[:-1], self.out_features)


KERNELS = (W4AFP8Linear,)
