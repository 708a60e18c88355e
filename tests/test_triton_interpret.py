"""The Triton kernels (every variant) in Triton's CPU interpreter against the float64 numpy oracles.

TRITON_INTERPRET=1 is set here, at collection, before anything imports the kernel bodies (``triton.jit``
decides interpreted-or-compiled when a body is defined). Only the bodies care: other tests are unaffected.
Error metric ``|y - ref| / |ref|`` (Frobenius): float16 4e-3; bfloat16 1.5e-2 (the interpreter rounds
float32 -> bfloat16 by truncation, twice the error of the GPU's round-to-nearest).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import functools
from dataclasses import replace

import numpy as np
import pytest
import torch

from qlinear import Scheme, quantize_rtn
from qlinear.affine import AffineWeight
from qlinear.caps import Problem
from qlinear.kernels.triton.configs import VARIANTS, Config
from qlinear.kernels.triton_awq import AwqGEMMTritonLinear
from qlinear.kernels.triton_gptq import TritonV2Linear
from qlinear.packing import hf_repack_layer
from qlinear.target import Target
from tests.oracle import awq_numpy
from tests.oracle.gptq_numpy import dequantize_checkpoint
from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"
TOL = {torch.float16: 4e-3, torch.bfloat16: 1.5e-2}


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """Skip without triton; run bodies interpreted; float32 dots for bfloat16 (the interpreter's numpy
    matmul would multiply bfloat16 bit patterns as integers)."""
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import qmm

    with interpreted(qmm.qmm_kernel):
        yield


def make_weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, ::8] = -0.05  # a negative minimum per group keeps asymmetric zeros above 0 (v1 cannot hold 0)
    return w


def rel_err(y: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))


# fmt, bits, group, sym, desc_act, pack dtype, K, N, dtype
GPTQ = [
    ("gptq_v2", 4, 128, True, False, torch.int32, 200, 72, torch.float16),
    ("gptq_v2", 4, 32, False, True, torch.int32, 160, 37, torch.bfloat16),
    ("gptq", 4, -1, False, False, torch.int16, 96, 40, torch.float16),
    ("gptq_v2", 2, 128, False, True, torch.int32, 256, 48, torch.bfloat16),
    ("gptq_v2", 2, 32, True, False, torch.int8, 96, 33, torch.float16),
    ("gptq", 2, -1, True, True, torch.int32, 160, 40, torch.bfloat16),
    ("gptq_v2", 8, 128, False, False, torch.int32, 200, 40, torch.bfloat16),
    ("gptq_v2", 8, 32, True, True, torch.int16, 96, 24, torch.float16),
    ("gptq", 8, 16, False, True, torch.int32, 64, 40, torch.float16),
]


@functools.cache
def gptq_layer(case: tuple) -> tuple[TritonV2Linear, np.ndarray, np.ndarray]:
    fmt, bits, group, sym, desc, pack, k, n, dtype = case
    q = quantize_rtn(make_weight(n, k, bits * 997 + k + n), bits=bits, group_size=group, sym=sym, desc_act=desc)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.1
    scheme = Scheme(bits=bits, group_size=group, in_features=k, out_features=n, sym=sym, desc_act=desc,
                    format=fmt, pack_dtype=pack)
    layer = TritonV2Linear(scheme, bias=True, dtype=dtype)
    layer.load_affine(q, bias)
    layer.prepare()
    sd = {name: t.numpy() for name, t in layer.state_dict().items() if name != "bias"}
    return layer, dequantize_checkpoint(sd, bits, k, n, fmt), layer.bias.double().numpy()


def forced(variant: str, bits: int) -> tuple[Config, int]:
    """Small tiles, split-K and several M tiles, so masks, the K tail, groups and the reduction all run."""
    pf = 32 // bits
    return {
        "gemv": (Config("gemv", 2, 32, 4 * pf, 3, 4, 1), 3),
        "skinny": (Config("skinny", 16, 32, max(32, 2 * pf), 2, 4, 1), 7),
        "gemm": (Config("gemm", 32, 32, 64, 2, 4, 1), 37),
        "skinny2": (Config("skinny2", 16, 32, 32, 2, 4, 1), 7),
        "skinny3": (Config("skinny3", 16, 32, 32, 3, 4, 1), 7),
        "gemm2": (Config("gemm2", 32, 32, 64, 3, 4, 1), 37),
        "gemm3": (Config("gemm3", 16, 32, 32, 3, 4, 1), 37),
        "gemm4": (Config("gemm4", 16, 64, 64, 3, 4, 2), 37),  # Gluon: no interpreter, so it must refuse
        "gemm5": (Config("gemm5", 16, 64, 64, 3, 4, 2), 37),
        "dense": (Config("dense", 1, 32, 8 * pf, 1, 4, 1), 9),
        # one 32-column strip walked by 2 warps in turn, two 8-row sets, next step prefetched
        "gemv_tc": (Config("gemv_tc", 16, 32, 128, 3, 2, 1, prefetch=True), 13),
    }[variant]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", GPTQ, ids=lambda c: f"{c[0]}-{c[1]}b-g{c[2]}-{'sym' if c[3] else 'asym'}"
                         f"{'-act' if c[4] else ''}-{str(c[8])[6:]}")
def test_gptq_variant_matches_oracle(case: tuple, variant: str) -> None:
    layer, w64, b64 = gptq_layer(case)
    cfg, m = forced(variant, case[1])
    dtype = case[8]
    x = torch.randn(m, case[6], generator=torch.Generator().manual_seed(m)).to(dtype)
    if variant in ("gemm4", "gemm5"):  # no CUDA device: a Gluon kernel names why it cannot run (numerics: H200)
        takes = case[1] == 4 or (variant == "gemm5" and case[1] == 8)  # gemm5 takes 8-bit words too
        reason = "no CUDA device" if takes else f"{case[1]}-bit words"
        with pytest.raises(ValueError, match=f"{variant} cannot run this call: .*{reason}"):
            layer.matmul(x, config=cfg)
        return
    if variant in ("skinny3", "gemm3") and case[1] != 4:
        with pytest.raises(ValueError, match=f"{variant} cannot run this call: {case[1]}-bit words"):
            layer.matmul(x, config=cfg)
        return
    if variant == "gemv_tc" and case[1] == 8 and case[2] == 16:  # 8-bit g16: field blocks of 4 word rows
        with pytest.raises(ValueError, match="gemv_tc cannot run this call: field blocks of 4 word rows"):
            layer.matmul(x, config=cfg)
        return
    y = layer.matmul(x, config=cfg)
    assert y.shape == (m, case[7]) and y.dtype == dtype
    assert rel_err(y, x.double().numpy() @ w64.T + b64) < TOL[dtype]
    assert int(layer._rt_lock.abs().sum()) == 0  # split-K counters are left at zero for the next call


@pytest.mark.parametrize("variant, split", [("gemv", 11), ("skinny2", 9), ("gemm2", 5)])
def test_split_k_reduction_over_several_load_batches(variant: str, split: int) -> None:
    """The last split of a tile loads the partials 8 (or fewer, for big tiles) at a time: more splits than
    one batch, and a count that is no multiple of it, still sum every partial exactly once."""
    case = GPTQ[0]
    layer, w64, b64 = gptq_layer(case)
    cfg, m = forced(variant, case[1])
    cfg = replace(cfg, split_k=split, block_k=32 // case[1] * (1 if variant == "gemv" else 4))
    x = torch.randn(m, case[6], generator=torch.Generator().manual_seed(2)).to(case[8])
    y = layer.matmul(x, config=cfg)
    assert rel_err(y, x.double().numpy() @ w64.T + b64) < TOL[case[8]]
    assert int(layer._rt_lock.abs().sum()) == 0


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("case", GPTQ, ids=lambda c: f"{c[1]}b-g{c[2]}{'-act' if c[4] else ''}-{str(c[8])[6:]}")
def test_gemv_rows_per_program_match_oracle(case: tuple, rows: int) -> None:
    """The GEMV with 1 and 4 rows per program (``block_m``; the forced config above has 2): M = 5 leaves a
    partial last program (its rows past M re-read row M - 1 and are not stored), split-K included."""
    layer, w64, b64 = gptq_layer(case)
    cfg, _ = forced("gemv", case[1])
    x = torch.randn(5, case[6], generator=torch.Generator().manual_seed(11)).to(case[8])
    y = layer.matmul(x, config=replace(cfg, block_m=rows))
    assert rel_err(y, x.double().numpy() @ w64.T + b64) < TOL[case[8]]
    assert int(layer._rt_lock.abs().sum()) == 0


@pytest.mark.parametrize("case", GPTQ[:4] + GPTQ[6:8], ids=lambda c: f"{c[1]}b-g{c[2]}{'-act' if c[4] else ''}")
def test_gemv_prefetch_matches_oracle(case: tuple) -> None:
    """The gemv body with the next step's words loaded ahead (clamped rows, split-K tails included)."""
    from qlinear.kernels.triton.qmm import qmm

    layer, w64, b64 = gptq_layer(case)
    cfg, m = forced("gemv", case[1])
    x = torch.randn(m, case[6], generator=torch.Generator().manual_seed(5)).to(case[8])
    layer.ensure_prepared()
    y = qmm(x, layer.packed(), replace(cfg, prefetch=True), layer.bias, layer._rt_lock)
    assert rel_err(y, x.double().numpy() @ w64.T + b64) < TOL[case[8]]
    assert int(layer._rt_lock.abs().sum()) == 0


