"""Tiled CUDA GEMMs: Marlin, Machete and Swordfish (GPTQ and AWQ adapters), declared from the reference's tables and
family sections. Pure class definitions."""

from __future__ import annotations

import torch

from ...caps import Caps, Problem, archs_from
from ...enums import BACKEND, DEVICE, FORMAT, PLATFORM
from ...target import Target
from ..base import PlannedKernel

F16, BF16 = torch.float16, torch.bfloat16
BOTH = frozenset({False, True})
CUDA = frozenset({DEVICE.CUDA})
GROUPS = frozenset({-1, 32, 64, 128})


def marlin_tile_reasons(problem: Problem) -> list[str]:
    """Marlin's repack works on 16 x 64 (K x N) tiles; the runtime validates this even where padding is declared."""
    s, out = problem.scheme, []
    if s.in_features % 16:
        out.append(f"in_features {s.in_features} not divisible by Marlin's tile_k 16")
    if s.out_features % 64:
        out.append(f"out_features {s.out_features} not divisible by Marlin's tile_n 64")
    return out


class MarlinLinear(PlannedKernel):
    """GPTQ repacked to Marlin tiles with permuted scales and activation-order metadata."""

    backend = BACKEND.GPTQ_MARLIN
    caps = Caps(
        formats={FORMAT.GPTQ: 90, FORMAT.GPTQ_V2: 90, FORMAT.MARLIN: 90},
        bits=frozenset({4, 8}),
        group_sizes=GROUPS,
        desc_act=BOTH,
        sym=frozenset({True}),
        training=False,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=1,
        out_divisible=1,
        auto_padding=False,
        sharded_load=True,
        devices=CUDA,
        gpu_archs=archs_from((7, 5)),
    )

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return marlin_tile_reasons(problem)


class AwqMarlinLinear(MarlinLinear):
    """AWQ GEMM (or serialized Marlin) repacked to Marlin tiles with scale/zero permutations."""

    backend = BACKEND.AWQ_MARLIN
    caps = MarlinLinear.caps.but(
        formats={FORMAT.GEMM: 90, FORMAT.MARLIN: 90},
        sym=BOTH,
        gpu_archs=archs_from((8, 0)),
    )


class MacheteLinear(PlannedKernel):
    """GPTQ prepacked to Machete's CUTLASS B layout (Hopper sm_90 only)."""

    backend = BACKEND.GPTQ_MACHETE
    caps = Caps(
        formats={FORMAT.GPTQ: 100},
        bits=frozenset({4, 8}),
        group_sizes=frozenset({-1, 64, 128}),
        desc_act=BOTH,
        sym=BOTH,
        training=False,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=64,
        out_divisible=128,
        auto_padding=False,
        sharded_load=True,
        devices=CUDA,
        # Exactly capability 9.0 (sm_90a build, >= 204800 B opt-in shared memory, which every sm_90 part has).
        gpu_archs=frozenset({(9, 0)}),
    )


class AwqMacheteLinear(PlannedKernel):
    """AWQ GEMM or Marlin checkpoints prepacked to Machete's CUTLASS B layout (Hopper sm_90 only)."""

    backend = BACKEND.AWQ_MACHETE
    caps = MacheteLinear.caps.but(
        formats={FORMAT.GEMM: 100, FORMAT.MARLIN: 100},
        group_sizes=GROUPS,
        desc_act=frozenset({False}),
    )


def swordfish_reasons(problem: Problem) -> list[str]:
    """Swordfish checks its stable-ABI torch floor and its weight quant types (zero-point INT8 has none)."""
    out = []
    try:
        ok = torch.torch_version.TorchVersion(torch.__version__) >= (2, 10)
    except Exception:  # an unparseable version fails validation, as in the reference
        ok = False
    if not ok:
        out.append(f"torch {torch.__version__} is older than the stable ABI target 2.10 (or unparseable)")
    if problem.scheme.bits == 8 and not problem.scheme.sym:
        out.append("8-bit with zero points has no Swordfish quant type (uint8b128 is symmetric only)")
    return out


class SwordfishLinear(PlannedKernel):
    """GPTQ prepacked to Swordfish's (64, 64) blocks for the Blackwell GEMM (Linux, no sharded load)."""

    backend = BACKEND.GPTQ_SWORDFISH
    caps = Caps(
        formats={FORMAT.GPTQ: 101},
        bits=frozenset({4, 8}),
        group_sizes=GROUPS,
        desc_act=BOTH,
        sym=BOTH,
        training=False,
        dtypes=frozenset({F16, BF16}),
        pack_dtypes=frozenset({torch.int32}),
        in_divisible=64,
        out_divisible=64,
        auto_padding=False,
        sharded_load=False,
        devices=CUDA,
        platforms=frozenset({PLATFORM.LINUX}),
        gpu_archs=frozenset({(10, 0), (10, 3), (11, 0)}),
    )

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return swordfish_reasons(problem)


class AwqSwordfishLinear(SwordfishLinear):
    """AWQ GEMM prepacked to Swordfish's (64, 64) blocks for the Blackwell GEMM (Linux, no sharded load)."""

    backend = BACKEND.AWQ_SWORDFISH
    caps = SwordfishLinear.caps.but(
        formats={FORMAT.GEMM: 101},
        bits=frozenset({4}),
        desc_act=frozenset({False}),
    )
