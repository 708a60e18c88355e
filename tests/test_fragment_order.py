"""gemm5 over groups of 32 reads x in the A fragment's order (``triton/fragment_order.py``): checked on CPU.

The kernel itself needs an sm_90 GPU (``benchmarks/gpu_check.py`` runs it against float64); here the contract it
relies on is emulated in float64 from the packed words alone, as the kernel reads them: fragment position
``64 c + 8 j + r`` is field ``j`` of word row ``8 c + r``, whose group is the ``(8 c + r) // 4``-th of 32 (its scale,
zero, offset and super pair). That product, against x gathered by ``fragment_input``, must equal x times the
weight built straight from the canonical codes and scales, for plain and act-order layers, K not a multiple of
64, and the K-quant form with its uint8 sub-scales, mins and float32 super pairs.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # fragment_input gathers with a Triton kernel: on CPU, interpreted

import pytest
import torch

from qlinear.kernels.triton.fragment_order import block_k_groups, fragment_input, groups_reasons
from qlinear.kernels.triton.layout import SUPER_GROUPS, Packed, build, build_affine, build_kquant


def _emulated_weight(p: Packed, kf: int) -> torch.Tensor:
    """``[N, KF]`` float64: what gemm5's consumer dequantizes for each fragment position, from the words."""
    words = p.qweight.to(torch.int64) & 0xFFFFFFFF
    i = torch.arange(kf)
    c, j, r = i // 64, i % 64 // 8, i % 8
    row = 8 * c + r
    live = row < p.kw
    code = (words[row.clamp(max=p.kw - 1)] >> (4 * j)[:, None]) & 0xF  # [KF, NP]
    g = (row // 4).clamp(max=p.scales.shape[0] - 1)
    live = live & (row // 4 < p.scales.shape[0])
    s = p.scales[g].double()
    z = p.zeros[g].double() if p.zeros is not None else torch.full_like(s, float(p.zero_const))
    o = p.offsets[g].double() if p.offsets is not None else torch.zeros_like(s)
    if p.supers is not None:
        sup = p.supers.reshape(-1, 2, p.np).double()[g // SUPER_GROUPS]
        s, o = s * sup[:, 0], o * sup[:, 1]
    w = (code.double() - z) * s + o
    return (w * live[:, None]).t()[: p.n]


def _random_gptq(n: int, k: int, act_order: bool, asym: bool, gen: torch.Generator):
    g = -(-k // 32)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, g, generator=gen) * 0.02 + 0.002).half().float()
    zeros = torch.randint(0, 16, (n, g), generator=gen) if asym else torch.full((n, g), 8)
    g_idx = torch.arange(k) // 32
    if act_order:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    w64 = scales.double()[:, g_idx] * (codes.double() - zeros.double()[:, g_idx])
    return build(codes, scales, zeros, g_idx, 4), w64


@pytest.mark.parametrize(("k", "act_order", "asym"), [(256, False, False), (160, False, True), (224, True, True),
                                                      (96, True, False)])
def test_fragment_order_reproduces_gptq_g32(k: int, act_order: bool, asym: bool) -> None:
    gen = torch.Generator().manual_seed(k)
    p, w64 = _random_gptq(24, k, act_order, asym, gen)
    assert (p.rows_per_block, p.group) == (4, 32) and groups_reasons(p, 5) == []
    x = torch.randn(5, k, generator=gen, dtype=torch.float64)
    xf, kf = fragment_input(x, p)
    assert kf % 64 == 0 and tuple(xf.shape) == (5, kf)
    assert torch.allclose(xf @ _emulated_weight(p, kf).t(), x @ w64.t(), rtol=1e-12, atol=1e-12)


def test_fragment_order_reproduces_the_kquant_form() -> None:
    gen = torch.Generator().manual_seed(7)
    n, k = 20, 512
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    sc = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
    mins = torch.randint(0, 64, (n, k // 32), generator=gen, dtype=torch.uint8)
    d = (torch.rand(n, k // 256, generator=gen) * 1e-3).half().float()
    dmin = (torch.rand(n, k // 256, generator=gen) * 1e-3).half().float()
    p = build_kquant(codes, sc, mins, d, dmin)
    g = torch.arange(k) // 32
    w64 = (d.double()[:, g // 8] * sc.double()[:, g] * codes.double()
           - dmin.double()[:, g // 8] * mins.double()[:, g])
    x = torch.randn(3, k, generator=gen, dtype=torch.float64)
    xf, kf = fragment_input(x, p)
    assert torch.allclose(xf @ _emulated_weight(p, kf).t(), x @ w64.t(), rtol=1e-12, atol=1e-12)
    assert block_k_groups(p, 512) == 128 and block_k_groups(p, 32) == 64, "one or two fragment blocks a step"
    assert groups_reasons(p, 1024) == [] and "M=1025 > 1024" in groups_reasons(p, 1025)[0]


def test_fragment_order_refuses_what_it_cannot_take() -> None:
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (8, 192), generator=gen, dtype=torch.uint8)
    p = build(codes, torch.rand(8, 2), torch.full((8, 2), 8), torch.arange(192) // 96, 4)
    assert (p.rows_per_block, p.group) == (4, 96)
    assert "groups of 96" in groups_reasons(p, 5)[0]
    assert p.xorder is None, "only groups of exactly 32 carry the fragment order"
    with pytest.raises(ValueError, match="groups of 32"):
        fragment_input(torch.zeros(1, 192), p)
    eight = build(torch.randint(0, 256, (8, 64), generator=gen, dtype=torch.uint8), torch.rand(8, 2),
                  torch.full((8, 2), 128), torch.arange(64) // 32, 8)
    assert eight.group == 32 and eight.xorder is None, "8-bit words: gemm5 runs 4-bit codes only"


def test_offsets_over_eight_row_blocks_are_taken() -> None:
    """gemm5 once dropped the offsets of a step spanning one group (MLX's biases over groups of 64 and 128: relative
    error 1.4-1.7 on an H100, results/h100-gpu_mlx-2026-12-07.md); its one-group step now adds them, checked on a
    GPU by benchmarks/gpu_mlx.py, so its limits take these words with and without offsets."""
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (64, 256), generator=gen, dtype=torch.uint8)
    scales = torch.rand(64, 4, generator=gen).half()
    p = build_affine(codes, scales, -8 * scales, 4, 64, param_dtype=torch.float16)
    assert p.rows_per_block == 8 and p.offsets is not None and groups_reasons(p, 16) == []
    plain = build(codes, scales, torch.full((1,), 8, dtype=torch.int32), torch.arange(256) // 64, 4)
    assert groups_reasons(plain, 16) == []
