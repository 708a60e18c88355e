"""GGUF Q8_0, Q4_0, Q4_1, Q4_K and Q6_K blocks times float32 activations in qlinear's native extra (``pip install
./native``).

``qlinear_native._blocks.mm`` reads the layer's ``qweight`` as the file holds it (``[N, blocks * bytes]``:
float16 scale(s) and 32 codes per block; Q4_K super-blocks of 256), so nothing is derived or kept; products
``q * x`` are exact in float32 and summed in float32, the precision of GGUFTorchLinear's exact decode path,
without decoding the weight (layout and arithmetic: ``native/src/qlinear_native/blocks.c``). Up to 4
activation rows share each block; beyond ``MAX_M`` rows the decode + float32 GEMM wins, and for bfloat16
activations the int4pack planes (AMX) win beyond ``BF16_MAX_M`` for Q8_0 and at every M for the 4-bit types
(one plane, its GEMV at M=1).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .native_int4 import import_extra

#: block types the kernel reads: (values, bytes) per block
TYPES = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144), "Q6_K": (256, 210)}
#: types whose weights have a code-independent part (-8 d, m, -dmin m): the kernel takes per-block sums of x
OFFSET_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K"})
#: Largest M on float32/float16 activations, measured against the exact decode path of GGUFTorchLinear (one
#: thread, 4096x4096, 2026-12-02; results/cpu-gguf_linear-native-q8-2026-12-02.md, "Crossover", Q8_0): ~0.6 ms
#: per row (each 4-row pass re-reads the weight), M=32 19.1-19.5 ms vs 86-88; M=64 38 vs 100 there, but 71 vs 52
#: in an earlier run, so the bound stays where every run agreed. The 4-bit types decode slower still.
MAX_M = 32
#: Largest M of a Q8_0 product on bfloat16 activations, where the rival is the int4pack planes route (two
#: 4-bit planes on the extra's int4 kernels, AMX from M=2); same results file, "bfloat16": M=4 2.68 vs 7.44 ms
#: (4096x4096), 10.0 vs 15.9 (4096x14336); M=6 4.46 vs 3.27, 24.1 vs 17.9. It is also exact where the planes
#: round each block's scale to bfloat16. (Q4_0/Q4_1 in bfloat16 keep their one plane: its GEMV is faster.)
BF16_MAX_M = 4
BLOCK = 32


def native_blocks() -> Any:
    """``qlinear_native._blocks`` when it is installed and its kernel runs on this CPU (AVX-512F, F16C), else
    None."""
    global _MODULE
    if _MODULE is None:
        _MODULE = import_extra("_blocks", lambda mod: mod.available())
    return _MODULE or None


_MODULE: Any = None


def max_m(qtype: str, dtype: torch.dtype) -> int:
    """Largest M this route takes for ``qtype`` blocks and activations of ``dtype`` (0: none)."""
    if qtype not in TYPES:
        return 0
    if dtype == torch.bfloat16:
        return BF16_MAX_M if qtype == "Q8_0" else 0
    return MAX_M


def runs(qtype: str, m: int, dtype: torch.dtype) -> bool:
    """Does the extra take ``m`` rows of a ``qtype`` product in ``dtype`` here?"""
    return 0 < m <= max_m(qtype, dtype) and native_blocks() is not None


def matmul(x2: torch.Tensor, blocks: torch.Tensor, qtype: str, in_features: int) -> torch.Tensor:
    """``x2 [M, K]`` (any float dtype, on CPU) times the ``qtype`` weight ``blocks`` (uint8 ``[N, ceil(K/values)
    * bytes]``) -> ``[M, N]`` float32. K is padded with zeros to whole blocks."""
    mod = native_blocks()
    if mod is None:
        raise RuntimeError("native_blocks.matmul: the native extra is not available (pip install ./native on a "
                           "CPU with AVX-512F and F16C)")
    if qtype not in TYPES:
        raise ValueError(f"native_blocks.matmul: expected a block type {', '.join(TYPES)}, got {qtype}")
    n, row_bytes = blocks.shape
    values, size = TYPES[qtype]
    k_pad = -(-in_features // values) * values
    if (blocks.dtype != torch.uint8 or row_bytes != k_pad // values * size or x2.dim() != 2
            or x2.shape[1] != in_features):
        raise ValueError(f"native_blocks.matmul: expected x [M, {in_features}] and uint8 {qtype} blocks "
                         f"[N, {k_pad // values * size}]; got x {tuple(x2.shape)}, blocks {blocks.dtype} "
                         f"{tuple(blocks.shape)}")
    nblk = k_pad // BLOCK
    xf = x2.to(torch.float32)
    if k_pad != in_features:
        xf = F.pad(xf, (0, k_pad - in_features))
    xf = xf.contiguous()
    sums = xf.view(-1, nblk, BLOCK).sum(-1).contiguous() if qtype in OFFSET_TYPES else None
    w = blocks.contiguous()
    out = torch.empty(xf.shape[0], n, dtype=torch.float32)
    mod.mm(qtype, xf.data_ptr(), 0 if sums is None else sums.data_ptr(), w.data_ptr(), out.data_ptr(),
           xf.shape[0], nblk * BLOCK, n, nblk * BLOCK, n, torch.get_num_threads())
    return out
