"""``MlxCpuLinear``: MLX affine weights on the CPU int4 kernels (``kernels/mlx_cpu.py``).

What is checked against what:

* weights quantized by ``mx.quantize`` (mlx 0.32.4, the producer) and the forward against the float64 product with
  ``mx.dequantize``'s weight, for every width and group size, M on each path (1, 5, 40, 300), within bfloat16
  rounding; float16 and bfloat16 scales;
* the words read back from the runtime (``weight``, ``state_dict()``) against mlx's own words, word for word;
* new words and in-place scale changes after the drop; the selector's choice and reasons.
"""

from __future__ import annotations

import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels.mlx_cpu import MlxCpuLinear, shift
from qlinear.kernels.mlx_torch import MlxTorchLinear
from qlinear.layouts import mlx
from qlinear.select import explain, select
from qlinear.target import Target

N, K = 80, 256
HERE = Target.here("cpu")
OPS = {op: True for op in ("aten._weight_int4pack_mm_for_cpu", "aten._convert_weight_to_int4pack_for_cpu")}


def produced(bits: int, gs: int, sdtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """One module's tensors as mlx writes them (``mx.quantize`` of a random weight)."""
    from tests import mlx_support as mxs

    mxs.need_mlx()
    w = (torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.02).to(sdtype)
    words, scales, biases = mxs.quantize(w, gs, bits)
    return {"weight": words, "scales": scales, "biases": biases}


def layer_of(t: dict[str, torch.Tensor], bits: int, gs: int, bias: torch.Tensor | None = None) -> MlxCpuLinear:
    if MlxCpuLinear.target_reasons(HERE):
        pytest.skip(f"MlxCpuLinear cannot run here: {MlxCpuLinear.target_reasons(HERE)}")
    lay = MlxCpuLinear(mlx.scheme_for(bits, gs, K, N), bias=bias is not None, dtype=torch.bfloat16)
    lay.load_state_dict(dict(t, **({"bias": bias} if bias is not None else {})))
    return lay


def mlx_weight(t: dict[str, torch.Tensor], bits: int, gs: int) -> torch.Tensor:
    from tests import mlx_support as mxs

    return mxs.dequantize(t["weight"], t["scales"], t["biases"], gs, bits).double()


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize(("gs", "sdtype"), [(32, torch.float16), (64, torch.bfloat16), (128, torch.float16)])
def test_forward_matches_mlx_dequantize(bits: int, gs: int, sdtype: torch.dtype) -> None:
    t = produced(bits, gs, sdtype, seed=bits)
    bias = torch.randn(N).to(sdtype)
    lay = layer_of(t, bits, gs, bias)
    w = mlx_weight(t, bits, gs)
    for m in (1, 5, 40, 300):
        x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).bfloat16()
        with torch.no_grad():
            y = lay(x)
        ref = x.double() @ w.t() + bias.double()
        assert y.dtype == torch.bfloat16 and y.shape == (m, N)
        err = float((y.double() - ref).norm() / ref.norm())
        assert err < 1e-2, f"M={m}: relative error {err:.2e}"
    assert lay.codes_replaced and "weight" not in dict(lay.named_buffers())
    sd = lay.state_dict()
    for name, v in t.items():  # mlx's own words, read back from the runtime
        assert same(sd[name], v), name


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bits (uint32 words compared as int32: torch has few uint32 ops)."""
    bits = (lambda t: t.view(torch.int32) if t.dtype == torch.uint32 else t)  # noqa: E731
    return a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def test_shifts_keep_codes_in_four_bit_parts() -> None:
    for bits in mlx.BITS:
        top = (1 << bits) - 1 + shift(bits)
        assert shift(bits) >= 0 and top < (16 if bits <= 4 else 256), bits


def test_writes_after_the_drop_reach_the_next_forward() -> None:
    bits, gs = 4, 64
    lay = layer_of(produced(bits, gs, torch.float16), bits, gs)
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(1)).bfloat16()
    with torch.no_grad():
        lay(x)
    t2 = produced(bits, gs, torch.float16, seed=7)
    lay.load_state_dict(t2)
    assert not lay.codes_replaced
    with torch.no_grad():
        y = lay(x)
        lay.scales.mul_(2)
        y2 = lay(x)
    w = mlx_weight(t2, bits, gs)
    assert float((y.double() - x.double() @ w.t()).norm() / (x.double() @ w.t()).norm()) < 1e-2
    doubled = mlx_weight(dict(t2, scales=t2["scales"] * 2), bits, gs)
    ref = x.double() @ doubled.t()
    assert float((y2.double() - ref).norm() / ref.norm()) < 1e-2
    assert same(lay.weight, t2["weight"])


def test_selector_runs_half_precision_mlx_here_and_float32_exactly() -> None:
    scheme = mlx.scheme_for(4, 64, K, N)
    cpu = Target.fake_cpu(ops=OPS)
    bf = select(Problem(scheme, dtype=torch.bfloat16), cpu)
    assert bf.kernel is MlxCpuLinear and "codes moved up by 0 as one 4-bit part" in bf.runs
    assert select(Problem(scheme, dtype=torch.float32), cpu).kernel is MlxTorchLinear
    no_op = explain(Problem(scheme, dtype=torch.bfloat16), Target.fake_cpu(ops={op: False for op in OPS}))
    verdict = next(v for v in no_op.verdicts if v.kernel is MlxCpuLinear)
    assert not verdict.ok and any("int4pack" in r for r in verdict.reasons)
    assert "two exact 4-bit nibble parts" in select(Problem(mlx.scheme_for(6, 64, K, N), dtype=torch.float16),
                                                   cpu).runs
