"""GGUF Q8_0 blocks times float32 activations in qlinear's native extra (``pip install ./native``).

``qlinear_native._q8.q8_0_mm`` reads the layer's ``qweight`` as the file holds it (``[N, K/32 * 34]``: a
float16 scale and 32 int8 codes per block), so nothing is derived or kept; products ``q * x`` are exact in
float32 and summed in float32, the precision of GGUFTorchLinear's exact decode path, without decoding the
weight. Up to 4 activation rows share each block; beyond ``MAX_M`` rows the decode + float32 GEMM wins, and
for bfloat16 activations beyond ``BF16_MAX_M`` the int4pack planes on AMX.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

#: Largest M for ``q8_0_mm`` on float32 activations, measured against the exact decode path of
#: GGUFTorchLinear (one thread, 4096x4096, 2026-12-02; results/cpu-gguf_linear-native-q8-2026-12-02.md,
#: "Crossover"): ~0.6 ms per row (each 4-row pass re-reads the weight), M=32 19.1-19.5 ms vs 86-88; M=64
#: 38 vs 100 there, but 71 vs 52 in an earlier run, so the bound stays where every run agreed.
MAX_M = 32
#: Largest M for ``q8_0_mm`` on bfloat16 activations, where its rival is the int4pack planes route (two 4-bit
#: planes on the extra's int4 kernels, AMX from M=2); same results file, "bfloat16": M=4 2.68 vs 7.44 ms
#: (4096x4096), 10.0 vs 15.9 (4096x14336); M=6 4.46 vs 3.27, 24.1 vs 17.9. It is also exact where the planes
#: round each block's scale to bfloat16.
BF16_MAX_M = 4
BLOCK, BYTES = 32, 34


def native_q8() -> Any:
    """``qlinear_native._q8`` when it is installed and its kernel runs on this CPU (AVX-512F, F16C), else None."""
    global _MODULE
    if _MODULE is None:
        try:
            from qlinear_native import _q8
        except ImportError:
            _MODULE = False
        else:
            _MODULE = _q8 if _q8.q8_0_available() else False
    return _MODULE or None


_MODULE: Any = None


def max_m(dtype: torch.dtype) -> int:
    """Largest M this route takes for activations of ``dtype``."""
    return BF16_MAX_M if dtype == torch.bfloat16 else MAX_M


def runs(m: int, dtype: torch.dtype) -> bool:
    """Does the extra take ``m`` rows of a Q8_0 product in ``dtype`` here?"""
    return 0 < m <= max_m(dtype) and native_q8() is not None


def matmul(x2: torch.Tensor, blocks: torch.Tensor, in_features: int) -> torch.Tensor:
    """``x2 [M, K]`` (any float dtype, on CPU) times the Q8_0 weight ``blocks`` (uint8 ``[N, ceil(K/32) * 34]``)
    -> ``[M, N]`` float32. K is padded with zeros to whole blocks."""
    mod = native_q8()
    if mod is None:
        raise RuntimeError("native_q8.matmul: the native extra is not available (pip install ./native on a CPU "
                           "with AVX-512F and F16C)")
    n, row_bytes = blocks.shape
    nblk = -(-in_features // BLOCK)
    if blocks.dtype != torch.uint8 or row_bytes != nblk * BYTES or x2.dim() != 2 or x2.shape[1] != in_features:
        raise ValueError(f"native_q8.matmul: expected x [M, {in_features}] and uint8 blocks [N, {nblk * BYTES}]; "
                         f"got x {tuple(x2.shape)}, blocks {blocks.dtype} {tuple(blocks.shape)}")
    xf = x2.to(torch.float32)
    if nblk * BLOCK != in_features:
        xf = F.pad(xf, (0, nblk * BLOCK - in_features))
    xf = xf.contiguous()
    w = blocks.contiguous()
    out = torch.empty(xf.shape[0], n, dtype=torch.float32)
    mod.q8_0_mm(xf.data_ptr(), w.data_ptr(), out.data_ptr(), xf.shape[0], nblk * BLOCK, n, nblk * BLOCK, n,
                torch.get_num_threads())
    return out
