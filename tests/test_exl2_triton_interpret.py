"""``Exl2TritonLinear``: EXL2 groups widened onto the GPTQ Triton kernels (``kernels/exl2_runtime.py``), in Triton's
CPU interpreter.

What is checked against what:

* the segments' codes and scales against the file, through ``tests/oracle/exl2_numpy.py``'s transcription of
  exllamav2's reconstruct kernel: the weight each segment stands for (``(q' - 2**(B-1)) * s``, decoded here in
  float64 from the segment's words, not by the code under test) must equal the oracle's float16 weight exactly;
* ``q_weight`` rebuilt from the segments against the file's words, word for word, also through ``state_dict``;
* forwards of every variant family (gemv, gemv_tc, skinny2, gemm2, dense) against the float64 product of the
  oracle's weight, in float16 and bfloat16, with groups of 3, 5 and 6 bits that the kernels only take widened.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels import exl2_runtime
from qlinear.kernels.exl2 import Exl2TorchLinear
from qlinear.kernels.exl2_triton import Exl2TritonLinear
from qlinear.layouts import exl2
from qlinear.spec import Scheme
from qlinear.target import Target
from tests.oracle import exl2_numpy as oracle
from tests.test_exl2 import module
from tests.triton_interp import interpreted

INSTALL = "pip install -r requirements/triton-interpret.txt"
TOL = {torch.float16: 1e-3, torch.bfloat16: 1.5e-2}
N = 40  # not a multiple of 16: the layouts pad N
PARAMS = [exl2.Exl2Params((8, 6, 5, 4, 3, 2), (32, 32, 32, 64, 32, 64)),  # three segments, every width
          exl2.Exl2Params((6, 4, 4, 2), (64, 128, 128, 16)),  # groups of 128 and 16 in one segment: kernel group 16
          exl2.Exl2Params((3,), (96,), stored_perm=True),
          exl2.Exl2Params((4, 4, 3), (128, 128, 40))]  # a ragged last group: kernel groups of 8, padded rows


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import exl2_tc, qmm

    with interpreted(qmm.qmm_kernel), interpreted(exl2_tc.exl2_tc_kernel):
        yield


def scheme(p: exl2.Exl2Params, n: int = N) -> Scheme:
    return Scheme(bits=p.max_bits, group_size=-1, in_features=p.in_features, out_features=n, method="exl2",
                  format="exl2", layout_params=p)


def built(p: exl2.Exl2Params, seed: int, dtype: torch.dtype = torch.float16) -> tuple[Exl2TritonLinear, dict,
                                                                                       np.ndarray]:
    """A prepared layer, the file's tensors and the oracle's float16 weight ``[K, N]`` (input order) as float64."""
    t, _, _ = module(p, seed, N)
    lay = Exl2TritonLinear(scheme(p), bias=True, dtype=dtype)
    lay.load_state_dict(t)
    lay.prepare()
    a = {k: v.numpy() for k, v in t.items()}
    w = oracle.exl2_weight(a["q_weight"], a["q_invperm"], a["q_scale"], a["q_scale_max"], a["q_groups"],
                           p.in_features)
    return lay, t, w.astype(np.float64)


def segment_weight(pk) -> np.ndarray:
    """``[rows, N]`` float64 from a segment's words, read as the layout doc says (field j of word row w is sorted
    row ``(w // R) R PF + j R + w % R``; weight ``(code - zero) * scale`` of the row's group, rounded once to float16
    as a float16 forward forms it)."""
    pf = 32 // pk.bits
    words = pk.qweight.to(torch.int64).numpy() & 0xFFFFFFFF
    out = np.zeros((pk.kp, pk.np))
    r = pk.rows_per_block
    for w in range(words.shape[0]):
        for j in range(pf):
            row = (w // r) * r * pf + j * r + w % r
            code = (words[w] >> (pk.bits * j)) & ((1 << pk.bits) - 1)
            out[row] = (code - pk.zero_const) * pk.scales[row // pk.group].double().numpy()
    if pk.perm is not None:
        perm = pk.perm.numpy()
        live = np.zeros((pk.k, pk.np))
        live[perm[perm >= 0]] = out[perm >= 0]
        out = live
    return out[:pk.k, :pk.n].astype(np.float16).astype(np.float64)


@pytest.mark.parametrize("p", PARAMS)
def test_segments_hold_exactly_the_files_weight(p: exl2.Exl2Params) -> None:
    lay, t, w = built(p, 3)
    segs = exl2_runtime.segments(p)
    assert [s.bits for s in segs] == sorted({exl2_runtime.KERNEL_BITS[b] for b in p.group_bits}, reverse=True)
    stored = np.concatenate([segment_weight(pk) for pk in lay.packs()])  # stored row order
    inv = t["q_invperm"].to(torch.int64).numpy()
    assert np.array_equal(stored[inv], w)  # input row j is stored row q_invperm[j]
    assert lay.codes_replaced and "q_weight" not in dict(lay.named_buffers())


@pytest.mark.parametrize("p", PARAMS)
def test_q_weight_is_rebuilt_word_for_word(p: exl2.Exl2Params) -> None:
    lay, t, _ = built(p, 4)
    sd = lay.state_dict()
    for name, v in t.items():
        assert torch.equal(sd[name], v), name
    assert lay.codes_replaced  # saving rebuilt a transient copy only
    fresh = Exl2TorchLinear(scheme(p), bias=True)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.dequantize(), lay.dequantize())


def test_new_weights_load_into_a_prepared_layer_and_casts_keep_the_scales() -> None:
    p = PARAMS[0]
    lay, _, _ = built(p, 5)
    t2, _, _ = module(p, 6, N)
    lay.load_state_dict(t2)
    assert not lay.codes_replaced and torch.equal(lay.q_weight, t2["q_weight"])
    lay.to(torch.bfloat16)
    lay.prepare()
    assert all(pk.scales.dtype == torch.float16 for pk in lay.packs())
    assert torch.equal(lay.state_dict()["q_weight"], t2["q_weight"])


VARIANTS = {"gemv": ("gemv", 1, 128, 32, 3, 4, 1), "gemv4": ("gemv", 4, 32, 32, 3, 4, 1),
            "gemv_tc": ("gemv_tc", 16, 32, 32, 3, 2, 1), "skinny2": ("skinny2", 16, 32, 32, 2, 4, 1),
            "gemm2": ("gemm2", 32, 32, 32, 3, 4, 1), "dense": ("dense", 1, 32, 32, 1, 4, 1)}


@pytest.mark.parametrize(("variant", "m", "dtype", "p"), [
    ("gemv", 1, torch.bfloat16, PARAMS[0]), ("gemv4", 3, torch.float16, PARAMS[1]),
    ("gemv_tc", 9, torch.float16, PARAMS[0]), ("gemv_tc", 1, torch.bfloat16, PARAMS[1]),
    ("skinny2", 7, torch.bfloat16, PARAMS[2]), ("gemm2", 37, torch.float16, PARAMS[0]),
    ("dense", 20, torch.bfloat16, PARAMS[3]), ("gemv", 2, torch.float16, PARAMS[3])])
def test_variants_match_the_oracles_weight(variant: str, m: int, dtype: torch.dtype, p: exl2.Exl2Params) -> None:
    from qlinear.kernels.triton.configs import Config

    lay, t, w = built(p, 7, dtype)
    x = torch.randn(m, p.in_features, generator=torch.Generator().manual_seed(m)).to(dtype)
    y = lay.matmul(x, config=Config(*VARIANTS[variant]))
    ref = x.double().numpy() @ w + t["bias"].double().numpy()
    assert y.shape == (m, N) and y.dtype == dtype
    err = float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))
    assert err < TOL[dtype], f"{variant} {dtype}: relative error {err:.2e}"
    assert int(lay._rt_lock.abs().sum()) == 0


def test_forward_reshapes_and_explains_its_segments() -> None:
    p = PARAMS[0]
    lay, t, w = built(p, 8)
    x = torch.randn(2, 3, p.in_features, generator=torch.Generator().manual_seed(1)).half()
    y = lay(x)
    ref = x.double().reshape(6, -1).numpy() @ w + t["bias"].double().numpy()
    assert y.shape == (2, 3, N)
    assert float(np.abs(y.reshape(6, N).double().numpy() - ref).max()) < 1e-2 * float(np.abs(ref).max())
    why = lay.explain_call(6, "cpu")
    assert why.count("segment rows") == 3 and "8-bit words" in why and "2-bit words" in why
    assert "not one launch: M = 20 rows" in lay.explain_call(20, "cpu")
    assert lay.explain_call(1, "cpu").startswith("one launch (exl2_tc)")
    assert "above ONE_LAUNCH_MAX_M" in lay.explain_call(12, "cpu").splitlines()[0]
    with pytest.raises(ValueError, match="in_features"):
        lay(torch.randn(1, p.in_features + 1).half())
    with pytest.raises(ValueError, match="dtype"):
        lay(torch.randn(1, p.in_features))


def test_selector_runs_exl2_on_triton_on_cuda_and_torch_elsewhere() -> None:
    from qlinear.select import explain, select

    pr = Problem(scheme(PARAMS[0], 64), dtype=torch.bfloat16)
    cuda = Target.fake_cuda((9, 0), modules={"triton": True})
    choice = select(pr, cuda)
    assert choice.kernel is Exl2TritonLinear and "8-bit words" in choice.runs
    assert select(pr, Target.fake_cpu()).kernel is Exl2TorchLinear
    f32 = Problem(scheme(PARAMS[0], 64), dtype=torch.float32)
    assert select(f32, cuda).kernel is Exl2TorchLinear  # float32 activations: the exact torch decode
    no_triton = explain(pr, Target.fake_cuda((9, 0), modules={"triton": False}))
    verdict = next(v for v in no_triton.verdicts if v.kernel is Exl2TritonLinear)
    assert not verdict.ok and any("triton" in r for r in verdict.reasons)


@pytest.mark.parametrize(("m", "dtype", "p", "block_m"), [
    (1, torch.bfloat16, PARAMS[0], 8), (9, torch.float16, PARAMS[0], 16), (3, torch.float16, PARAMS[1], 8),
    (2, torch.bfloat16, PARAMS[2], 8), (16, torch.bfloat16, PARAMS[1], 16),
    (1, torch.float16, exl2.Exl2Params((5, 4, 3), (32, 64, 96)), 8)])  # two segments
def test_one_launch_runs_every_segment(m: int, dtype: torch.dtype, p: exl2.Exl2Params, block_m: int,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``exl2_tc``: all segments in one kernel (the per-segment launcher must not run), against float64."""
    from qlinear.kernels.triton import qmm
    from qlinear.kernels.triton.configs import Config

    lay, t, w = built(p, 11, dtype)

    def no_segment_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("a segment ran on its own")

    monkeypatch.setattr(qmm, "qmm", no_segment_launch)
    x = torch.randn(m, p.in_features, generator=torch.Generator().manual_seed(m)).to(dtype)
    cfg = Config("gemv_tc", block_m, 32, 64, 2, 2, 1, prefetch=m == 1)
    y = lay.matmul(x, variant="exl2_tc", config=cfg)
    ref = x.double().numpy() @ w + t["bias"].double().numpy()
    assert y.shape == (m, N) and y.dtype == dtype
    err = float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))
    assert err < TOL[dtype], f"exl2_tc {dtype} M={m}: relative error {err:.2e}"
    assert int(lay._rt_lock.abs().sum()) == 0  # the split-K counters were reset


