"""``MlxTritonLinear``: MLX affine weights (mlx-lm checkpoints) on CUDA through the GPTQ Triton kernels.

``MlxTorchLinear`` decodes every weight in every forward. MLX's weight is ``w = s q + b`` per group, which is the
GPTQ kernels' form with an additive offset per group (``affine_offsets``: GGUF's Q4_0/Q4_1/Q4_K run the same
variants): ``prepare()`` re-lays the codes into field-blocked words (1 and 2-bit codes in 2-bit words, 3 and 4-bit in
4-bit, 5, 6 and 8-bit in 8-bit: the codes unchanged, zero 0) with the scales and biases in their own dtype as the
scales and offsets, and drops the file's ``weight``, which is rebuilt from the words, bit for bit, when read or
saved (``resident_codes.py``). The arithmetic is the GPTQ kernels' (float32 sums of ``s (sum q x) + b (sum x)``),
not MLX's per-weight rounding in the scales' dtype, so float32 activations stay on ``MlxTorchLinear``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..caps import Caps, Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import mlx
from ..target import Target
from .affine_offsets import explain_offsets, offsets_config, offsets_matmul
from .mlx_torch import MlxTorchLinear
from .resident_codes import CodesInRuntime, DeviceMovesOnly
from .triton_gptq import triton_rows, triton_version_reasons

#: MLX width -> the GPTQ kernels' word width that holds it
KERNEL_BITS = {1: 2, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 8: 8}
RUNTIME = ("_rt_qweight", "_rt_scales", "_rt_offsets", "_rt_xorder")


class MlxTritonLinear(DeviceMovesOnly, CodesInRuntime, MlxTorchLinear):
    """MLX affine weights (1-6 and 8 bits, groups 32/64/128) on CUDA: the GPTQ Triton kernels with an offset per
    group."""

    backend = BACKEND.MLX_TRITON
    caps = Caps(formats={FORMAT.MLX: 70}, bits=frozenset(mlx.BITS), group_sizes=frozenset(mlx.GROUP_SIZES),
                desc_act=frozenset({False}), sym=None, devices=frozenset({DEVICE.CUDA}),
                dtypes=frozenset({torch.float16, torch.bfloat16}),  # float32 stays on MlxTorchLinear
                pack_dtypes=frozenset({torch.int32}), in_divisible=32, requires_modules={"triton": "triton>=3.4"})
    codes_buffer = "weight"

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return triton_version_reasons(target)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        s = problem.scheme
        return (f"{mlx.describe(s)}: re-laid at load as {KERNEL_BITS.get(s.bits, s.bits)}-bit GPTQ words with the "
                "scales and biases as scales and offsets per group (weight rebuilt bit for bit on save); the GPTQ "
                "Triton variants that add offsets, by M (gemv_tc / gemv, gemm5 on sm_90, skinny2, gemm2, dequantize + "
                "cuBLAS)")

    def register_checkpoint_buffers(self, bias: bool) -> None:
        super().register_checkpoint_buffers(bias)
        for name in (*RUNTIME, "_rt_lock"):
            self.register_buffer(name, None, persistent=False)
        self._rt_meta: tuple[int, ...] | None = None

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("weight", "scales", "biases", "bias")

    def checkpoint_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {name: (shape, dtypes[0]) for name, (shape, dtypes) in mlx.checkpoint_shapes(self.scheme).items()}

    # ------------------------------------------------------------------ checkpoint <-> runtime
    def packed(self) -> Any:
        """The GPTQ kernels' layout of this layer (views of its buffers)."""
        from .triton.layout import Packed

        return Packed(self._rt_qweight, self._rt_scales, None, None, *self._rt_meta, offsets=self._rt_offsets,
                      xorder=self._rt_xorder)

    def runtime_can_rebuild(self) -> bool:
        return self._rt_meta is not None

    def rebuilt_words(self) -> torch.Tensor:
        from .triton.layout import unpack_words

        p = self.packed()
        codes = unpack_words(p.qweight, p.bits, p.rows_per_block)[:p.k, :p.n].t()
        return mlx.pack(codes.contiguous(), self.scheme.bits)

    def runtime_anchor(self) -> torch.Tensor:
        return self._rt_qweight

    def drop_runtime(self) -> None:
        for name in RUNTIME:
            setattr(self, name, None)
        self._rt_meta = None

    def prepare(self) -> None:
        """Check the scales and biases, build the words from the file's (read back from the current words when
        those were dropped before) and drop them."""
        from .triton.layout import build_affine
        from .triton.qmm import lock_slots

        super().prepare()
        s = self.scheme
        codes = mlx.unpack(self.weight, s.bits, s.in_features)
        p = build_affine(codes, self.scales, self.biases, KERNEL_BITS[s.bits], s.group_size,
                         param_dtype=self.scales.dtype)
        self.keep_words_unless(True)
        for name, t in zip(RUNTIME, (p.qweight, p.scales, p.offsets, p.xorder)):
            setattr(self, name, t)
        self._rt_meta = p.meta()
        self._rt_lock = torch.zeros(lock_slots(self.out_features), dtype=torch.int32, device=self.scales.device)
        self.drop_codes_buffer()

    # ------------------------------------------------------------------ forward
    def config(self, m: int, device: torch.device, variant: str | None = None) -> Any:
        """The launch config for M rows of the prepared layer (``affine_offsets.offsets_config``)."""
        return offsets_config(self.packed(), m, self.dtype, device, variant)

    def explain_call(self, m: int, device: torch.device | str = "cuda") -> str:
        """Which variant a forward of M rows runs on ``device``, on what evidence, and why each other does not
        (``cpu``: the interpreter's view, without the device's table)."""
        self.ensure_prepared()
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("explain_call: no CUDA device here; device='cpu' gives the interpreter's view")
        p = self.packed()
        head = (f"MLX {self.scheme.bits}-bit g{self.scheme.group_size} on the GPTQ kernels ({p.bits}-bit words, "
                f"{self._rt_scales.dtype} scales and biases as offsets per group)")
        return "\n".join([head, *explain_offsets(p, m, self.dtype, device, "MLX biases")])

    def matmul(self, x2: torch.Tensor, variant: str | None = None, config: Any = None) -> torch.Tensor:
        """``x2 [M, K] @ W^T + bias`` with the chosen (or given) variant / config."""
        cfg = config or self.config(x2.shape[0], x2.device, variant)
        return offsets_matmul(x2, self.packed(), cfg, self.bias, self._rt_lock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return self.matmul(triton_rows(self, x, lambda: self._rt_qweight)).reshape(*x.shape[:-1], self.out_features)


KERNELS = (MlxTritonLinear,)
