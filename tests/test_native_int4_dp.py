"""``int4_mm_dp`` (the native extra's int4 GEMM for AVX512-BF16 CPUs without AMX) against float64, its decode
without VBMI (Cooper Lake) against the VPERMI2B one, and the
routing of ``native_int4`` with AMX switched off (``set_amx_allowed(False)``, as on a Zen 4 / Cooper Lake CPU).

The weight is packed by torch's own ``_convert_weight_to_int4pack_for_cpu`` from random codes; the oracles are
float64 products with the weight ``(q - 8) * s + o`` computed from those codes and the bfloat16 scales and
offsets: exactly (tolerance 8e-3 of max |y|: the weight and the output are each rounded to bfloat16 once), and
with that weight rounded to bfloat16 in torch (then each output within half a bfloat16 unit, 2**-8 relative,
plus 1e-4 of max |y| for the float32 sums).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from qlinear.kernels import native_int4
from qlinear.kernels.native_int4 import Kernel

mod = native_int4.native_int4()
if mod is None or not mod.mv_available():
    pytest.skip("needs the native extra (pip install ./native) on an AVX512-BF16 + VBMI CPU", allow_module_level=True)
BF16 = torch.bfloat16


@pytest.fixture
def no_amx() -> Iterator[None]:
    native_int4.set_amx_allowed(False)
    try:
        yield
    finally:
        native_int4.set_amx_allowed(True)


def weight(k: int, n: int, group: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [N, K] int32, packed [N/64, K, 32] uint8, scales_zeros [K/group, N, 2] bf16), asymmetric."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1).view(n // 64, k, 32)
    s = (torch.rand(k // group, n, generator=g) * 0.02 + 1e-3).to(BF16)
    z = torch.randint(0, 16, (k // group, n), generator=g)
    off = ((8 - z) * s.float()).to(BF16)
    return codes, packed, torch.stack([s, off], 2).contiguous()


def dense64(codes: torch.Tensor, sz: torch.Tensor, group: int) -> torch.Tensor:
    """The weight [K, N] in float64: (q - 8) * s + o."""
    s, o = (sz[..., i].double().repeat_interleave(group, 0) for i in (0, 1))
    return (codes.t().double() - 8) * s + o


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


def check(x: torch.Tensor, codes: torch.Tensor, sz: torch.Tensor, group: int, y: torch.Tensor) -> None:
    w = dense64(codes, sz, group)
    assert y.dtype == BF16 and y.shape == (x.shape[0], codes.shape[0])
    assert rel(y, x.double() @ w) < 8e-3
    ref = x.double() @ w.to(BF16).double()
    assert bool(((y.double() - ref).abs() <= 2**-8 * ref.abs() + 1e-4 * ref.abs().max()).all())


@pytest.mark.parametrize("group", [16, 32, 128])
@pytest.mark.parametrize("chunk", [(256, 2048), (64, 64)], ids=["one-chunk", "many-chunks"])
def test_dp_matches_float64(group: int, chunk: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """M from 2 to 33 (register blocks of 6 rows and their tails), N and K that are not powers of two; with
    small chunks, several channel chunks and K chunks whose sums wait in the float32 scratch."""
    monkeypatch.setattr(native_int4, "DP_CHUNK", chunk)
    k, n = 3 * max(group, 32) + (128 if group < 128 else 0), 320
    codes, packed, sz = weight(k, n, group, group)
    for m in (2, 3, 7, 16, 33):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(BF16)
        check(x, codes, sz, group, native_int4.matmul(x, packed, sz, group, Kernel.DP))


@pytest.mark.parametrize("group", [2, 48])
def test_dp_takes_any_even_group(group: int) -> None:
    k, n = 192, 128
    codes, packed, sz = weight(k, n, group, group)
    x = torch.randn(5, k).to(BF16)
    check(x, codes, sz, group, native_int4.matmul(x, packed, sz, group, Kernel.DP))


def test_dp_threads_split_the_channels_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two and three threads (uneven shares of ten 64-channel chunks) give the one-thread bits."""
    monkeypatch.setattr(native_int4, "DP_CHUNK", (64, 96))
    k, n, group = 256, 640, 32
    codes, packed, sz = weight(k, n, group, 21)
    x = torch.randn(13, k).to(BF16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_int4.matmul(x, packed, sz, group, Kernel.DP)
        for t in (2, 3):
            torch.set_num_threads(t)
            assert torch.equal(native_int4.matmul(x, packed, sz, group, Kernel.DP), one), t
    finally:
        torch.set_num_threads(threads)
    check(x, codes, sz, group, one)


def test_dp_honours_row_pitches() -> None:
    """ldx > K and ldo > N: only the M x N block of ``out`` is written."""
    k, n, group, m = 128, 128, 32, 9
    codes, packed, sz = weight(k, n, group, 3)
    xw = torch.randn(m, k + 32).to(BF16)
    out = torch.full((m, n + 64), 7.0, dtype=BF16)
    mod.int4_mm_dp(xw.data_ptr(), packed.data_ptr(), sz.data_ptr(), out.data_ptr(), m, k, n, group, k + 32, n + 64,
                   1, 64, 64)
    check(xw[:, :k], codes, sz, group, out[:, :n])
    assert bool((out[:, n:] == 7.0).all())


def test_dp_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"int4_mm_dp: expected .*group % 2 == 0 dividing K.*group=3"):
        mod.int4_mm_dp(0, 0, 0, 0, 1, 96, 64, 3, 96, 64, 1, 64, 32)
    with pytest.raises(ValueError, match=r"int4_mm_dp: expected .*K % 32 == 0.*got M=2 K=48"):
        mod.int4_mm_dp(0, 0, 0, 0, 2, 48, 64, 16, 48, 64, 1, 64, 32)
    with pytest.raises(ValueError, match="int4_mm_dp: expected ng % 64 == 0 and kc % 32 == 0, got ng=32 kc=32"):
        mod.int4_mm_dp(0, 0, 0, 0, 1, 64, 64, 32, 64, 64, 1, 32, 32)
    with pytest.raises(ValueError, match="int4_mm_dp: expected threads >= 1, got 0"):
        mod.int4_mm_dp(0, 0, 0, 0, 1, 64, 64, 32, 64, 64, 0, 64, 32)


