"""W4AFP8Linear's selection: explicit only, the reference's limits, and a checkpoint's own W4AFP8 scheme realised
(the kernel itself is checked in tests/test_triton_float_interpret.py and on the H200 by benchmarks/gpu_w4afp8.py)."""

from __future__ import annotations

import torch

from qlinear import Problem, Scheme, Target, explain
from qlinear.activations import ActQuant
from qlinear.kernels.w4a_fp8 import W4AFP8Linear

H200 = Target.fake_cuda((9, 0), modules={"triton": True})


def problem(**kw: object) -> Problem:
    base: dict[str, object] = dict(bits=4, group_size=128, in_features=4096, out_features=4096, format="gptq_v2")
    base.update(kw)
    return Problem(Scheme(**base), torch.bfloat16)  # type: ignore[arg-type]


def test_explicit_only_and_the_reference_limits() -> None:
    assert explain(problem(), H200, "gptq_w4afp8").kernel is W4AFP8Linear
    assert explain(problem(), H200).kernel is not W4AFP8Linear  # AUTO priority 0: it changes the numbers
    reasons = W4AFP8Linear.reasons(problem(sym=False, group_size=64), H200)
    assert any("symmetric only" in r for r in reasons) and any("group size 64" in r for r in reasons)
    assert any("sm_80 not among declared" in r for r in W4AFP8Linear.reasons(problem(), Target.fake_cuda((8, 0))))
    assert any("device cpu" in r for r in W4AFP8Linear.reasons(problem(), Target.fake_cpu()))


def test_checkpoint_activation_schemes() -> None:
    token = ActQuant(bits=8, element="float8_e4m3fn", strategy="token", scales="dynamic")
    static = ActQuant(bits=8, element="float8_e4m3fn", strategy="tensor", scales="static")
    assert W4AFP8Linear.realises(token) and not W4AFP8Linear.realises(static)
    assert W4AFP8Linear.reasons(problem(activations=token), H200) == []
    assert any("makes them E4M3 per token" in r for r in W4AFP8Linear.reasons(problem(activations=static), H200))
