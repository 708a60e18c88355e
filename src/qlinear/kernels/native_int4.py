"""int4pack weights times bfloat16 activations in qlinear's native extra (``pip install ./native``).

``qlinear_native._int4`` reads the int4pack op's own tensors (its packed bytes in the 64-channel block
layout and its ``[K/group, N, 2]`` scales and zero offsets), so a layer keeps no extra copy for them, and
decodes the weight once per call (layout and arithmetic: the C sources' header comments), the output
channels split over ``torch.get_num_threads()`` threads. Four kernels:

* ``int4_mv`` (AVX512-BF16 + VBMI, group a multiple of 16): dot products on exact bfloat16 codes, two rows
  at a time; the choice up to ``MV_MAX_M`` rows.
* ``int4_mm_codes`` (AMX-BF16, group a multiple of 32): exact codes in the tiles, each group's float32
  product scaled after; cheapest decode, per-group scaling that grows with M: up to ``CODES_MAX_M`` rows
  (by group size).
* ``int4_mm_weights`` (AMX-BF16, any even group): the tiles hold the weight rounded to bfloat16 once,
  decoded in chunks of ``CHUNK`` (channels, K rows) and reused by every 16-row block: large M.
* ``int4_mm_dp`` (AVX512-BF16, no AMX, any even group): the same decoded weight for CPUs without AMX (Zen 4, and
  Cooper Lake, which lacks VBMI: there it decodes with AVX512-BW unpacks instead of VPERMI2B, same bytes), used by
  blocks of 6 rows x 64 channels of VDPBF16PS dot products. On such CPUs ``int4_mv`` (where VBMI is) runs up to
  ``MV_MAX_M_WITHOUT_AMX`` rows, the callers' int4pack op up to ``OP_MAX_M_WITHOUT_AMX`` (faster there than
  both), ``int4_mm_dp`` above.

``set_amx_allowed(False)`` makes this module route as on a CPU without AMX (a hook for tests and
``benchmarks/cpu_linear.py --no-amx``); ``set_vbmi_allowed(False)`` as on one without VBMI either (Cooper Lake:
only ``int4_mm_dp`` runs there, with its VBMI-free decode; ``--no-vbmi``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

#: Largest M for ``int4_mv``, measured by ``python benchmarks/cpu_linear.py --crossover --reps 7`` (2026-12-02,
#: one thread, this repo's AVX512-BF16/AMX CPU, torch 2.13; results/cpu_crossover-native-int4-2026-12-02.md),
#: g128: M=1 mv 0.80 ms vs AMX codes 0.88 vs the int4pack op 0.96 (4096x4096), 2.43 vs 2.78 vs 2.97
#: (4096x14336); M=2 mv 1.11 vs codes 0.86, 3.56 vs 2.91.
MV_MAX_M = 1
#: The same where ``int4_mm_codes`` cannot run (groups of 16: GPTQ g16, GGUF Q2_K/Q3_K/Q6_K), so the GEMV's
#: rival is ``int4_mm_weights``: ``--crossover --group 16 --shapes 4096x14336 --ms 1,2,3,4,6 --reps 5``
#: (results/cpu_crossover-native-int4-g16-2026-12-02.md), mv vs weights ms: M=2 3.76 vs 7.05, M=3 6.34 vs 7.01,
#: M=4 7.25 vs 7.36 (a tie), M=6 11.1 vs 7.31.
MV_MAX_M_WITHOUT_CODES = 3
#: Largest M for ``int4_mm_codes`` (above it ``int4_mm_weights``), by group size: each group's float32 tiles
#: are scaled after, so small groups cost more per row. Same run, g128, codes vs weights ms: M=64 2.44 vs 2.87
#: (4096x4096), 10.1 vs 10.7 (4096x14336); M=128 4.64 vs 4.43, 18.1 vs 15.9. g32 (``--group 32``,
#: results/cpu_crossover-native-int4-g32-2026-12-02.md): M=32 2.13 vs 2.30, 7.6 vs 8.04; M=64 3.99 vs 2.97,
#: 13.6 vs 10.2. A group between measured sizes takes the smaller's bound.
CODES_MAX_M = {32: 32, 128: 64}
#: Largest M for ``int4_mm_weights`` where the caller also has decode + oneDNN's bfloat16 GEMM (the CPU
#: GPTQ/AWQ kernels): above it that path's AMX GEMM, blocked for large M, wins. ``python benchmarks/
#: cpu_linear.py --crossover --shapes 4096x4096,4096x14336 --ms 1024,2048,4096 --reps 3``
#: (results/cpu_crossover-native-int4-large-m-2026-12-02.md), weights vs decode ms (4096x4096, 4096x14336):
#: M=1024 27.8 vs 36.4, 111 vs 126; M=2048 77.3 vs 65.7, 223 vs 261 (an earlier run: 63.7 vs 65.8, 241 vs
#: 237: a tie within noise); M=4096 162 vs 129, 528 vs 475. (GGUF's only other path is the exact float32
#: decode, so it keeps the extra at every M.)
WEIGHTS_MAX_M = 1024
#: Without AMX (the CPU's or ``set_amx_allowed(False)``): largest M for ``int4_mv``, then the M up to which
#: ``kernel_for`` leaves groups of 32..256 to the callers' int4pack op, which beats both native kernels there.
#: ``python benchmarks/cpu_linear.py --no-amx --crossover --shapes 4096x4096,4096x14336 --ms 1,2,3,4,6,8,16
#: --reps 5`` (2026-12-05, results/cpu_linear-no-amx-2026-12-05.md), op vs mv vs dp ms (4096x4096;
#: 4096x14336): M=2 1.18 vs 1.13 vs 1.97; 3.91 vs 3.57 vs 6.56. M=3 1.37 vs 1.73 vs 2.23; 4.91 vs 5.72 vs
#: 7.61. M=8 3.20 vs 3.98 vs 3.90; 11.1 vs 13.7 vs 13.2. M=16 op vs dp 6.40 vs 6.25; 22.4 vs 22.2. Op vs dp at
#: M=12 and 32 (``--ms 12,32,256,1024,2048 --reps 3``, same file): 4.96 vs 5.40, 16.0 vs 17.3; 13.4 vs 11.2, 43.2
#: vs 39.4. The op's bound is 8, not 12, on purpose: at M=9..12 it wins here by under 10%, but its cost per row
#: (its own decode) does not follow the CPU's VDPBF16PS rate while int4_mm_dp's does, and issue 25's no-AMX CPU
#: runs dense bf16 (VDPBF16PS) twice as fast as this emulation (141 ms at M=256 on 4096x14336, here 301) while
#: its op took 22.3 ms at M=16 against dense 15.8 (0.71x). With 8, ``--no-amx --kernels AUTO --ms 8,10,12,16``
#: (same file): AUTO 1.13x-1.65x dense bf16 on both shapes.
MV_MAX_M_WITHOUT_AMX = 2
OP_MAX_M_WITHOUT_AMX = 8
#: The same for groups the op cannot take (16), where ``int4_mv`` meets ``int4_mm_dp`` directly: ``--no-amx
#: --crossover --group 16 --shapes 4096x4096,4096x14336 --ms 2,4,6,8,12 --reps 5`` (same file), mv vs dp ms: M=4
#: 2.12 vs 2.57, 7.33 vs 8.89; M=6 3.20 vs 3.16 (a tie), 10.6 vs 11.5; M=8 4.24 vs 3.83, 14.8 vs 14.1.
MV_MAX_M_WITHOUT_AMX_OR_OP = 6
#: Largest M for ``int4_mm_dp`` (above it decode + oneDNN's bfloat16 GEMM, which it beat at every M measured, so
#: this is the largest measured): the ``--ms 12,32,256,1024,2048`` run above, dp vs decode ms (4096x4096;
#: 4096x14336): M=256 84.1 vs 86.6, 284 vs 299; M=1024 327 vs 369, 1110 vs 1180; M=2048 677 vs 758, 2130 vs 2340.
DP_MAX_M = 2048
#: ``int4_mm_dp`` chunk: output channels x K rows decoded at once (256 KiB of bfloat16, in L2). Within noise of
#: the others: ``python benchmarks/cpu_int4_dp.py --shapes 4096x14336 --chunks 64x2048,128x1024,128x2048,256x1024
#: --ms 16,256,1024`` (same file), ms at M=16 / 256 / 1024: 64x2048 22.7 / 297 / 1120; 128x1024 22.0 / 288 / 1180;
#: 128x2048 22.6 / 282 / 1170; 256x1024 23.1 / 295 / 1190.
DP_CHUNK = (64, 2048)
#: ``int4_mm_weights`` chunk: output channels x K rows decoded at once (128 KiB of bfloat16, in L2).
#: Measured on 4096x14336, M=256: 256x256 28.6 ms; 64x256 32.8; 128x256 31.0; 64x4096 36.4.
CHUNK = (256, 256)
BF16 = torch.bfloat16


class Kernel(Enum):
    """One of the extra's kernels."""

    MV = "int4_mv"
    CODES = "int4_mm_codes"
    WEIGHTS = "int4_mm_weights"
    DP = "int4_mm_dp"


