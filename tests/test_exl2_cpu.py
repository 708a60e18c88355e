"""``Exl2CpuLinear``: EXL2 groups as 4-bit parts on the CPU int4 kernels (``kernels/exl2_cpu.py``).

What is checked against what:

* the parts' weights (``AffineWeight.dequantize`` in float64 of each part, summed) rounded once to float16 against
  ``tests/oracle/exl2_numpy.py``'s transcription of exllamav2's reconstruct kernel, exactly: widening and the
  nibble split of 8/6/5-bit codes lose nothing;
* forwards at M = 1, 5, 40 and 300 (the native kernels' GEMV and AMX tiles, the decode path) against the float64
  product of the oracle's weight, within bfloat16 rounding; gradients for the input;
* once prepared the merged weight replaces ``q_weight``: the file's words rebuilt from its bytes equal the file's,
  word for word (state_dict, a fresh torch layer's decode of them), and new words load into a prepared layer;
* the selector: AUTO runs bfloat16 and float16 EXL2 layers here, float32 stays on the exact torch kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels.exl2 import Exl2TorchLinear
from qlinear.kernels.exl2_cpu import Exl2CpuLinear, part_weights, stored_codes_of
from qlinear.layouts import exl2
from qlinear.select import explain, select
from qlinear.spec import Scheme
from qlinear.target import Target
from tests.oracle import exl2_numpy as oracle
from tests.test_exl2 import module

N = 72
PARAMS = [exl2.Exl2Params((8, 6, 5, 4, 3, 2), (32, 32, 32, 64, 32, 64)),
          exl2.Exl2Params((6, 4, 4, 2), (64, 128, 128, 16)),
          exl2.Exl2Params((3,), (96,), stored_perm=True),
          exl2.Exl2Params((8, 4, 3), (64, 128, 40))]  # a ragged last group


def scheme(p: exl2.Exl2Params, n: int = N) -> Scheme:
    return Scheme(bits=p.max_bits, group_size=-1, in_features=p.in_features, out_features=n, method="exl2",
                  format="exl2", layout_params=p)


def oracle_weight(t: dict[str, torch.Tensor], p: exl2.Exl2Params) -> np.ndarray:
    a = {k: v.numpy() for k, v in t.items()}
    return oracle.exl2_weight(a["q_weight"], a["q_invperm"], a["q_scale"], a["q_scale_max"], a["q_groups"],
                              p.in_features).astype(np.float64)  # [K, N], input order


@pytest.mark.parametrize("p", PARAMS)
def test_parts_sum_to_the_files_weight(p: exl2.Exl2Params) -> None:
    t, _, _ = module(p, 2, N)
    scales = exl2.row_scales(t["q_scale"], t["q_scale_max"], N)
    stored = torch.zeros(p.in_features, N, dtype=torch.float64)
    parts = part_weights(t["q_weight"], scales, p)
    assert all(q.bits == 4 and int(q.codes.max()) < 16 for _, q in parts)
    for r0, q in parts:
        stored[r0:r0 + q.in_features] += q.dequantize(torch.float64).t()
    w = stored[t["q_invperm"].to(torch.int64)].half().double().numpy()  # one float16 rounding, as exllamav2
    assert np.array_equal(w, oracle_weight(t, p))


@pytest.mark.parametrize("p", PARAMS)
@pytest.mark.parametrize("m", [1, 5, 40, 300])
def test_forward_matches_the_oracle(p: exl2.Exl2Params, m: int) -> None:
    t, _, _ = module(p, 3, N)
    lay = Exl2CpuLinear(scheme(p), bias=True, dtype=torch.bfloat16)
    lay.load_state_dict(t)
    x = torch.randn(m, p.in_features, generator=torch.Generator().manual_seed(m)).bfloat16()
    with torch.no_grad():
        y = lay(x)
    ref = x.double().numpy() @ oracle_weight(t, p) + t["bias"].double().numpy()
    assert y.shape == (m, N) and y.dtype == torch.bfloat16
    err = float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))
    assert err < 1.5e-2, f"relative error {err:.2e}"
    for name, v in t.items():  # the checkpoint is untouched
        assert torch.equal(lay.state_dict()[name], v), name


def prepared(p: exl2.Exl2Params, seed: int) -> tuple[Exl2CpuLinear, dict[str, torch.Tensor]]:
    t, _, _ = module(p, seed, N)
    lay = Exl2CpuLinear(scheme(p), bias=True, dtype=torch.bfloat16)
    lay.load_state_dict(t)
    lay.prepare()
    return lay, t


@pytest.mark.parametrize("p", PARAMS)
def test_the_merged_weight_replaces_q_weight_word_for_word(p: exl2.Exl2Params) -> None:
    lay, t = prepared(p, 7)
    assert lay.codes_replaced and "q_weight" not in dict(lay.named_buffers())
    assert torch.equal(stored_codes_of(lay._rt, p, N), exl2.stored_codes(t["q_weight"], p))
    sd = lay.state_dict()
    for name, v in t.items():
        assert torch.equal(sd[name], v), name
    assert lay.codes_replaced  # saving rebuilt a transient copy only
    fresh = Exl2TorchLinear(scheme(p), bias=True)
    fresh.load_state_dict(sd)
    w = fresh.dequantize(torch.float64).t().numpy()  # [K, N], input order, decoded by the torch kernel
    assert np.array_equal(w, oracle_weight(t, p))


def test_new_weights_load_into_a_prepared_layer() -> None:
    p = PARAMS[1]
    lay, _ = prepared(p, 8)
    t2, _, _ = module(p, 9, N)
    lay.load_state_dict(t2)
    assert not lay.codes_replaced and torch.equal(lay.q_weight, t2["q_weight"])
    x = torch.randn(2, p.in_features, generator=torch.Generator().manual_seed(1)).bfloat16()
    with torch.no_grad():
        y = lay(x)
    assert lay.codes_replaced and "q_weight" not in dict(lay.named_buffers())
    ref = x.double().numpy() @ oracle_weight(t2, p) + t2["bias"].double().numpy()
    assert float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref)) < 1.5e-2
    assert torch.equal(lay.state_dict()["q_weight"], t2["q_weight"])
    with torch.no_grad():
        lay.q_scale_max.mul_(2)  # in place after the drop: the parts are rebuilt from the read-back words
        y = lay(x)
    doubled = dict(t2, q_scale_max=t2["q_scale_max"] * 2)
    ref = x.double().numpy() @ oracle_weight(doubled, p) + t2["bias"].double().numpy()
    assert float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref)) < 1.5e-2
    assert torch.equal(lay.q_weight, t2["q_weight"])


def test_input_gradient_and_errors() -> None:
    p = PARAMS[0]
    t, _, _ = module(p, 4, N)
    lay = Exl2CpuLinear(scheme(p), bias=True, dtype=torch.bfloat16)
    lay.load_state_dict(t)
    x = torch.randn(3, p.in_features, generator=torch.Generator().manual_seed(0)).bfloat16().requires_grad_()
    lay(x).float().sum().backward()
    want = torch.from_numpy(oracle_weight(t, p)).sum(dim=1)  # d(sum y)/dx = row sums of W^T
    got = x.grad[0].double()
    assert float((got - want).norm() / want.norm()) < 1.5e-2
    with pytest.raises(ValueError, match="in_features"):
        lay(torch.randn(1, p.in_features + 1).bfloat16())


def test_selector_runs_half_precision_exl2_here_and_float32_exactly() -> None:
    cpu = Target.fake_cpu(ops={op: True for op in ("aten._weight_int4pack_mm_for_cpu",
                                                   "aten._convert_weight_to_int4pack_for_cpu")})
    bf = select(Problem(scheme(PARAMS[0]), dtype=torch.bfloat16), cpu)
    assert bf.kernel is Exl2CpuLinear and "3 4-bit part(s) merged into one 4-bit weight of 352 K positions" in bf.runs
    assert select(Problem(scheme(PARAMS[0]), dtype=torch.float32), cpu).kernel is Exl2TorchLinear
    no_op = explain(Problem(scheme(PARAMS[0]), dtype=torch.bfloat16), Target.fake_cpu(
        ops={"aten._weight_int4pack_mm_for_cpu": False, "aten._convert_weight_to_int4pack_for_cpu": False}))
    verdict = next(v for v in no_op.verdicts if v.kernel is Exl2CpuLinear)
    assert not verdict.ok and any("int4pack" in r for r in verdict.reasons)