@pytest.mark.parametrize(("case", "wn", "warps", "split", "prefetch", "m", "rows", "sums"),
                         [(GPTQ[0], 2, 2, 1, False, 1, 16, 4), (GPTQ[1], 1, 4, 2, True, 8, 16, 4),
                          (GPTQ[2], 1, 2, 5, True, 3, 8, 4), (GPTQ[3], 2, 4, 3, False, 16, 16, 1),
                          (GPTQ[4], 1, 2, 2, True, 9, 16, 2), (GPTQ[5], 2, 2, 4, True, 2, 8, 4),
                          (GPTQ[0], 2, 2, 3, False, 21, 8, 16), (GPTQ[6], 2, 2, 3, True, 1, 8, 4),
                          (GPTQ[7], 1, 4, 2, False, 11, 16, 4)],
                         ids=lambda v: f"{v[1]}b-g{v[2]}" if isinstance(v, tuple) else str(v))
def test_gemv_tc_tilings_match_oracle(case: tuple, wn: int, warps: int, split: int, prefetch: bool, m: int,
                                      rows: int, sums: int) -> None:
    """The tensor-core GEMV's tilings (its plain-Triton twin here): warps along N and along K (their sums
    meet in shared memory), split-K over CTAs, prefetch, one or two 8-row sets per program (``rows``),
    several programs along M (each with its own split-K counter), partial last sets, and the split-K
    epilogue summing 2 to 16 rows per pass (``sum_values``)."""
    layer, w64, b64 = gptq_layer(case)
    cfg = Config("gemv_tc", rows, 32 * wn, 4 * 32 // case[1], split, warps, 1, prefetch=prefetch,
                 sum_values=sums)
    x = torch.randn(m, case[6], generator=torch.Generator().manual_seed(m)).to(case[8])
    y = layer.matmul(x, config=cfg)
    assert rel_err(y, x.double().numpy() @ w64.T + b64) < TOL[case[8]]
    assert int(layer._rt_lock.abs().sum()) == 0


