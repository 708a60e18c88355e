"""``VPTQCpuLinear`` (``kernels/vptq_cpu.py``, the native extra's ``vq_mv``) against float64.

The reference is ``tests/oracle/vptq_numpy.py``'s decode of the same codes with its per-operation roundings taken
to float32 instead of the codebook dtype (``vq_mv`` sums in float32 without the producers' roundings), times x in
float64; the producers' own rounding is bounded separately against ``VPTQLinear``. Cases: residual codebooks,
outlier columns, permutation, both norms, bias, float16 and bfloat16 codebooks, several row counts (M above
``MV_MAX_M`` runs the decoded tiles). Skipped without the native extra (``pip install ./native``).
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels import vptq_cpu
from qlinear.kernels.vptq import VPTQLinear
from qlinear.kernels.vptq_cpu import VPTQCpuLinear
from qlinear.layouts import vptq
from qlinear.select import explain, select
from qlinear.target import Target
from tests import vptq_cases
from tests.oracle import vptq_numpy
from tests.test_vptq_kernels import CASES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("qlinear_native") is None
                                or importlib.util.find_spec(vptq_cpu.NATIVE) is None,
                                reason=f"the native extra is not installed: pip install {vptq_cpu.INSTALL}")

MORE = [dict(k=256, n=64, v=8, c=256, r=16, gs=128, perm=True, norm=True, bias=True, m=9, seed=7),  # the V=8 path
        dict(k=200, n=30, v=8, c=1024, gs=64, seed=8, dtype=torch.bfloat16, m=9),  # a padded last group
        # the any-V registers (vq_wide.c): two registers an entry with a masked tail and a
        # residual; two full ones from bfloat16; float32 codebooks with a 2-value tail, one row (4 sets of sums)
        dict(k=96, n=48, v=12, c=64, r=16, gs=32, norm=True, seed=9, m=5),
        dict(k=64, n=32, v=16, c=32, gs=64, seed=10, dtype=torch.bfloat16, m=2),
        dict(k=64, n=20, v=10, c=32, gs=64, seed=11, dtype=torch.float32, m=1),
        # one register with a masked tail (float16 v6); an odd tail from float32 (v5: no 32-bit lane holds just the
        # last bfloat16 value of a decoded run); past two registers (v24: the scalar loops)
        dict(k=64, n=30, v=6, c=64, r=8, gs=64, seed=12, m=3),
        dict(k=64, n=25, v=5, c=32, gs=64, seed=13, dtype=torch.float32, m=4),
        dict(k=64, n=48, v=24, c=32, gs=32, seed=14, m=2)]


def build(kw: dict, x_dtype: torch.dtype):
    meta, t = vptq_cases.make_case("c", **kw)
    packed = vptq.pack_indices(t["idx"], t.get("res"), vptq_cases.params(meta))
    state = vptq_cases.checkpoint_tensors(meta, t, packed) | ({"bias": t["bias"]} if "bias" in t else {})
    fast = VPTQCpuLinear(vptq_cases.scheme(meta), bias="bias" in t, dtype=x_dtype)
    fast.load_state_dict(state, strict=True)
    exact = VPTQLinear(vptq_cases.scheme(meta), bias="bias" in t, dtype=x_dtype)
    exact.load_state_dict(state, strict=True)
    w32 = vptq_numpy.dequantize(meta | {"dtype": "float32"}, {k: v.double().numpy() for k, v in t.items()},
                                packed.numpy())
    return meta, t, fast, exact, torch.from_numpy(w32)


@pytest.mark.parametrize("kw", CASES + MORE)
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_matches_float64(kw: dict, x_dtype: torch.dtype) -> None:
    meta, t, fast, exact, w = build(kw, x_dtype)
    bias = t["bias"].double() if "bias" in t else 0
    for m in (1, 2, 3, 5, 8, 9, 16, vptq_cpu.MV_MAX_M):  # 1-2 row kernels, 3..8-row ones, passes, the bound
        x = torch.randn(m, meta["K"], generator=torch.Generator().manual_seed(m)).to(x_dtype)
        y = fast(x)
        assert y.dtype == x_dtype and y.shape == (m, meta["N"])
        ref = x.double() @ w.t() + bias
        eps = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 2e-6}[x_dtype]
        err = float((y.double() - ref).abs().max() / ref.abs().max())
        assert err < eps, (m, err)
        # the producers round each operation to the codebook dtype: VPTQLinear differs from ours by that much
        diff = float((exact(x).double() - y.double()).abs().max() / ref.abs().max())
        assert diff < 2e-2, (m, diff)


@pytest.mark.parametrize("kw", CASES + MORE)
def test_more_rows_decode_bfloat16_tiles(kw: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above ``MV_MAX_M`` rows: ``vq_decode`` tiles (small tiles here: several per layer) and bfloat16 GEMMs."""
    monkeypatch.setattr(vptq_cpu, "TILE_ELEMENTS", 8 * 64)
    meta, t, fast, _, w = build(kw, torch.bfloat16)
    m = vptq_cpu.MV_MAX_M + 3
    x = torch.randn(m, meta["K"], generator=torch.Generator().manual_seed(m)).bfloat16()
    ref = x.double() @ w.t() + (t["bias"].double() if "bias" in t else 0)
    err = float((fast(x).double() - ref).abs().max() / ref.abs().max())
    assert err < 1.5e-2, err  # bfloat16 weights and partial products


