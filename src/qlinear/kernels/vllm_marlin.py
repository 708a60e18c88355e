"""Marlin and Machete (GPTQ and AWQ) through vLLM's own compiled ops, when its op library is there.

The checkpoint buffers stay GPTQ / AWQ (``state_dict`` is always the checkpoint layout). ``prepare()`` decodes them
to the canonical form once, gathers act-order rows (``perm = argsort(g_idx)``: vLLM 0.33 then multiplies
``x[:, perm]``), and builds the runtime operands vLLM's kernels take: Marlin tiles from ``gptq_marlin_repack``
(every source is packed as GPTQ words first, so AWQ needs no separate repack), scales and zero points permuted by
``layouts.marlin``; or Machete's prepacked B with ``-s*z`` float zeros for asymmetric weights. Each layer keeps its
own Marlin workspace (int32 zeros the kernel resets after use), so layers on different streams never share one.

AUTO passes these over where qlinear's own Triton kernels were measured faster on the same machine class, and says
so with the numbers (``auto_reasons``); an explicit ``backend="gptq_marlin"`` / ``"gptq_machete"`` runs them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..affine import AffineWeight
from ..caps import Problem
from ..enums import FORMAT
from ..layouts import gptq
from ..layouts import marlin as marlin_layout
from ..target import Target
from . import vllm_ops
from .awq_base import AwqQuantLinear
from .gptq_base import GPTQQuantLinear
from .planned import marlin as declared

#: Where AUTO's preference for the Triton kernels comes from (H200, 4-bit g128, vLLM 0.33.0 in the same run).
EVIDENCE = ("measured slower than qlinear's Triton kernels on the H200 in 26 of 32 cells (4 shapes x M 1..4096, "
            "4-bit g128; benchmarks/results/h200-gpu_linear-2026-12-03-tail.md, docs/performance.md); Machete led "
            "by 1-12% only at M=128 and M>=1024 on 4096x14336 / 8192x28672: ask for it by name there")


def sorted_rows(q: AffineWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Codes ``[K, N]`` with act-order rows gathered (row k <- source row ``perm[k]``), and ``perm`` (or None)."""
    codes = q.codes.t()
    if not q.desc_act:
        return codes, None
    g_sorted, perm = marlin_layout.sort_g_idx(q.g_idx)
    if not torch.equal(g_sorted, torch.arange(q.in_features, dtype=torch.int32) // q.group_size):
        raise ValueError(f"g_idx: Marlin and Machete need every group to hold exactly {q.group_size} inputs "
                         "(a GPTQ act-order permutation); this g_idx does not")
    return codes[perm.long()], perm


def is_symmetric(q: AffineWeight) -> bool:
    """Are all zero points the midpoint ``2^(b-1)`` (what vLLM's ``uint{b}b{2^(b-1)}`` types assume)?"""
    return bool((q.zeros == (1 << (q.bits - 1))).all())


class _VllmKernel:
    """Shared lifecycle: runtime operands for one activation dtype, rebuilt when the checkpoint or dtype changes."""

    OPS: ClassVar[tuple[str, ...]] = ()
    _rt: dict[str, Any] | None = None

    @classmethod
    def vllm_reasons(cls, problem: Problem, target: Target) -> list[str]:
        out = []
        if problem.scheme.format is FORMAT.MARLIN:  # declared by the reference; our buffers are GPTQ / AWQ words
            out.append("takes GPTQ / AWQ buffers: a Marlin-format (B, s) module is re-encoded to gptq_v2 at load")
        if not all(d.kind.value == "cuda" for d in target.devices):
            return out  # the declaration already says CUDA only; do not probe CUDA libraries for a CPU target
        return out + vllm_ops.op_reasons(cls.OPS, target)

    @classmethod
    def auto_reasons(cls, problem: Problem, target: Target) -> list[str]:
        from .registry import kernel_by_name

        ours = kernel_by_name(cls.PREFERRED)
        on_h200_class = all(d.capability == (9, 0) for d in target.devices)
        if on_h200_class and not ours.reasons(problem, target):
            return [f"AUTO prefers {ours.backend.value} ({cls.PREFERRED}): {EVIDENCE}"]
        return []

    def prepare(self) -> None:  # type: ignore[override]
        self._rt = None
        super().prepare()  # type: ignore[misc]

    def _runtime(self, dtype: torch.dtype) -> dict[str, Any]:
        self.ensure_prepared()  # type: ignore[attr-defined]
        if self._rt is None or self._rt["dtype"] != dtype:
            q = self.affine()  # type: ignore[attr-defined]
            device = self.qweight.device  # type: ignore[attr-defined]
            codes, perm = sorted_rows(q)
            self._rt = {"dtype": dtype, "perm": None if perm is None else perm.to(device)}
            self._rt.update(self.build(q, gptq.pack_qweight(codes, q.bits).to(device), dtype, device))
        return self._rt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x, "cuda")  # type: ignore[attr-defined]
        k, n = self.in_features, self.out_features  # type: ignore[attr-defined]
        rt = self._runtime(x.dtype)
        x2 = x.reshape(-1, k)
        x2 = x2[:, rt["perm"]] if rt["perm"] is not None else x2.contiguous()
        y = self.run(x2, rt)
        if self.bias is not None:  # type: ignore[attr-defined]
            y = y + self.bias.to(y.dtype)  # type: ignore[attr-defined]
        return y.reshape(*x.shape[:-1], n)