@pytest.mark.parametrize(("case", "unit", "m"),
                         [(("gptq_v2", 4, 32, False, True, torch.int32, 384, 40, torch.bfloat16), 4, 9),
                          (("gptq_v2", 4, 64, False, False, torch.int32, 512, 24, torch.float16), 2, 1),
                          (("gptq_v2", 2, 32, True, False, torch.int32, 256, 33, torch.float16), 4, 3),
                          (GPTQ[3], 2, 2)],
                         ids=lambda v: f"{v[1]}b-g{v[2]}" if isinstance(v, tuple) else str(v))
@pytest.mark.parametrize("vector_params", [False, True])
def test_gemv_tc_steps_of_several_groups_match_oracle(case: tuple, unit: int, m: int, vector_params: bool) -> None:
    """Groups smaller than a step (g32 / g64 with 2 or 4 chunks a step, 2-bit g128 with 2 chunks of 128
    codes: each group's terms added after its chunks; asymmetric zeros per group, act-order)."""
    from qlinear.kernels.triton.qmv_tc import units

    layer, w64, b64 = gptq_layer(case)
    layer.ensure_prepared()
    p = layer.packed()
    ck = p.rows_per_block * 32 // case[1]
    assert units(p, unit * ck) == unit
    cfg = Config("gemv_tc", 16, 32, unit * ck, 2, 2, 1, prefetch=True, vector_params=vector_params)
    x = torch.randn(m, case[6], generator=torch.Generator().manual_seed(m)).to(case[8])
    y = layer.matmul(x, config=cfg)
    assert rel_err(y, x.double().numpy() @ w64.T + b64) < TOL[case[8]]
    assert int(layer._rt_lock.abs().sum()) == 0