def test_a_gradient_takes_the_exact_tiles() -> None:
    meta, _, fast, exact, _ = build(MORE[0], torch.float32)
    x = torch.randn(2, meta["K"], requires_grad=True)
    y = fast(x)
    assert torch.equal(y.detach(), exact(x).detach())  # VPTQLinear's tiles ran
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_selected_on_cpu_with_the_native_extra_and_refused_without() -> None:
    meta, _ = vptq_cases.make_case("c", **CASES[0])
    s = vptq_cases.scheme(meta)
    assert select(Problem(s, torch.bfloat16), Target.fake_cpu(modules={vptq_cpu.NATIVE: True})).kernel is VPTQCpuLinear
    native = Target.fake_cpu(modules={vptq_cpu.NATIVE: True})
    assert select(Problem(s, torch.float32), native).kernel is VPTQLinear  # AUTO: the producers' roundings
    assert select(Problem(s, torch.float32), native, "vptq_cpu").kernel is VPTQCpuLinear  # named: float32 sums
    without = Target.fake_cpu(modules={})
    assert select(Problem(s, torch.bfloat16), without).kernel is VPTQLinear
    verdict = next(v for v in explain(Problem(s, torch.bfloat16), without).verdicts if v.kernel is VPTQCpuLinear)
    assert any("pip install ./native" in r for r in verdict.reasons)


def test_bad_input_is_named() -> None:
    meta, _, fast, _, _ = build(CASES[0], torch.float16)
    with pytest.raises(ValueError, match="in_features|last dimension"):
        fast(torch.randn(1, meta["K"] + 1).half())
    p = vptq_cases.params(meta)  # 3 groups of 32 codes of 10 bits: 10 words a vector
    with pytest.raises(ValueError, match=r"W \* 32 >= gs \* bits.*W=2"):
        codes = vptq_cpu.Codes.of(torch.zeros(3, 5, 2, dtype=torch.int32), torch.zeros(3, 64 * 8).half(),
                                  torch.zeros(3, 16 * 8).half(), p)
        vptq_cpu.main_product(torch.randn(2, meta["K"]), codes, meta["N"])
    # more rows than one call takes (8, or 16 for V = 8 with AVX-512): the bound named
    mod = vptq_cpu.native()
    rows = mod.max_m(8, "float16")
    assert rows in (8, 16) and mod.max_m(12, "float16") == 8 and mod.max_m(8, "float32") == 8
    codes = vptq_cpu.Codes.of(torch.zeros(3, 5, 10, dtype=torch.int32), torch.zeros(3, 64 * 8).half(),
                              torch.zeros(3, 16 * 8).half(), p)
    x, y = torch.zeros(rows + 1, meta["K"]), torch.zeros(rows + 1, 5 * 8)
    with pytest.raises(ValueError, match=rf"1 <= M <= {rows}.*M={rows + 1}"):
        mod.vq_mv(*codes.pointers, x.data_ptr(), y.data_ptr(), rows + 1, *codes.sizes, meta["K"], meta["K"], 5 * 8,
                  8, *codes.bits, codes.dtype, 1)