def import_extra(name: str, ready: Callable[[Any], bool]) -> Any:
    """``qlinear_native.<name>`` when the extra is installed and ``ready(module)`` says this CPU runs it, else
    False (a cached "no", distinct from the callers' None for "not looked yet")."""
    try:
        mod = importlib.import_module(f"qlinear_native.{name}")
    except ImportError:
        return False
    return mod if ready(mod) else False


def native_int4() -> Any:
    """``qlinear_native._int4`` when it is installed and at least one of its kernels runs on this CPU, else
    None (the int4pack op and the torch decode path run instead)."""
    global _MODULE
    if _MODULE is None:
        _MODULE = import_extra("_int4", lambda mod: mod.amx_available() or mod.dp_available())
    return _MODULE if _MODULE and (amx_available(_MODULE) or dp_available(_MODULE)) else None


_MODULE: Any = None
_AMX_ALLOWED = True
_VBMI_ALLOWED = True


def set_amx_allowed(allowed: bool) -> None:
    """``False``: route and describe as on a CPU without AMX even where this one has it, so that the no-AMX
    kernels can be tested and measured on an AMX machine (``benchmarks/cpu_linear.py --no-amx``); ``True``
    (the default) restores the CPU's own answer. A hook for tests and benchmarks, not a user setting."""
    global _AMX_ALLOWED
    _AMX_ALLOWED = bool(allowed)


