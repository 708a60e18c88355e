"""``BitsAndBytesTritonLinear``: bitsandbytes NF4 / FP4 weights through qlinear's Triton LUT4 kernels on CUDA.

The runtime tensors are the checkpoint's own bytes viewed as int32 words and the float32 block absmax
(``kernels/triton/lut4.py``); the 16-entry table is looked up in registers with byte permutes (``prmt``).
On the H200 (``benchmarks/results/h200-gpu_bnb-2026-12-04.md``) it was faster than bitsandbytes' CUDA kernel at
every M >= 2 and at M=1 on three of four shapes, but slower than dense bf16 above M=16, and the final GEMV
configuration was not re-checked there before the session's device time ran out: so AUTO does not pick it yet
(priority 0) and ``backend="bitsandbytes_triton"`` runs it.
"""

from __future__ import annotations

import torch

from ..caps import Caps, Problem, archs_from
from ..enums import BACKEND, DEVICE, FORMAT
from ..target import Target
from .bnb_base import BnbQuantLinear
from .torch_bnb import PACK_DTYPES


def lut4_reasons(problem: Problem) -> list[str]:
    """The kernels' shape rule (whole int32 words per absmax block), said without importing triton."""
    s = problem.scheme
    b = s.blocksize
    if b is None or b < 32 or b & (b - 1):
        return [f"absmax blocksize {b}: the LUT4 kernels need a power of two >= 32"]
    if s.in_features % b:
        return [f"in_features {s.in_features} is not a multiple of the absmax blocksize {b} (blocks would "
                "straddle rows)"]
    return []


class BitsAndBytesTritonLinear(BnbQuantLinear):
    """bitsandbytes NF4 / FP4 (any power-of-two blocksize >= 32, double-quantized or not) on CUDA via Triton."""

    backend = BACKEND.BITSANDBYTES_TRITON
    caps = Caps(formats={FORMAT.BITSANDBYTES: 0}, bits=frozenset({4}), group_sizes=None, desc_act=None, sym=None,
                devices=frozenset({DEVICE.CUDA}), dtypes=frozenset({torch.float16, torch.bfloat16}),
                pack_dtypes=PACK_DTYPES, gpu_archs=archs_from((8, 0)), requires_modules={"triton": "triton>=3.4"})

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return lut4_reasons(problem)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        return ("M=1: split-K GEMV on CUDA cores; M=2..16: skinny tl.dot; M=17..128: tiled tl.dot; larger M: "
                "rows decoded by a Triton kernel in chunks and multiplied by cuBLAS (the chunk is freed at once)")

    def prepare(self) -> None:
        super().prepare()
        self._rt = None

    def _runtime(self) -> object:
        from .triton import lut4

        if self._rt is None:
            n, k, bs = self.out_features, self.in_features, self.scheme.blocksize
            self._rt = lut4.prepare_lut4(self.weight.view(n, k // 2), self._absmax.view(n, k // bs), bs)
        return self._rt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from .triton import lut4
        from .triton.runtime import interpreting

        self.check_input(x, None if interpreting() else "cuda")
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features).contiguous()
        bias = None if self.bias is None else self.bias.to(x.dtype)
        y = lut4.lut4_linear(x2, self._runtime(), self._table, bias)
        return y.reshape(*x.shape[:-1], self.out_features)


KERNELS = (BitsAndBytesTritonLinear,)
