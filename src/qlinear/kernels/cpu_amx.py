"""int4pack weights times bfloat16 activations on AMX tiles, through the optional native extra.

``qlinear_native._amx`` (``pip install ./native``) decodes the int4pack CPU bytes straight into AMX's B
operand, once per call, and multiplies with TDPBF16PS (its header comment has the details). Two variants:

* ``int4_mm_codes`` (op group a multiple of 32): exact codes in the tiles, each group's float32 product
  scaled after; the decode is cheapest, the per-group scaling grows with M: the choice from ``MIN_M``
  (below it the int4pack op, where it runs the layer) up to ``CODES_MAX_M`` rows.
* ``int4_mm_weights`` (any even group): the tiles hold the weight rounded to bfloat16 once, decoded in
  chunks of ``CHUNK`` (channels, K rows) and reused by every 16-row block: the choice for large M.

Both read the int4pack op's own tensors (its packed bytes in the 64-channel block layout and its
``[K/group, N, 2]`` scales and zero offsets), so a layer keeps no extra copy for them.
"""

from __future__ import annotations

from typing import Any

import torch

#: Largest M for ``int4_mm_codes``; above it ``int4_mm_weights``. Measured by
#: ``python benchmarks/cpu_linear.py --crossover --reps 7`` (2026-12-02, one thread, this repo's AMX CPU,
#: torch 2.13; results/cpu_crossover-amx-2026-12-02.md), g128, codes vs weights ms: M=64 2.61 vs 3.08
#: (4096x4096), 9.37 vs 10.3 (4096x14336); M=128 4.73 vs 4.39, 18.3 vs 17.2.
CODES_MAX_M = 64
#: Below this M the int4pack op, where it runs the layer, beats both AMX kernels (the tiles have 16 rows
#: whatever M): same run, M=1 op 0.91 vs codes 0.96 ms (4096x4096), 2.93 vs 3.30 (4096x14336); at M=2 the
#: codes kernel wins (0.95 vs 1.16, 3.25 vs 4.01) and keeps winning at every larger M.
MIN_M = 2
#: ``int4_mm_weights`` chunk: output channels x K rows decoded at once (128 KiB of bfloat16, in L2).
#: Measured on 4096x14336, M=256: 256x256 28.6 ms; 64x256 32.8; 128x256 31.0; 64x4096 36.4.
CHUNK = (256, 256)
BF16 = torch.bfloat16


def native_amx() -> Any:
    """The ``qlinear_native._amx`` module when it is installed and this CPU and kernel grant AMX-BF16 tiles,
    else None (the int4pack op and the decode path run instead)."""
    global _AMX
    if _AMX is None:
        try:
            from qlinear_native import _amx
        except ImportError:
            _AMX = False
        else:
            _AMX = _amx if _amx.available() else False
    return _AMX or None


_AMX: Any = None


def runs(block: int, k_pad: int) -> bool:
    """Can the AMX kernels read this weight: the AVX512 op layout (64-channel blocks), K a multiple of 32?"""
    return block == 64 and k_pad % 32 == 0 and native_amx() is not None


def uses_codes(m: int, group: int) -> bool:
    """``int4_mm_codes`` for ``m`` rows (else ``int4_mm_weights``)."""
    return group % 32 == 0 and m <= CODES_MAX_M


def matmul(xb: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int) -> torch.Tensor:
    """``xb [M, K_pad]`` bfloat16 times the int4pack weight (``packed`` ``[N_pad/64, K_pad, 32]`` bytes or the
    op's ``[N_pad, K_pad/2]``, ``scales_zeros [K_pad/group, N_pad, 2]`` bfloat16) -> ``[M, N_pad]`` bfloat16."""
    amx = native_amx()
    if amx is None:
        raise RuntimeError("cpu_amx.matmul: the native AMX extra is not available (pip install ./native on an "
                           "AMX-BF16 CPU)")
    xb = xb.contiguous()
    m, k = xb.shape
    n = scales_zeros.shape[1]
    if xb.dtype != BF16 or packed.numel() * 2 != k * n or scales_zeros.shape != (k // group, n, 2):
        raise ValueError(f"cpu_amx.matmul: expected bfloat16 x [M, K], {k * n // 2} packed bytes and scales_zeros "
                         f"[{k // group}, {n}, 2]; got x {xb.dtype} {tuple(xb.shape)}, {packed.numel()} bytes, "
                         f"scales_zeros {tuple(scales_zeros.shape)}")
    sz = scales_zeros.contiguous()
    out = torch.empty(m, n, dtype=BF16)
    args = (xb.data_ptr(), packed.data_ptr(), sz.data_ptr(), out.data_ptr(), m, k, n, group, k, n)
    if uses_codes(m, group):
        amx.int4_mm_codes(*args)
    else:
        amx.int4_mm_weights(*args, *CHUNK)
    return out