def test_routing_without_amx(no_amx: None) -> None:
    """int4_mv, then (groups the op takes) the int4pack op, then int4_mm_dp; groups of 16: mv, then dp."""
    assert native_int4.kernel_for(1, 128, 64, 4096) is Kernel.MV
    assert native_int4.kernel_for(native_int4.MV_MAX_M_WITHOUT_AMX, 128, 64, 4096) is Kernel.MV
    assert native_int4.kernel_for(native_int4.OP_MAX_M_WITHOUT_AMX, 128, 64, 4096) is None  # the op
    assert native_int4.kernel_for(native_int4.OP_MAX_M_WITHOUT_AMX + 1, 32, 64, 4096) is Kernel.DP
    assert native_int4.kernel_for(1024, 128, 64, 4096) is Kernel.DP
    top = native_int4.MV_MAX_M_WITHOUT_AMX_OR_OP
    assert [native_int4.kernel_for(m, 16, 64, 4096) for m in (top, top + 1)] == [Kernel.MV, Kernel.DP]
    assert native_int4.kernel_for(20, 128, 32, 4096) is None  # another build's packing
    assert native_int4.native_max_m() == native_int4.DP_MAX_M
    text = native_int4.describe(128, "decode + bfloat16 GEMM", native_to=native_int4.DP_MAX_M)
    lo = native_int4.OP_MAX_M_WITHOUT_AMX + 1
    assert (f"the int4pack op at M={native_int4.MV_MAX_M_WITHOUT_AMX + 1}..{native_int4.OP_MAX_M_WITHOUT_AMX}, "
            f"int4_mm_dp (AVX512-BF16, no AMX on this CPU) at M={lo}..{native_int4.DP_MAX_M}") in text
    assert "AMX)" not in text.replace("no AMX on this CPU)", "")


def test_layer_without_amx_runs_dp_and_says_so(no_amx: None) -> None:
    """A GPTQ layer on the int4pack kernels: explain() names int4_mm_dp, and M above the op's range takes it."""
    from qlinear import create_layer, quantize_rtn
    from qlinear.kernels import cpu_int4

    w = torch.randn(192, 256, generator=torch.Generator().manual_seed(5))
    q = quantize_rtn(w, bits=4, group_size=128)
    layer = create_layer(q, format="gptq_v2", backend="gptq_torch_cpu_avx512", dtype=BF16)
    assert "int4_mm_dp (AVX512-BF16, no AMX on this CPU)" in layer.choice.runs and "runs: " in layer.choice.explain()
    m = native_int4.OP_MAX_M_WITHOUT_AMX + 5
    assert layer.path(m, False) is cpu_int4.Path.NATIVE
    assert layer.path(native_int4.OP_MAX_M_WITHOUT_AMX, False) is cpu_int4.Path.OP
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(6)).to(BF16)
    y = layer(x)
    ref = x.double() @ q.dequantize().double().t()
    assert rel(y, ref) < 1e-2