def amx_available(mod: Any) -> bool:
    """Whether the extra's AMX kernels run here: the CPU's answer, unless ``set_amx_allowed(False)``."""
    return _AMX_ALLOWED and _VBMI_ALLOWED and bool(mod.amx_available())


def set_vbmi_allowed(allowed: bool) -> None:
    """``False``: route, describe and run as on an AVX512-BF16 CPU without VBMI (and so without AMX: Cooper Lake),
    where of the extra's kernels only ``int4_mm_dp`` runs, decoding without VPERMI2B; ``True`` (the default)
    restores the CPU's own answer. A hook for tests and benchmarks, not a user setting."""
    global _VBMI_ALLOWED
    _VBMI_ALLOWED = bool(allowed)


def vbmi_available(mod: Any) -> bool:
    """Whether the extra's AVX512-BF16 + VBMI code (``int4_mv``, ``int4_mm_dp``'s VPERMI2B decode) runs here: the
    CPU's answer, unless ``set_vbmi_allowed(False)``."""
    return _VBMI_ALLOWED and bool(mod.mv_available())


def dp_available(mod: Any) -> bool:
    """Whether ``int4_mm_dp`` runs here (AVX512-BF16; VBMI not needed)."""
    return bool(mod.dp_available())


def native_max_m() -> int:
    """Largest M the int4pack layers give the extra (above it: decode + oneDNN's bfloat16 GEMM)."""
    mod = native_int4()
    return WEIGHTS_MAX_M if mod is not None and amx_available(mod) else DP_MAX_M


def kernel_for(m: int, group: int, block: int, k_pad: int) -> Kernel | None:
    """The native kernel for ``m`` rows of this weight, or None where none runs it (not installed, CPU
    lacking, the op's bytes in another layout, K not a multiple of 32, or the group/M outside what the
    available kernels take) or, without AMX, where the callers' int4pack op is faster (groups of 32..256 at
    ``MV_MAX_M_WITHOUT_AMX`` < M <= ``OP_MAX_M_WITHOUT_AMX``)."""
    mod = native_int4()
    if mod is None or block != 64 or k_pad % 32:
        return None
    amx = amx_available(mod)
    if group % 16 == 0 and m <= mv_max_m(group, amx) and vbmi_available(mod):
        return Kernel.MV
    if not amx:
        if group % 32 == 0 and m <= OP_MAX_M_WITHOUT_AMX:
            return None
        return Kernel.DP if group % 2 == 0 and dp_available(mod) else None
    return Kernel.CODES if group % 32 == 0 and m <= codes_max_m(group) else Kernel.WEIGHTS


