"""The native extra's int4 kernels (``qlinear_native._int4`` through ``kernels/native_int4``) against float64.

The weight is packed by torch's own ``_convert_weight_to_int4pack_for_cpu`` (an external implementation of
the byte layout) from random codes; the oracle is ``(q - 8) * s + o`` in float64 from those codes and the
bfloat16 scales/offsets, independent of the C code. Tolerances: the output is rounded to bfloat16 once
(2**-9 relative), and ``int4_mm_weights`` also rounds each weight to bfloat16: 8e-3 of max |y|. Each kernel
is skipped where this CPU cannot run it (``mv``: AVX512-BF16 + VBMI; the ``mm`` kernels: AMX-BF16).
"""

from __future__ import annotations

import pytest
import torch

from qlinear.kernels import native_int4
from qlinear.kernels.native_int4 import Kernel

mod = native_int4.native_int4()
if mod is None:
    pytest.skip("needs the native extra (pip install ./native) on an AVX512-BF16 or AMX CPU", allow_module_level=True)
BF16 = torch.bfloat16
TOL = 8e-3
NUM_THREADS = torch.get_num_threads()
RUNS = {Kernel.MV: mod.mv_available(), Kernel.CODES: mod.amx_available(), Kernel.WEIGHTS: mod.amx_available(),
        Kernel.DP: mod.mv_available()}


def runnable(kernel: Kernel) -> None:
    if not RUNS[kernel]:
        pytest.skip(f"{kernel.value} cannot run on this CPU")