def test_lut4_routing_follows_the_hook(no_amx: None) -> None:
    """``set_amx_allowed(False)`` reaches the other native modules too: LUT4 keeps its AVX-512 path above M=4."""
    from qlinear.kernels import native_lut4

    if native_lut4.max_m(BF16) == 0:
        pytest.skip("the native LUT4 kernels do not run here")
    assert native_lut4.max_m(BF16) == native_lut4.MV_MAX_M_WITHOUT_AMX
    assert native_lut4.kernel_for(native_lut4.MV_MAX_M + 1, BF16) == "lut4_mv"
    assert native_lut4.describe(256, 64, BF16).endswith("(no AMX here)")


def test_benchmark_no_amx_needs_the_onednn_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cpu_linear.py --no-amx`` run as a module (torch already imported) refuses, naming the variable."""
    import importlib.util
    from pathlib import Path

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "cpu_linear.py"
    spec = importlib.util.spec_from_file_location("bench_cpu_linear_no_amx", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    with pytest.raises(SystemExit, match="expected ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16.*found None"):
        bench.main(["--no-amx", "--quick"])
    assert native_int4.amx_available(mod) == bool(mod.amx_available())  # the hook was not left switched off


@pytest.fixture
def cooper_lake() -> Iterator[None]:
    native_int4.set_amx_allowed(False)
    native_int4.set_vbmi_allowed(False)
    try:
        yield
    finally:
        native_int4.set_amx_allowed(True)
        native_int4.set_vbmi_allowed(True)


@pytest.mark.parametrize("group", [16, 32, 128])
def test_dp_decode_without_vbmi_gives_the_same_bits(group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``int4_mm_dp``'s AVX512-BW decode (for Cooper Lake) against its VPERMI2B decode: equal outputs, several
    channel and K chunks, register-block tails."""
    monkeypatch.setattr(native_int4, "DP_CHUNK", (64, 64))
    k, n = 3 * max(group, 32) + (128 if group < 128 else 0), 320
    codes, packed, sz = weight(k, n, group, 40 + group)
    for m in (1, 7, 16):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(BF16)
        outs = []
        for vbmi in (True, False):
            out = torch.empty(m, n, dtype=BF16)
            mod.int4_mm_dp(x.data_ptr(), packed.data_ptr(), sz.data_ptr(), out.data_ptr(), m, k, n, group, k, n, 1,
                           64, 64, vbmi)
            outs.append(out)
        assert torch.equal(outs[0], outs[1]), m
        check(x, codes, sz, group, outs[1])


def test_cooper_lake_routing(cooper_lake: None) -> None:
    """``set_vbmi_allowed(False)`` (an AVX512-BF16 CPU without VBMI or AMX: Cooper Lake): no ``int4_mv``; the
    int4pack op up to ``OP_MAX_M_WITHOUT_AMX``, then ``int4_mm_dp`` with its VBMI-free decode, and explain() says
    so; groups the op cannot take go to ``int4_mm_dp`` from M = 1."""
    from qlinear import create_layer, quantize_rtn
    from qlinear.kernels import cpu_int4

    top = native_int4.OP_MAX_M_WITHOUT_AMX
    assert native_int4.native_int4() is mod
    assert [native_int4.kernel_for(m, 128, 64, 4096) for m in (1, top, top + 1, 1024)] == [None, None, Kernel.DP,
                                                                                           Kernel.DP]
    assert native_int4.kernel_for(1, 16, 64, 4096) is Kernel.DP
    text = native_int4.describe(128, "decode + bfloat16 GEMM", native_to=native_int4.DP_MAX_M)
    assert "int4_mv" not in text and "decoded without VBMI" in text and f"the int4pack op at M=1..{top}" in text
    w = torch.randn(192, 256, generator=torch.Generator().manual_seed(7))
    q = quantize_rtn(w, bits=4, group_size=128)
    layer = create_layer(q, format="gptq_v2", backend="gptq_torch_cpu_avx512", dtype=BF16)
    assert "decoded without VBMI" in layer.choice.runs
    assert layer.path(1, False) is cpu_int4.Path.OP and layer.path(top + 5, False) is cpu_int4.Path.NATIVE
    x = torch.randn(top + 5, 256, generator=torch.Generator().manual_seed(8)).to(BF16)
    assert rel(layer(x), x.double() @ q.dequantize().double().t()) < 1e-2
