"""``ParoCpuLinear`` (``kernels/paro_cpu.py``): ParoQuant's rotation, then the AWQ codes on the CPU int4 kernels.

Checked against a float64 reference written in ``test_paroquant.py`` (an explicit rotation matrix per round times
the dense weight from the codes), on each path the int4 runtime takes by M; against ``ParoLinear`` loaded from the
same state dict; the checkpoint rebuilt word for word once the runtime replaced ``qweight``; the selector's choice
on CPU; bad input named.
"""

from __future__ import annotations

import pytest
import torch

from qlinear.caps import Problem
from qlinear.enums import BACKEND
from qlinear.kernels.paro_cpu import ParoCpuLinear
from qlinear.kernels.paroquant import ParoLinear
from qlinear.select import select
from qlinear.target import Target
from tests.test_paroquant import make_layer, random_rotation, rotation64, scheme

K, N, GS, KROT = 256, 96, 64, 4


def reference(layer: ParoLinear, q, x: torch.Tensor) -> torch.Tensor:
    w64 = (q.codes.double() - q.zeros.double()[:, q.g_idx.long()]) * q.scales.double()[:, q.g_idx.long()]
    rot = rotation64(x.reshape(-1, K).double(), layer.pairs, layer.theta.double(), layer.channel_scales, GS)
    return rot @ w64.t() + layer.bias.double()


def cpu_twin(layer: ParoLinear) -> ParoCpuLinear:
    fast = ParoCpuLinear(layer.scheme, bias=layer.bias is not None)
    fast.load_state_dict(layer.state_dict())
    return fast


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 5, 40, 300])
def test_matches_float64_on_every_path(m: int, dtype: torch.dtype) -> None:
    layer, q = make_layer(K, N, GS, KROT, seed=m)
    fast = cpu_twin(layer)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).to(dtype)
    y = fast(x)
    assert y.shape == (m, N) and y.dtype == dtype
    assert fast.group_matrices(dtype) is not None  # the transform as one batched matmul
    ref = reference(layer, q, x)
    err = float((y.double() - ref).norm() / ref.norm())
    exact = float((layer(x).double() - ref).norm() / ref.norm())  # the exact kernel's own error, same input
    assert err < exact + 6e-3, (fast.path(m, False), err, exact)  # plus bfloat16 arithmetic on the int4 path


def test_checkpoint_is_rebuilt_word_for_word() -> None:
    layer, _ = make_layer(K, N, GS, KROT, seed=3)
    fast = cpu_twin(layer)
    fast(torch.randn(1, K).bfloat16())
    assert fast.codes_replaced  # the runtime holds the codes
    want, got = layer.state_dict(), fast.state_dict()
    assert sorted(got) == sorted(want)
    for name, v in want.items():
        assert got[name].dtype == v.dtype and torch.equal(got[name], v), name


def test_a_new_rotation_reaches_the_next_forward() -> None:
    layer, q = make_layer(K, N, GS, KROT, seed=4)
    fast = cpu_twin(layer)
    x = torch.randn(3, K).bfloat16()
    before = fast(x)
    rot = random_rotation(K, GS, KROT, torch.Generator().manual_seed(9))
    layer.load_rotation(**rot)
    fast.load_rotation(**rot)
    after = fast(x)
    ref = reference(layer, q, x)
    assert not torch.equal(before, after)
    assert float((after.double() - ref).norm() / ref.norm()) < 1e-2


def test_selected_on_cpu_and_refusing_float32() -> None:
    from qlinear.kernels.planned.cpu import INT4PACK_CPU_OPS
    from qlinear.select import explain

    s = scheme(K, N, GS, KROT)
    choice = select(Problem(s, torch.bfloat16), Target.fake_cpu(ops={op: True for op in INT4PACK_CPU_OPS}))
    assert choice.backend is BACKEND.PAROQUANT_CPU
    assert "rotation" in choice.runs and "int4 kernels" in choice.runs
    no_ops = Target.fake_cpu(ops={op: False for op in INT4PACK_CPU_OPS})
    assert select(Problem(s, torch.bfloat16), no_ops).backend is BACKEND.PAROQUANT_CUDA  # ParoLinear, exact
    verdict = next(v for v in explain(Problem(s, torch.bfloat16), no_ops).verdicts if v.kernel is ParoCpuLinear)
    assert not verdict.ok and any("int4pack" in r for r in verdict.reasons)
    fast = ParoCpuLinear(s, bias=False)
    with pytest.raises(ValueError, match="in_features|last dimension"):
        fast(torch.randn(1, K + 1).bfloat16())
    with pytest.raises(ValueError, match="dtype"):
        fast(torch.randn(1, K))
