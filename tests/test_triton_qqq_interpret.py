"""The QQQ Triton kernels (``kernels/triton/qqq_mm.py``) in Triton's CPU interpreter against ``QQQTorchLinear``
(exact integer arithmetic, itself checked against GPTQModel and a float64 oracle): bit-identical outputs.

TRITON_INTERPRET=1 is set at collection, before anything imports the kernel bodies (``triton.jit`` decides
interpreted-or-compiled when a body is defined; see test_triton_interpret.py). Small shapes: K with a tail (not a
multiple of the 128-deep step), N not a multiple of the tile, split-K forced, every M bucket's tile shape.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from qlinear.kernels.qqq import QQQTorchLinear, quantize_per_token
from qlinear.layouts.qqq import QQQWeight
from qlinear.spec import Scheme

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"


@pytest.fixture(scope="module")
def qmm():
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import qqq_mm

    if type(qqq_mm.qqq_mm_kernel).__name__ != "InterpretedFunction":
        pytest.skip("the kernel bodies were imported before TRITON_INTERPRET=1 was set")
    return qqq_mm


def torch_layer(n: int, k: int, gs: int, dtype: torch.dtype, bias: bool, seed: int) -> QQQTorchLinear:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-8, 8, (n, k), generator=g).to(torch.int8)
    group = (torch.rand(n, k // gs, generator=g) * 16 + 2).half() if gs < k else torch.empty(n, 0).half()
    qw = QQQWeight(codes, group, torch.rand(n, generator=g) * 1e-3 + 1e-4, gs)
    layer = QQQTorchLinear(Scheme(bits=4, group_size=gs, in_features=k, out_features=n, method="qqq", format="qqq"),
                           bias=bias, dtype=dtype)
    layer.load_qqq(qw, torch.randn(n, generator=g) if bias else None)
    layer.prepare()
    return layer


def run(qmm, layer: QQQTorchLinear, x: torch.Tensor, config=None) -> torch.Tensor:
    bias = None if layer.bias is None else layer.bias.to(x.dtype)
    gs = layer.scheme.group_size if layer._rt_sg is not None else 0
    return qmm.qqq_linear(x, layer._rt_words, layer._rt_sg, layer._rt_sc, bias, gs, config=config)


CASES = [  # n, k, group size, dtype, bias, M
    (128, 256, 128, torch.float16, True, 3),
    (192, 384, 128, torch.bfloat16, False, 20),
    (64, 192, 192, torch.bfloat16, True, 5),  # per-channel, K tail of 64
    (256, 128, 128, torch.float16, False, 1),  # per-channel (one group = K)
    (64, 512, 128, torch.bfloat16, True, 70),
]


@pytest.mark.parametrize(("n", "k", "gs", "dtype", "bias", "m"), CASES)
def test_auto_config_matches_torch_kernel(qmm, n: int, k: int, gs: int, dtype: torch.dtype, bias: bool, m: int) -> None:
    layer = torch_layer(n, k, gs, dtype, bias, seed=n + k + m)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 4).to(dtype)
    x[m // 2] = 0
    y = run(qmm, layer, x)
    assert y.dtype == dtype and torch.equal(y, layer(x))


@pytest.mark.parametrize("config", [(16, 64, 3, "mma"), (32, 128, 2, "mma"), (64, 64, 1, "mma"), (16, 128, 4, "mma"),
                                    (32, 64, 1, "dense"), (16, 128, 2, "dense"), (1, 64, 3, "gemv"),
                                    (4, 128, 1, "gemv"), (2, 64, 2, "gemv")])
def test_every_variant_tiles_and_split_k_match(qmm, config: tuple[int, int, int, str]) -> None:
    bm, bn, split, variant = config
    for gs, k in ((128, 512), (384, 384), (192, 192)):
        layer = torch_layer(192, k, gs, torch.bfloat16, True, seed=bm + split)
        x = torch.randn(13, k, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
        x[5] = 0
        y = run(qmm, layer, x, qmm.QConfig(bm, bn, split, variant=variant))
        assert torch.equal(y, layer(x)), (config, gs)


def test_row_quantization_matches_torch(qmm) -> None:
    g = torch.Generator().manual_seed(4)
    for dtype, k in ((torch.float16, 200), (torch.bfloat16, 200), (torch.bfloat16, 8200)):  # 8200: two passes
        x = (torch.randn(4, k, generator=g) * torch.tensor([1e-3, 1.0, 300.0, 0.0])[:, None]).to(dtype)
        xq, s1 = qmm.quantize_rows(x)
        want_q, want_s = quantize_per_token(x)
        assert torch.equal(xq, want_q) and torch.equal(s1, want_s[:, 0]), (dtype, k)
        assert s1[3] == 0 and not xq[3].any()


def test_launcher_errors(qmm) -> None:
    layer = torch_layer(64, 256, 128, torch.float16, False, seed=0)
    xq, s1 = qmm.quantize_rows(torch.randn(2, 256).half())
    words, sg, sc = layer._rt_words, layer._rt_sg, layer._rt_sc
    with pytest.raises(ValueError, match=r"qqq_mm: words: expected int32 \[16, N\].*found \[32, 64\]"):
        qmm.qqq_mm(xq[:, :128].contiguous(), s1, words, sg, sc, None, torch.float16, 128)
    with pytest.raises(ValueError, match="group_size: expected a multiple of 128"):
        qmm.qqq_mm(xq, s1, words, sg, sc, None, torch.float16, 64)
    with pytest.raises(ValueError, match="out_dtype: expected float16 or bfloat16"):
        qmm.qqq_mm(xq, s1, words, sg, sc, None, torch.float32, 128)
    with pytest.raises(ValueError, match="bias: expected dtype float16"):
        qmm.qqq_mm(xq, s1, words, sg, sc, torch.zeros(64), torch.float16, 128)
    with pytest.raises(ValueError, match="config.variant: expected one of gemv, mma, dense"):
        qmm.qqq_mm(xq, s1, words, sg, sc, None, torch.float16, 128, qmm.QConfig(16, 64, variant="fast"))
    with pytest.raises(ValueError, match="x: expected dtype float16 or bfloat16"):
        qmm.quantize_rows(torch.randn(2, 256))