def test_gemv_tc_is_picked_by_m_and_skipped_where_it_cannot_run() -> None:
    """Without a device table the defaults give M <= 8 to gemv_tc (2, 4 and 8-bit); groups too short for a
    field block (8-bit g16: 4 word rows) fall back to what the crossovers give without it."""
    four, _, _ = gptq_layer(GPTQ[0])
    eight, _, _ = gptq_layer(GPTQ[6])
    short, _, _ = gptq_layer(GPTQ[8])
    cpu = torch.device("cpu")
    assert [four.config_for(m, cpu).variant for m in (1, 8, 9, 40)] == ["gemv_tc", "gemv_tc", "skinny2", "gemm3"]
    assert [eight.config_for(m, cpu).variant for m in (1, 4, 40)] == ["gemv_tc", "gemv_tc", "gemm2"]
    assert [short.config_for(m, cpu).variant for m in (1, 4, 40)] == ["gemv", "skinny2", "gemm2"]


def test_explain_call_agrees_with_the_config_the_forward_runs() -> None:
    """``explain_call`` names the variant and tiles ``config_for`` gives, and the layer's own reasons."""
    cpu = torch.device("cpu")
    for case in (GPTQ[0], GPTQ[6]):
        layer, _, _ = gptq_layer(case)
        for m in (1, 9, 100, 3000):
            cfg = layer.config_for(m, cpu)
            first, *rest = layer.explain_call(m, "cpu").splitlines()
            assert first.startswith(f"M={m}: {cfg.variant} — "), first
            assert f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}, split-K {cfg.split_k}, {cfg.num_warps} warps" in first
            assert len(rest) == len(VARIANTS) - 1
    assert "  gemm3: 8-bit words (gemm3 pairs 4-bit codes)" in layer.explain_call(100, "cpu").splitlines()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device here"):
            layer.explain_call(100)


def test_gemm3_declares_what_it_cannot_run() -> None:
    """gemm3 (4-bit codes paired by PTX) names each reason; bfloat16 pairs need sm_90, float16 sm_80."""
    from qlinear.kernels.triton.qmm3 import skinny3_reasons

    four, _, _ = gptq_layer(GPTQ[0])
    eight, _, _ = gptq_layer(GPTQ[6])
    p = four.packed()
    assert skinny3_reasons(p, 300, torch.bfloat16, "gemm3", (9, 0)) == []
    assert skinny3_reasons(p, 300, torch.float16, "gemm3", (8, 0)) == []
    assert skinny3_reasons(p, 300, torch.bfloat16, "gemm3", (8, 0)) == [
        "compute capability 8.0 (needs 9.0+ for bfloat16 (sub/mul.bf16x2))"]
    assert "M=300 > 16" in skinny3_reasons(p, 300, torch.float16, "skinny3")[0]
    assert skinny3_reasons(eight.packed(), 64, torch.float16, "gemm3") == ["8-bit words (gemm3 pairs 4-bit codes)"]