@pytest.mark.parametrize("kw", [MORE[0], MORE[2]])
def test_rows_bound_switches_to_the_tiles(kw: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """``vq_mv`` up to ``MV_MAX_M`` rows, the decoded tiles above; ``explain`` names the bound."""
    meta, _, fast, _, _ = build(kw, torch.bfloat16)
    ran: list[str] = []
    for name in ("main_product", "decode_product"):
        real = getattr(vptq_cpu, name)
        monkeypatch.setattr(vptq_cpu, name, lambda *a, real=real, name=name: ran.append(name) or real(*a))
    for m in (vptq_cpu.MV_MAX_M, vptq_cpu.MV_MAX_M + 1):
        fast(torch.randn(m, meta["K"]).bfloat16())
    assert ran == ["main_product", "decode_product"]
    text = VPTQCpuLinear.describe_runs(Problem(fast.scheme, torch.bfloat16), Target.fake_cpu(modules={}))
    assert f"up to M={vptq_cpu.MV_MAX_M}," in text


def test_large_codebooks_switch_to_the_tiles_sooner() -> None:
    """Codebooks past ``TABLE_BYTES`` (v16 k65536 with a residual k65536: 4 MiB) take the tiles above
    ``MV_MAX_M_LARGE_TABLES`` rows; v8 k65536 (1 MiB) keeps ``MV_MAX_M``; ``explain`` says which."""
    def params(v: int, res: int) -> vptq.VptqParams:
        return vptq.VptqParams(vector_len=v, num_centroids=65536, group_num=1, group_size=4096,
                               num_res_centroids=res, codebook_dtype=torch.float16)

    assert vptq_cpu.mv_max_m(params(8, 0)) == vptq_cpu.MV_MAX_M
    assert vptq_cpu.mv_max_m(params(16, 65536)) == vptq_cpu.MV_MAX_M_LARGE_TABLES < vptq_cpu.MV_MAX_M
    assert 2 * 65536 * 16 * 2 > vptq_cpu.TABLE_BYTES >= 65536 * 8 * 2
    _, _, fast, _, _ = build(MORE[2], torch.bfloat16)
    p = replace(fast.scheme.layout_params, num_centroids=65536, num_res_centroids=65536, vector_len=16)
    text = VPTQCpuLinear.describe_runs(Problem(replace(fast.scheme, layout_params=p), torch.bfloat16),
                                       Target.fake_cpu(modules={}))
    assert f"up to M={vptq_cpu.MV_MAX_M_LARGE_TABLES}," in text


@pytest.mark.parametrize("residual", [16, 0])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decoded_tiles_are_the_float32_decode_rounded_once(dtype: torch.dtype, residual: int) -> None:
    """``vq_decode``'s bfloat16 tile (V = 8, several groups) is bit for bit the oracle's float32 decode rounded to
    nearest even: with a residual codebook, entries summed and rounded per code (VCVTNEPS2BF16 where the CPU has
    AVX512-BF16, integer rounding otherwise); without, copied from the codebook as ``decode_product`` hands it over
    (``Codes.tile_codes``: a float16 one rounded to bfloat16 once per call)."""
    kw = dict(k=256, n=64, v=8, c=256, gs=128, seed=12, dtype=dtype) | ({"r": residual} if residual else {})
    meta, _, fast, _, w = build(kw, torch.bfloat16)
    codes = vptq_cpu.Codes.of(fast.tensors()["indices"], fast.tensors()["centroids.weight"],
                              fast.tensors().get("res_centroids.weight"), fast.params).tile_codes()
    assert codes.dtype == ("float16" if residual and dtype == torch.float16 else "bfloat16")
    j, v, k = codes.sizes[1], codes.v, meta["K"]
    tile = torch.empty(k, j * v, dtype=torch.bfloat16)
    vptq_cpu.native().vq_decode(*codes.pointers, tile.data_ptr(), *codes.sizes, k, 0, j, j * v, v, *codes.bits,
                                codes.dtype, 1)
    want = w.to(torch.float32).to(torch.bfloat16).t()  # [K, N]
    assert torch.equal(tile[:, :meta["N"]].view(torch.int16), want.contiguous().view(torch.int16))
