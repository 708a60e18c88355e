"""The GPTQ Triton variants for layouts with an additive offset per group (``w = s q + o``), shared by every format
whose runtime has one: GGUF's Q4_K two-level form and float32 Q4_0/Q4_1 form (``gguf_triton.py``) and MLX's
scales and biases (``mlx_triton.py``).

Why a table of its own: the GPTQ table's mid-M choices (gemm4, gemm3, skinny, gemm) cannot add an offset, so above
``OFFSET_TABLE_M`` such layouts take ``OFFSET_CROSSOVERS``, measured for them, and ``explain`` says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .triton_gptq import fitted_config, unfit_variants

#: Above this M, layouts with offsets take ``OFFSET_CROSSOVERS`` instead of the GPTQ table: the largest M each
#: variant serves, dense (dequantize + cuBLAS) above. Measured on an H100 (benchmarks/gguf_crossover.py,
#: results/h100-gguf_crossover-2026-12-06.md, Q4_K): at M=16 gemv_tc 43.2 / 51.4 us against skinny2 49.5 / 52.1 on
#: 4096x14336 / 14336x4096; at 32 skinny2 84.7 / 91.6 against gemm2 107.9 / 91.0; at 64 gemm2 107.6 / 91.6 against
#: dense 98.5 / 101.3; at 128 dense 102.5 / 108.5 against gemm2 123.7 / 181.9, and dense beyond.
#: gemm5 takes groups of 32 with offsets since 2026-12-06 (x in fragment order, ``triton/fragment.py``), and groups
#: of 64 / 128 (MLX) since 2026-12-07, and comes first where it fits (sm_90, 16-bit activations, 4-bit words): MLX
#: 4-bit on an H100 (results/h100-gpu_mlx-2026-12-07-gemm5.md) M=16..1024 at 0.4-0.8x of the next choice (M=256 g64:
#: 45.4 us against dense's 106.6), M=4096 even with dense (752 / 737 us), so dense above 1024. The rest are the
#: order where it does not fit. Each variant is skipped where it cannot run the layer.
OFFSET_TABLE_M = 8
OFFSET_CROSSOVERS = {"gemm5": 1024, "gemv_tc": 16, "skinny2": 32, "gemm2": 64}
#: GPTQ variants without an additive per-group offset
NO_OFFSETS = ("skinny", "skinny3", "gemm", "gemm4", "gemm3")


def offsets_config(p: Any, m: int, dtype: torch.dtype, device: torch.device, variant: str | None = None) -> Any:
    """The GPTQ kernels' config for M rows of layout ``p``; with offsets, among the variants that add them (one
    group a step for skinny2 / gemm2: ``[1, BN]`` scale and offset rows, not ``[BK, BN]`` tiles through shared
    memory)."""
    from .triton.configs import legal

    skip = NO_OFFSETS if p.offsets is not None else ()
    if variant in skip:  # asked for by name: the same role among the variants with offsets
        variant = "skinny2" if m <= 16 else "gemm2"
    if p.offsets is not None and variant is None and m > OFFSET_TABLE_M:
        unfit = unfit_variants(p, m, dtype, device)
        variant = next((v for v, top in OFFSET_CROSSOVERS.items() if m <= top and v not in unfit), "dense")
    cfg = fitted_config(p, m, dtype, device, variant, exclude=skip)
    if p.offsets is not None and cfg.variant in ("skinny2", "gemm2"):
        cfg = legal(replace(cfg, block_k=32), m, p.kp, p.bits)
    return cfg


def explain_offsets(p: Any, m: int, dtype: torch.dtype, device: torch.device, what: str) -> list[str]:
    """The lines of ``explain_call`` for layout ``p`` at M rows: the variant, on what evidence, and why each other
    one does not run (``what`` names the offsets in the reasons: "GGUF minimums", "MLX biases")."""
    from .triton.configs import VARIANTS
    from .triton.why import explain_choice
    from .triton_gptq import device_facts

    unfit = unfit_variants(p, m, dtype, device)
    if p.offsets is not None:
        unfit |= {v: f"adds no per-group offset ({what})" for v in NO_OFFSETS if v not in unfit}
    name, sms = device_facts(device.index or 0) if device.type == "cuda" else ("interpreter", 4)
    cfg = offsets_config(p, m, dtype, device)
    if p.offsets is not None and m > OFFSET_TABLE_M:  # the offset crossovers, not the GPTQ table
        tiles = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}, split-K {cfg.split_k}, {cfg.num_warps} warps"
        why = [f"  {v}: {unfit.get(v) or 'not what the offset crossovers give this M'}"
               for v in VARIANTS if v != cfg.variant]
        lines = [f"M={m}: {cfg.variant} — crossovers for layouts with offsets above M={OFFSET_TABLE_M} "
                 f"({OFFSET_CROSSOVERS}, dense above; affine_offsets.OFFSET_CROSSOVERS): {tiles}", *why]
    else:
        lines = explain_choice(name, sms, m, p.n, p.k, p.kp, p.bits, p.group, unfit)
    if p.offsets is not None and cfg.variant in ("skinny2", "gemm2"):
        lines.append(f"  ({cfg.variant} runs block_k {cfg.block_k}: one group's offsets a step)")
    return lines


def offsets_matmul(x2: torch.Tensor, p: Any, cfg: Any, bias: torch.Tensor | None, lock: torch.Tensor) -> torch.Tensor:
    """``x2 @ W^T + bias`` of layout ``p`` with the config ``offsets_config`` gave (dense: a transient weight)."""
    from .triton.dequant import dense_mm
    from .triton.qmm import qmm

    if cfg.variant == "dense":
        return dense_mm(x2, p, cfg, bias)
    return qmm(x2, p, cfg, bias, lock)