def test_gemm4_declares_what_it_cannot_run() -> None:
    """gemm4 (Gluon: wgmma + TMA) runs 4-bit weights in 8-row field blocks on sm_90 only, and says which part
    of a call is out of reach; the layer then takes the next variant by M."""
    from qlinear.kernels.triton.gemm4_limits import gemm4_reasons

    four, _, _ = gptq_layer(GPTQ[0])
    eight, _, _ = gptq_layer(GPTQ[6])
    p = four.packed()
    assert p.rows_per_block == 8
    assert gemm4_reasons(p, 100, torch.bfloat16, (9, 0)) == []
    assert gemm4_reasons(p, 100, torch.float16, (8, 0)) == ["compute capability 8.0 (Gluon wgmma + TMA: sm_90 only)"]
    assert gemm4_reasons(p, 100, torch.float16, None) == ["no CUDA device (Gluon wgmma + TMA: sm_90 only)"]
    assert "8-bit words" in gemm4_reasons(eight.packed(), 100, torch.float16, (9, 0))[0]
    narrow = replace(p, rows_per_block=4)
    assert any("field blocks of 4 word rows" in r for r in gemm4_reasons(narrow, 100, torch.float16, (9, 0)))
    odd = replace(p, k=p.k - 3)
    assert gemm4_reasons(odd, 100, torch.float16, (9, 0)) == [
        f"K = {p.k - 3} (TMA needs 16-byte activation rows: K % 8 == 0)"]
    assert four.config_for(100, torch.device("cpu")).variant == "gemm3"  # the interpreter cannot run gemm4


def test_gemm4_names_the_tiles_its_layouts_cannot_take() -> None:
    """A forced config outside the A-fragment layout (channels per warp, wgmma's N, whole field blocks) is a
    clear error before anything compiles."""
    from qlinear.kernels.triton.qmm4 import tile_errors

    assert tile_errors(Config("gemm4", 128, 128, 128, 1, 8, 4), 128) == []
    assert tile_errors(Config("gemm4", 16, 64, 128, 1, 4, 4), 128) == []
    assert tile_errors(Config("gemm4", 64, 64, 128, 1, 8, 4), 128) == [
        "block_n 64 (expected 16, 32 or 64 channels a warp: 128, 256 or 512)"]
    assert tile_errors(Config("gemm4", 48, 128, 96, 1, 2, 1), 96) == [
        "num_warps 2 (expected 4 or 8: one or two warpgroups)",
        "block_m 48 (expected 16..256, a power of two: wgmma's N)",
        "block_k 96 (expected 64..512 codes, whole 8-row field blocks)",
        "num_stages 1 (expected 2+: the x ring refills the slot of the step before)"]
    assert tile_errors(Config("gemm4", 256, 128, 64, 1, 4, 4), 64)[0].startswith(
        "block_m x block_n 256x128 on 4 warps (a 256-register accumulator a thread")
    assert tile_errors(Config("gemm5", 128, 64, 128, 1, 4, 4, max_registers=128), 128) == []
    assert tile_errors(Config("gemm5", 256, 64, 64, 1, 4, 4, max_registers=128), 64)[0].startswith(
        "max_registers 128 for block_m 256 (one wgmma holds block_m / 2 accumulator registers, the tile 128")


def test_shipped_gemm4_and_gemm5_configs_fit_their_layouts() -> None:
    """Every H200 table entry and every heuristic config of the Gluon variants passes their tile checks (the
    sweeps timed them; a forced config outside is refused by the same checks)."""
    from qlinear.kernels.triton import configs
    from qlinear.kernels.triton.qmm4 import tile_errors

    table = configs.device_table("NVIDIA H200")["configs"]
    seen = []
    for key in table:
        variant, rest = key.split(":", 1)
        if variant in ("gemm4", "gemm5"):
            f = dict(part.split("=") for part in rest.split(":"))
            cfg = configs.legal(configs.choose("NVIDIA H200", 132, int(f["m"]), int(f["n"]), int(f["k"]), 4,
                                               int(f["g"]), variant), int(f["m"]), int(f["k"]), 4)
            seen.append((key, tile_errors(cfg, cfg.block_k)))
    for m in (9, 16, 33, 64, 100, 128, 200, 256, 600, 1024, 4096):
        for n, k in ((4096, 4096), (28672, 8192), (3072, 3072), (512, 14336)):
            for variant in ("gemm4", "gemm5"):
                cfg = configs.legal(configs.heuristic(variant, 132, m, n, k, 4, 128), m, k, 4)
                seen.append((f"{variant} heuristic m={m} n={n} k={k}", tile_errors(cfg, cfg.block_k)))
    assert len(seen) > 100
    assert [(what, bad) for what, bad in seen if bad] == []