class _Marlin(_VllmKernel):
    OPS = ("gptq_marlin_repack", "marlin_gemm")

    def build(self, q: AffineWeight, words: torch.Tensor, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        k, n, b = q.in_features, q.out_features, q.bits
        sym = is_symmetric(q)
        if self.ZERO_POINTS is False and not sym:
            raise ValueError(f"{type(self).__name__}: GPTQ Marlin runs symmetric weights only (zero points "
                             f"{1 << (b - 1)}); this weight has others: use backend='gptq_triton' or 'gptq_machete'")
        tiles = vllm_ops.call("gptq_marlin_repack", b_q_weight=words, size_k=k, size_n=n, num_bits=b,
                              is_a_8bit=False)
        scales = marlin_layout.permute_scales(q.scales.t().to(dtype)).to(device)
        zeros = None
        if self.ZERO_POINTS:
            zeros = marlin_layout.pack_zeros(q.zeros.t().contiguous(), b).to(device)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        cap = torch.cuda.get_device_capability(device)
        atomic = n < 2048 and k >= 2048 and (dtype != torch.bfloat16 or cap >= (9, 0))
        return {"tiles": tiles, "scales": scales, "zeros": zeros,
                "type": vllm_ops.scalar_type_id(b, 0 if self.ZERO_POINTS else 1 << (b - 1)),
                "workspace": torch.zeros(max(4 * sms, 128), dtype=torch.int32, device=device), "atomic": atomic}

    def run(self, x2: torch.Tensor, rt: dict[str, Any]) -> torch.Tensor:
        return vllm_ops.call("marlin_gemm", a=x2, b_q_weight=rt["tiles"], b_scales=rt["scales"],
                             b_zeros_or_none=rt["zeros"], workspace=rt["workspace"], b_type_id=rt["type"],
                             size_m=x2.shape[0], size_n=self.out_features, size_k=self.in_features,  # type: ignore
                             is_k_full=True, use_atomic_add=rt["atomic"], use_fp32_reduce=True, is_zp_float=False)


class _Machete(_VllmKernel):
    OPS = ("machete_prepack_B", "machete_mm")

    def build(self, q: AffineWeight, words: torch.Tensor, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        b = q.bits
        sym = is_symmetric(q)
        btype = vllm_ops.scalar_type_id(b, 1 << (b - 1) if sym else 0)
        packed = vllm_ops.call("machete_prepack_B", B=words.t().contiguous().t(), a_type=dtype, b_type=btype,
                               group_scales_type=dtype)
        scales = q.scales.t().contiguous()
        zeros = None if sym else (-(scales.float() * q.zeros.t().float())).to(dtype).to(device)
        return {"packed": packed, "scales": scales.to(dtype).to(device), "zeros": zeros, "type": btype,
                "group_size": q.group_size}

    def run(self, x2: torch.Tensor, rt: dict[str, Any]) -> torch.Tensor:
        return vllm_ops.call("machete_mm", A=x2, B=rt["packed"], b_type=rt["type"], group_scales=rt["scales"],
                             group_zeros=rt["zeros"], group_size=rt["group_size"])


class MarlinLinear(_Marlin, GPTQQuantLinear):
    """GPTQ (symmetric) through vLLM's Marlin: tiles from its repack, permuted scales, act-order by ``x[:, perm]``."""

    backend = declared.MarlinLinear.backend
    caps = declared.MarlinLinear.caps
    ZERO_POINTS: ClassVar[bool] = False
    PREFERRED: ClassVar[str] = "TritonV2Linear"

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return declared.marlin_tile_reasons(problem) + cls.vllm_reasons(problem, target)


class AwqMarlinLinear(_Marlin, AwqQuantLinear):
    """AWQ GEMM through vLLM's Marlin with zero points (``uint4``); vLLM 0.33 has no 8-bit zero-point kernel."""

    backend = declared.AwqMarlinLinear.backend
    caps = declared.AwqMarlinLinear.caps
    ZERO_POINTS: ClassVar[bool] = True
    PREFERRED: ClassVar[str] = "AwqGEMMTritonLinear"

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        out = declared.marlin_tile_reasons(problem)
        if problem.scheme.bits == 8:
            out.append("vLLM 0.33's Marlin has no kernel for 8-bit weights with zero points (its marlin_gemm "
                       "refuses them: benchmarks/results/marlin_golden_2026-12-04.md)")
        return out + cls.vllm_reasons(problem, target)


class MacheteLinear(_Machete, GPTQQuantLinear):
    """GPTQ through vLLM's Machete (Hopper): prepacked B, ``-s*z`` float zeros when asymmetric."""

    backend = declared.MacheteLinear.backend
    caps = declared.MacheteLinear.caps
    PREFERRED: ClassVar[str] = "TritonV2Linear"

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return cls.vllm_reasons(problem, target)


class AwqMacheteLinear(_Machete, AwqQuantLinear):
    """AWQ GEMM through vLLM's Machete (Hopper), zero points as ``-s*z``."""

    backend = declared.AwqMacheteLinear.backend
    caps = declared.AwqMacheteLinear.caps
    PREFERRED: ClassVar[str] = "AwqGEMMTritonLinear"

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        out = []
        if problem.scheme.group_size not in (problem.scheme.in_features, 64, 128):
            out.append(f"group size {problem.scheme.group_size}: vLLM 0.33's Machete runs group sizes 64, 128 and "
                       "channelwise only (it refuses 32 on the H200: 'cannot be run with these arguments')")
        return out + cls.vllm_reasons(problem, target)


KERNELS = (MarlinLinear, AwqMarlinLinear, MacheteLinear, AwqMacheteLinear)