def test_one_launch_refuses_what_gemv_tc_cannot_run() -> None:
    lay, _, _ = built(PARAMS[3], 12)  # a ragged last group: kernel groups of 8 codes
    x = torch.randn(1, PARAMS[3].in_features).half()
    with pytest.raises(ValueError, match="groups of 32"):
        lay.matmul(x, variant="exl2_tc")
    lay, _, _ = built(PARAMS[0], 12)
    with pytest.raises(ValueError, match="M = 17 rows"):
        lay.matmul(torch.randn(17, PARAMS[0].in_features).half(), variant="exl2_tc")


def test_x_plan_places_each_segments_sorted_rows_at_an_even_column() -> None:
    lay, t, _ = built(PARAMS[0], 13)
    plan = exl2_runtime.XPlan(lay._xidx, *lay._xcols)
    perm = torch.argsort(t["q_invperm"].to(torch.int64))  # stored row i is input row perm[i]
    for seg, pk, off, width in zip(lay._segments, lay.packs(), plan.offsets, plan.widths):
        assert off % 2 == 0 and width == (pk.kp if pk.perm is not None else pk.k)
        got = plan.index[off:off + width].to(torch.int64)
        local = pk.perm.to(torch.int64) if pk.perm is not None else torch.arange(pk.k)
        want = torch.where(local >= 0, perm[seg.row0 + local.clamp(min=0)], -1)
        assert torch.equal(got, want)