def test_gemm4_needs_a_triton_with_gluon(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older Triton (the extra allows 3.4) makes gemm4 a reason, not an import error in the layer."""
    import triton

    from qlinear.kernels.triton import gemm4_limits

    four, _, _ = gptq_layer(GPTQ[0])
    gemm4_limits.gluon_missing.cache_clear()
    monkeypatch.setattr(triton, "__version__", "3.5.1")
    try:
        assert gemm4_limits.gemm4_reasons(four.packed(), 100, torch.float16, (9, 0)) == [
            "triton 3.5.1 (Gluon kernels need 3.6+)"]
    finally:
        gemm4_limits.gluon_missing.cache_clear()


@pytest.mark.parametrize("m", [1, 4, 16, 40, 1100])
def test_forward_picks_a_variant_per_m(m: int) -> None:
    layer, w64, b64 = gptq_layer(GPTQ[1])
    x = torch.randn(2, (m + 1) // 2, 160, dtype=torch.bfloat16)
    y = layer(x)
    assert y.shape == (2, (m + 1) // 2, 37)
    assert rel_err(y.reshape(-1, 37), x.reshape(-1, 160).double().numpy() @ w64.T + b64) < TOL[torch.bfloat16]


def test_irregular_groups_are_padded() -> None:
    """A g_idx whose groups have unequal sizes (not GPTQ's act-order) still runs: groups are padded."""
    k, n, bits = 120, 40, 4
    g = torch.Generator().manual_seed(5)
    g_idx = torch.randint(0, 4, (k,), generator=g, dtype=torch.int32)
    g_idx[:4] = torch.arange(4, dtype=torch.int32)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, 4, generator=g) * 0.01 + 0.001
    zeros = torch.randint(1, 15, (n, 4), generator=g, dtype=torch.int32)
    q = AffineWeight(codes, scales, zeros, g_idx, bits, 32, False)
    layer = TritonV2Linear(Scheme(bits=4, group_size=32, in_features=k, out_features=n, sym=False, desc_act=True))
    layer.load_affine(q)
    layer.prepare()
    sd = {name: t.numpy() for name, t in layer.state_dict().items()}
    w64 = dequantize_checkpoint(sd, bits, k, n, "gptq_v2")
    assert layer.packed().kp > k  # padded
    x = torch.randn(5, k, dtype=torch.float16)
    for variant in VARIANTS:
        cfg, _ = forced(variant, bits)
        if variant in ("skinny3", "gemm3", "gemv_tc", "gemm4", "gemm5"):  # groups padded to 40 rows: 1-row blocks
            with pytest.raises(ValueError, match="field blocks of 1 word rows"):
                layer.matmul(x, config=cfg)
            continue
        assert rel_err(layer.matmul(x, config=cfg), x.double().numpy() @ w64.T) < TOL[torch.float16]


@pytest.mark.parametrize(("group", "sym", "dtype"), [(128, False, torch.float16), (32, True, torch.bfloat16),
                                                     (-1, False, torch.float16)])
def test_awq_gemm_matches_oracle(group: int, sym: bool, dtype: torch.dtype) -> None:
    k, n = 256, 72
    q = quantize_rtn(make_weight(n, k, group + 7), bits=4, group_size=group, sym=sym)
    layer = AwqGEMMTritonLinear(Scheme(bits=4, group_size=group, in_features=k, out_features=n, sym=sym,
                                       method="awq", format="gemm"), dtype=dtype)
    layer.load_affine(q)
    layer.prepare()
    sd = {name: t.numpy() for name, t in layer.state_dict().items()}
    w64 = awq_numpy.dequantize("gemm", sd, 4, k, n, layer.scheme.group_size)
    for variant in VARIANTS:
        cfg, m = forced(variant, 4)
        x = torch.randn(m, k).to(dtype)
        if variant in ("gemm4", "gemm5"):
            with pytest.raises(ValueError, match=f"{variant} cannot run this call: .*no CUDA device"):
                layer.matmul(x, config=cfg)
            continue
        assert rel_err(layer.matmul(x, config=cfg), x.double().numpy() @ w64.T) < TOL[dtype]


def test_release_checkpoint_keeps_forward_and_refuses_to_save() -> None:
    fmt, bits, group, sym, _desc, _pack, k, n, dtype = GPTQ[0]
    q = quantize_rtn(make_weight(n, k, 1), bits=bits, group_size=group, sym=sym)
    scheme = Scheme(bits=bits, group_size=group, in_features=k, out_features=n, sym=sym, format=fmt)
    layer = TritonV2Linear(scheme, dtype=dtype, release_checkpoint=True)
    layer.load_affine(q)
    x = torch.randn(3, k, dtype=dtype)
    keep = TritonV2Linear(scheme, dtype=dtype)
    keep.load_affine(q)
    expected = keep(x)
    assert torch.equal(layer(x), expected)  # the first forward prepares, then releases
    assert layer.checkpoint_released and layer.qweight is None
    with pytest.raises(RuntimeError, match="released"):
        layer.state_dict()
    with pytest.raises(ValueError, match="released"):
        hf_repack_layer(layer, "gptq_torch")
    assert torch.equal(layer(x), expected)
    assert set(keep.state_dict()) == {"qweight", "qzeros", "scales", "g_idx"}  # runtime layout never saved


def test_mutating_the_checkpoint_rebuilds_the_runtime_layout() -> None:
    layer, _, _ = gptq_layer(GPTQ[0])
    x = torch.randn(2, 200, dtype=torch.float16)
    before = layer(x)
    with torch.no_grad():
        layer.scales.mul_(2)
    after = layer(x)
    with torch.no_grad():
        layer.scales.div_(2)
    assert torch.allclose(after.float() - layer.bias.float(), 2 * (before.float() - layer.bias.float()),
                          rtol=1e-2, atol=1e-3)


def test_input_gradient() -> None:
    layer, w64, _ = gptq_layer(GPTQ[0])
    x = torch.randn(3, 200, dtype=torch.float16, requires_grad=True)
    gy = torch.randn(3, 72, dtype=torch.float16)
    layer(x).backward(gy)
    ref = gy.double().numpy() @ w64
    assert rel_err(x.grad, ref) < TOL[torch.float16]


def test_selector_rejects_without_cuda_or_triton() -> None:
    p = Problem(Scheme(bits=4, group_size=128, in_features=4096, out_features=4096), torch.float16)
    assert any("device cpu not supported" in r for r in TritonV2Linear.reasons(p, Target.here("cpu")))
    assert any("triton" in r for r in TritonV2Linear.reasons(p, Target.fake_cuda((9, 0), modules={})))
    assert TritonV2Linear.reasons(p, Target.fake_cuda((9, 0), modules={"triton": True})) == []
    pa = Problem(Scheme(bits=4, group_size=128, in_features=4096, out_features=4096, method="awq", format="gemm"),
                 torch.float16)
    assert any("device cpu not supported" in r for r in AwqGEMMTritonLinear.reasons(pa, Target.here("cpu")))
    assert AwqGEMMTritonLinear.reasons(pa, Target.fake_cuda((9, 0), modules={"triton": True})) == []


def test_importing_qlinear_does_not_import_triton() -> None:
    import subprocess
    import sys

    code = ("import sys, qlinear; from qlinear.kernels.registry import all_kernels; all_kernels(); "
            "assert 'triton' not in sys.modules, 'triton imported'")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.parametrize(("bits", "group", "rows"), [(4, 128, 8), (4, 32, 4), (4, 16, 2), (2, 16, 1), (8, 16, 4),
                                                     (2, -1, 8)])
def test_field_blocks_never_straddle_a_group(bits: int, group: int, rows: int) -> None:
    from qlinear.kernels.triton.configs import CHANNELWISE
    from qlinear.kernels.triton.layout import block_rows

    assert block_rows(CHANNELWISE if group == -1 else group, 32 // bits) == rows