def weight(k: int, n: int, group: int, asym: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes [N, K] int32, packed [N/64, K, 32] uint8, scales_zeros [K/group, N, 2] bf16)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1).view(n // 64, k, 32)
    s = (torch.rand(k // group, n, generator=g) * 0.02 + 1e-3).to(BF16)
    z = torch.randint(0, 16, (k // group, n), generator=g) if asym else torch.full((k // group, n), 8)
    off = ((8 - z) * s.float()).to(BF16)
    return codes, packed, torch.stack([s, off], 2).contiguous()


def oracle(x: torch.Tensor, codes: torch.Tensor, sz: torch.Tensor, group: int) -> torch.Tensor:
    s, o = (sz[..., i].double().repeat_interleave(group, 0) for i in (0, 1))
    return x.double() @ ((codes.t().double() - 8) * s + o)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("kernel", list(Kernel), ids=lambda k: k.value)
@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("asym", [False, True])
def test_every_kernel_matches_float64(kernel: Kernel, group: int, asym: bool) -> None:
    runnable(kernel)
    k, n = 2 * max(group, 128) + (group if group < 256 else 0), 192
    codes, packed, sz = weight(k, n, group, asym, group + asym)
    for m in (1, 2, 3, 7, 16, 17, 33, 50):  # odd M: the one-row tail of mv, partial 16-row tiles
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(BF16)
        y = native_int4.matmul(x, packed, sz, group, kernel)
        assert y.dtype == BF16 and y.shape == (m, n)
        assert rel(y, oracle(x, codes, sz, group)) < TOL, m


def test_kernel_choice_follows_the_measured_rule() -> None:
    if not all(RUNS.values()):
        pytest.skip("the rule below is for a CPU with AVX512-BF16, VBMI and AMX")
    pick = [native_int4.kernel_for(m, 128, 64, 4096) for m in (1, 2, 3, 64, 65)]
    assert pick == [Kernel.MV, Kernel.CODES, Kernel.CODES, Kernel.CODES, Kernel.WEIGHTS]
    assert native_int4.kernel_for(3, 16, 64, 4096) is Kernel.MV  # group 16: the GEMV, else the decoded weights
    assert native_int4.kernel_for(4, 16, 64, 4096) is Kernel.WEIGHTS
    assert native_int4.kernel_for(1, 128, 32, 4096) is None  # another build's packing
    assert native_int4.kernel_for(1, 16, 64, 4112) is None  # K not a multiple of 32


@pytest.mark.parametrize("group", [2, 16, 48])
def test_weights_variant_takes_groups_the_others_cannot(group: int) -> None:
    runnable(Kernel.WEIGHTS)
    k, n = 192, 128
    codes, packed, sz = weight(k, n, group, True, group)
    x = torch.randn(3, k).to(BF16)
    assert rel(native_int4.matmul(x, packed, sz, group, Kernel.WEIGHTS), oracle(x, codes, sz, group)) < TOL
    with pytest.raises(ValueError, match=f"group % 32 == 0 dividing K.*group={group}"):
        mod.int4_mm_codes(x.data_ptr(), packed.data_ptr(), sz.data_ptr(), 0, 3, k, n, group, k, n, 1)
    if group % 16:
        with pytest.raises(ValueError, match=f"group % 16 == 0 dividing K.*group={group}"):
            mod.int4_mv(x.data_ptr(), packed.data_ptr(), sz.data_ptr(), 0, 3, k, n, group, k, n, 1)
    elif RUNS[Kernel.MV]:  # group 16: the GEMV takes it too
        assert rel(native_int4.matmul(x, packed, sz, group, Kernel.MV), oracle(x, codes, sz, group)) < TOL


@pytest.mark.parametrize("kernel", list(Kernel), ids=lambda k: k.value)
def test_threads_split_the_channels_exactly(kernel: Kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two and three threads (uneven shares of 64-channel blocks / 256-channel chunks) give the one-thread bits."""
    runnable(kernel)
    k, n, group = 256, 640, 64 if kernel is not Kernel.WEIGHTS else 32
    codes, packed, sz = weight(k, n, group, True, 21)
    x = torch.randn(37 if kernel is not Kernel.MV else 3, k).to(BF16)
    torch.set_num_threads(1)
    try:
        one = native_int4.matmul(x, packed, sz, group, kernel)
        for threads in (2, 3):
            torch.set_num_threads(threads)
            assert torch.equal(native_int4.matmul(x, packed, sz, group, kernel), one), threads
    finally:
        torch.set_num_threads(NUM_THREADS)
    assert rel(one, oracle(x, codes, sz, group)) < TOL


@pytest.mark.parametrize("chunk", [(64, 32), (128, 96), (64, 4096)])
def test_chunks_smaller_than_the_weight(chunk: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Several channel groups and K chunks, a last chunk shorter than the rest, partial-row blocks of M."""
    runnable(Kernel.WEIGHTS)
    monkeypatch.setattr(native_int4, "CHUNK", chunk)
    k, n, group = 320, 320, 64
    codes, packed, sz = weight(k, n, group, True, 11)
    x = torch.randn(45, k).to(BF16)
    assert rel(native_int4.matmul(x, packed, sz, group, Kernel.WEIGHTS), oracle(x, codes, sz, group)) < TOL


def test_strided_input_and_output_are_honoured() -> None:
    """Row pitches wider than K and N: only the M x N block of ``out`` is written."""
    k, n, group, m = 128, 128, 32, 5
    codes, packed, sz = weight(k, n, group, True, 3)
    xw = torch.randn(m, k + 32).to(BF16)
    out = torch.full((m, n + 64), 7.0, dtype=BF16)
    for kernel in (kr for kr in Kernel if RUNS[kr]):
        fn = getattr(mod, kernel.value)
        extra = (64, 64) if kernel in (Kernel.WEIGHTS, Kernel.DP) else ()
        out.fill_(7.0)
        fn(xw.data_ptr(), packed.data_ptr(), sz.data_ptr(), out.data_ptr(), m, k, n, group, k + 32, n + 64, 1, *extra)
        assert rel(out[:, :n], oracle(xw[:, :k], codes, sz, group)) < TOL
        assert bool((out[:, n:] == 7.0).all())


def test_bad_sizes_are_refused_with_what_was_found() -> None:
    runnable(Kernel.CODES)
    with pytest.raises(ValueError, match=r"K % 32 == 0.*got M=1 K=48 N=64 group=16"):
        mod.int4_mm_weights(0, 0, 0, 0, 1, 48, 64, 16, 48, 64, 1, 64, 32)
    with pytest.raises(ValueError, match=r"N % 64 == 0.*got M=1 K=64 N=96"):
        mod.int4_mm_codes(0, 0, 0, 0, 1, 64, 96, 32, 64, 96, 1)
    with pytest.raises(ValueError, match=r"ldx >= K.*got M=1 K=64 N=64 group=32 ldx=32"):
        mod.int4_mv(0, 0, 0, 0, 1, 64, 64, 32, 32, 64, 1)
    with pytest.raises(ValueError, match="expected threads >= 1, got 0"):
        mod.int4_mv(0, 0, 0, 0, 1, 64, 64, 32, 64, 64, 0)
    with pytest.raises(ValueError, match="ng % 64 == 0 and kc % 32 == 0, got ng=32 kc=32"):
        mod.int4_mm_weights(0, 0, 0, 0, 1, 64, 64, 32, 64, 64, 1, 32, 32)
    _, packed, sz = weight(64, 64, 32, False, 0)
    with pytest.raises(ValueError, match=r"expected bfloat16 x \[M, K\].*got x torch.float32"):
        native_int4.matmul(torch.randn(1, 64), packed, sz, 32, Kernel.CODES)
    with pytest.raises(ValueError, match=r"scales_zeros \[2, 64, 2\].*scales_zeros \(1, 64, 2\)"):
        native_int4.matmul(torch.randn(1, 64).to(BF16), packed, sz[:1], 32, Kernel.CODES)


def test_missing_extra_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_int4, "_MODULE", False)
    assert native_int4.native_int4() is None and native_int4.kernel_for(1, 128, 64, 128) is None
    with pytest.raises(RuntimeError, match="pip install ./native"):
        native_int4.matmul(torch.zeros(1, 64, dtype=BF16), torch.zeros(32, 64, dtype=torch.uint8),
                           torch.zeros(2, 64, 2, dtype=BF16), 32, Kernel.MV)


def test_explain_says_how_the_layer_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Choice.runs``: the extra's kernels by M where installed, else the torch paths and the install command."""
    from qlinear import create_layer, quantize_rtn

    q = quantize_rtn(torch.randn(128, 256), bits=4, group_size=128)
    layer = create_layer(q, format="gptq_v2", backend="gptq_torch_cpu_avx512", dtype=BF16)
    text = layer.choice.explain()
    assert "runs: " in text and layer.choice.to_dict()["runs"] == layer.choice.runs
    if all(RUNS.values()):
        assert layer.choice.runs.startswith("native int4_mv at M=1, int4_mm_codes (AMX) at M=2..64, "
                                            "int4_mm_weights (AMX) at M=65..1024, then decode + bfloat16 "
                                            "GEMM above")
    monkeypatch.setattr(native_int4, "_MODULE", False)
    layer = create_layer(q, format="gptq_v2", backend="gptq_torch_cpu_avx512", dtype=BF16)
    assert "the int4pack op up to M=" in layer.choice.runs and "pip install ./native" in layer.choice.runs
    monkeypatch.setattr(native_int4, "_MODULE", None)
    monkeypatch.setattr(mod, "amx_available", lambda: False)  # an AVX512-BF16 CPU without AMX (e.g. Zen 4)
    if RUNS[Kernel.MV]:  # the whole no-AMX routing: tests/test_native_int4_dp.py
        assert native_int4.describe(128, "decode + bfloat16 GEMM").startswith("native int4_mv at M=1..2, ")
        assert native_int4.kernel_for(3, 128, 64, 4096) is None  # the int4pack op
