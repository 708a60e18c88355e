"""gemm5's dequantization asm (``fragment8.py`` 8-bit words, ``fragment.py`` offsets by FMA) run by the PTX lane
emulator of ``test_qmv_tc_asm.py`` (no GPU here): every output half must equal the float64 value of its code
rounded once to the activation dtype, ``(q - z) s`` or ``q s + o`` with ``s`` and ``o`` already in that dtype.
Numerics of the whole kernel on the GPU: ``benchmarks/gpu_check.py`` (results/h100-gemm5-*-2026-12-06.md)."""

from __future__ import annotations

import pytest
import torch

from qlinear.kernels.triton.fragment import _fma_asm
from qlinear.kernels.triton.fragment8 import _bytes_asm
from tests.test_qmv_tc_asm import halves, run_asm


def _pair(a: float, b: float, dtype: torch.dtype) -> int:
    bits = torch.tensor([a, b], dtype=torch.float64).to(dtype).view(torch.int16).to(torch.int64) & 0xFFFF
    return int(bits[0]) | int(bits[1]) << 16


def _rounded(v: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(v, dtype=torch.float64).to(dtype).double())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_8bit_words_dequantize_exactly_then_round_once(dtype: torch.dtype) -> None:
    """Both halves of every output register: byte x of word row r and of r + 1 (a K pair), all 256 codes and
    zeros 0..255 (bfloat16 splits each byte into nibble terms: 128 + q would not be exact for q >= 128)."""
    gen = torch.Generator().manual_seed(8)
    bf16 = dtype == torch.bfloat16
    asm = _bytes_asm("bf16x2" if bf16 else "f16x2")
    magic = 128.0 if bf16 else 1024.0
    codes = torch.randperm(256, generator=gen).tolist() + torch.randint(0, 256, (256,), generator=gen).tolist()
    lanes, want = [], []
    for i in range(0, len(codes), 8):
        q0, q1 = codes[i:i + 4], codes[i + 4:i + 8]  # word rows r and r + 1: four bytes each
        z = (37 * i) % 256
        s = _rounded(float(torch.rand(1, generator=gen)) * 0.03 + 1e-3, dtype)
        lanes.append({"$4": sum(b << (8 * j) for j, b in enumerate(q0)), "$5": sum(b << (8 * j) for j, b in
                                                                                    enumerate(q1)),
                      "$6": _pair(s, s, dtype), "$7": _pair(magic + z, magic + z, dtype)})
        want.append([(_rounded((q0[x] - z) * s, dtype), _rounded((q1[x] - z) * s, dtype)) for x in range(4)])
    run_asm(asm, lanes, bf16)
    for lane, exp in zip(lanes, want, strict=True):
        for x in range(4):
            assert halves(lane[f"${x}"], bf16) == exp[x], (x, lane, exp[x])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_offsets_add_by_one_fma_a_pair(dtype: torch.dtype) -> None:
    """4-bit fields of two words with an additive offset: ``fma(q, s, o)`` after the exact magic subtract, so
    each value is ``q s + o`` rounded once (GGUF Q4_K / Q4_1 on gemm5)."""
    gen = torch.Generator().manual_seed(4)
    bf16 = dtype == torch.bfloat16
    magic = 128.0 if bf16 else 1024.0
    asm = _fma_asm("0x43004300" if bf16 else "0x64006400", "bf16x2" if bf16 else "f16x2")
    lanes, want = [], []
    for _ in range(64):
        w0, w1 = (int(v) for v in torch.randint(0, 1 << 32, (2,), generator=gen, dtype=torch.int64))
        s = _rounded(float(torch.rand(1, generator=gen)) * 0.05 + 1e-3, dtype)
        o = _rounded(float(torch.randn(1, generator=gen)) * 0.2, dtype)
        lanes.append({"$8": w0, "$9": w1, "$10": _pair(s, s, dtype), "$11": _pair(magic, magic, dtype),
                      "$12": _pair(o, o, dtype)})
        want.append([(_rounded(((w0 >> 4 * j) & 15) * s + o, dtype), _rounded(((w1 >> 4 * j) & 15) * s + o, dtype))
                     for j in range(8)])
    run_asm(asm, lanes, bf16)
    for lane, exp in zip(lanes, want, strict=True):
        for j in range(8):
            assert halves(lane[f"${j}"], bf16) == exp[j], (j, exp[j])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_8bit_words_with_offsets_round_once(dtype: torch.dtype) -> None:
    """8-bit codes with an additive offset (MLX's biases on 5, 6 and 8-bit codes, zero 0): every output half is
    ``q s + o`` rounded once to the activation dtype, codes 0..255 across both word rows."""
    gen = torch.Generator().manual_seed(6)
    bf16 = dtype == torch.bfloat16
    asm = _bytes_asm("bf16x2" if bf16 else "f16x2", offsets=True)
    magic = 128.0 if bf16 else 1024.0
    codes = torch.randperm(256, generator=gen).tolist() + torch.randint(0, 256, (256,), generator=gen).tolist()
    lanes, want = [], []
    for i in range(0, len(codes), 8):
        q0, q1 = codes[i:i + 4], codes[i + 4:i + 8]
        s = _rounded(float(torch.rand(1, generator=gen)) * 0.01 + 1e-4, dtype)
        o = _rounded(float(torch.randn(1, generator=gen)) * 0.5, dtype)
        lanes.append({"$4": sum(b << (8 * j) for j, b in enumerate(q0)), "$5": sum(b << (8 * j) for j, b in
                                                                                    enumerate(q1)),
                      "$6": _pair(s, s, dtype), "$7": _pair(magic, magic, dtype), "$8": _pair(o, o, dtype)})
        want.append([(_rounded(q0[x] * s + o, dtype), _rounded(q1[x] * s + o, dtype)) for x in range(4)])
    run_asm(asm, lanes, bf16)
    for lane, exp in zip(lanes, want, strict=True):
        for x in range(4):
            assert halves(lane[f"${x}"], bf16) == exp[x], (x, exp[x])