def test_the_default_takes_one_launch_up_to_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    from qlinear.kernels import exl2_triton
    from qlinear.kernels.triton import qmm

    lay, t, w = built(PARAMS[0], 14)
    cfg = lay.fused_config(1, torch.device("cpu"))
    assert cfg is not None and cfg.variant == "gemv_tc"
    assert (cfg.split_k, cfg.block_k, cfg.prefetch) == tuple(exl2_triton.ONE_LAUNCH_STEP.values())
    assert lay.fused_config(1, torch.device("cpu"), variant="gemv") is None  # another variant asked for
    assert lay.fused_config(exl2_triton.ONE_LAUNCH_MAX_M + 1, torch.device("cpu")) is None
    assert lay.fused_config(exl2_triton.ONE_LAUNCH_MAX_M + 1, torch.device("cpu"), variant="exl2_tc") is not None

    def no_segment_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError("a segment ran on its own")

    monkeypatch.setattr(qmm, "qmm", no_segment_launch)
    x = torch.randn(2, PARAMS[0].in_features, generator=torch.Generator().manual_seed(2)).half()
    ref = x.double().numpy() @ w + t["bias"].double().numpy()
    err = float(np.linalg.norm(lay(x).double().numpy() - ref) / np.linalg.norm(ref))
    assert err < TOL[torch.float16]
    monkeypatch.setattr(exl2_triton, "ONE_LAUNCH_MAX_M", 0)  # off: the segments one by one
    assert lay.fused_config(1, torch.device("cpu")) is None