def mv_max_m(group: int, amx: bool = True) -> int:
    """Largest M for ``int4_mv``: further where the AMX codes kernel cannot take the group, or no AMX runs."""
    if not amx:
        return MV_MAX_M_WITHOUT_AMX if group % 32 == 0 else MV_MAX_M_WITHOUT_AMX_OR_OP
    return MV_MAX_M if group % 32 == 0 else MV_MAX_M_WITHOUT_CODES


def codes_max_m(group: int) -> int:
    """``CODES_MAX_M`` for the largest measured group size not above ``group``."""
    return CODES_MAX_M[max((g for g in CODES_MAX_M if g <= group), default=min(CODES_MAX_M))]


def describe(group: int, fallback: str, native_from: int = 1, native_to: int | None = None) -> str:
    """The paths by M for a weight with op group ``group``, or how to get the extra's (for ``explain()``).
    ``fallback``: what runs without the extra (a phrase); ``native_from`` / ``native_to``: the first and last M
    the caller gives the extra (None: every M above)."""
    mod = native_int4()
    if mod is None:
        return (f"{fallback}; the native extra (pip install ./native, a C compiler and an AVX512-BF16 or AMX "
                "CPU) would decode once per call and run faster at every M")
    ranges: list[tuple[str, int, int | None]] = []  # (kernel, first M, last M or None)
    lo, amx = native_from, amx_available(mod)
    if group % 16 == 0 and vbmi_available(mod) and lo <= mv_max_m(group, amx):
        ranges.append((Kernel.MV.value, lo, mv_max_m(group, amx)))
        lo = mv_max_m(group, amx) + 1
    if not amx and group % 32 == 0 and lo <= OP_MAX_M_WITHOUT_AMX and dp_available(mod):
        ranges.append(("the int4pack op", lo, OP_MAX_M_WITHOUT_AMX))
        lo = OP_MAX_M_WITHOUT_AMX + 1
    if not amx and group % 2 == 0 and dp_available(mod):
        ranges.append((f"{Kernel.DP.value} (AVX512-BF16, no AMX on this CPU"
                       + ("" if vbmi_available(mod) else ", decoded without VBMI") + ")", lo, native_to))
    if amx:
        if group % 32 == 0 and lo <= codes_max_m(group):
            ranges.append((f"{Kernel.CODES.value} (AMX)", lo, codes_max_m(group)))
            lo = codes_max_m(group) + 1
        ranges.append((f"{Kernel.WEIGHTS.value} (AMX)", lo, native_to))
    if not ranges:
        return fallback
    parts = [f"{name} at M={a}" + ("" if b == a else f"..{b}" if b else " and above") for name, a, b in ranges]
    text = (f"{fallback} up to M={native_from - 1}, then " if native_from > 1 else "") + "native " + ", ".join(parts)
    if ranges[-1][2] is not None:
        text += f", then {fallback} above"
    return text + " (when the op packs 64-channel blocks and K is a multiple of 32)"


def matmul(xb: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor, group: int,
           kernel: Kernel) -> torch.Tensor:
    """``xb [M, K_pad]`` bfloat16 times the int4pack weight (``packed`` ``[N_pad/64, K_pad, 32]`` bytes or the
    op's ``[N_pad, K_pad/2]``, ``scales_zeros [K_pad/group, N_pad, 2]`` bfloat16) -> ``[M, N_pad]`` bfloat16."""
    mod = native_int4()
    if mod is None:
        raise RuntimeError("native_int4.matmul: the native extra is not available (pip install ./native on a CPU "
                           "with AVX512-BF16 or AMX-BF16)")
    xb = xb.contiguous()
    m, k = xb.shape
    n = scales_zeros.shape[1]
    if xb.dtype != BF16 or packed.numel() * 2 != k * n or scales_zeros.shape != (k // group, n, 2):
        raise ValueError(f"native_int4.matmul: expected bfloat16 x [M, K], {k * n // 2} packed bytes and "
                         f"scales_zeros [{k // group}, {n}, 2]; got x {xb.dtype} {tuple(xb.shape)}, "
                         f"{packed.numel()} bytes, scales_zeros {tuple(scales_zeros.shape)}")
    sz = scales_zeros.contiguous()
    out = torch.empty(m, n, dtype=BF16)
    args = (xb.data_ptr(), packed.data_ptr(), sz.data_ptr(), out.data_ptr(), m, k, n, group, k, n,
            torch.get_num_threads())
    extra = (*CHUNK,) if kernel is Kernel.WEIGHTS else (*DP_CHUNK, vbmi_available(mod)) if kernel is Kernel.DP else ()
    getattr(mod, kernel.value)(*args, *extra)
    return out
