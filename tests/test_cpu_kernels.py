"""CPU kernels (cpu_int4: TorchAten / TorchFused / TorchCpuAvx512, GPTQ and AWQ; cpu_int8: TorchInt8) against
the float64 numpy oracles in tests/oracle, plus conformance, memory and lifecycle checks.

These kernels compute in bfloat16 whatever the layer dtype (the only fast dtype of the int4pack and int8pack
ops), so every dtype is held to the bfloat16 bound: 1.5e-2 of max |y_ref| (as TorchLinear's bfloat16 tests).
Every int4 forward is run through each path the layer can take (``cpu_int4.Path``: the native extra where
installed, the int4pack op, decode + GEMM), M = 1, 3 and 37 on each (the extra's kernel picked by M); the 8-bit kernel
takes its op at M = 1 and 3 and decode + GEMM at M = 37 (above cpu_int8.INT8PACK_MAX_M = 16).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from qlinear import FORMAT, QuantLinear, RetiredKernelError, Scheme, Target, create_layer, quantize_rtn, select
from qlinear.caps import Problem
from qlinear.enums import DEVICE
from qlinear.kernels import cpu_int4, cpu_int8, int4pack_runtime, native_int4
from qlinear.kernels.registry import kernel_by_name
from qlinear.select import NoKernelError, explain
from qlinear.spec import ConfigError
from qlinear.target import DeviceInfo
from tests.oracle import awq_numpy, gptq_numpy

TOL = 1.5e-2
HERE = Target.here("cpu")
INT4 = cpu_int4.KERNELS
ALL = (*cpu_int4.KERNELS, *cpu_int8.KERNELS)
K_FOR = {16: 96, 32: 160, 64: 192, 128: 320, 256: 320, 512: 640, -1: 200}  # partial last groups, padding


def runnable(cls: type[QuantLinear]) -> None:
    """Skip where this machine lacks what the kernel needs (the AVX512-BF16 flag, the torch ops)."""
    reasons = cls.target_reasons(HERE)
    if reasons:
        pytest.skip(f"{cls.__name__} cannot run here: {'; '.join(reasons)}")


def make_weight(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, ::8] = -0.05  # keeps asymmetric zero points above 0 (GPTQ v1 cannot hold z = 0)
    return w


def fmt_of(cls: type[QuantLinear]) -> str:
    return "gemm" if "Awq" in cls.__name__ else "gptq"


def build(cls: type[QuantLinear], bits: int, group: int, sym: bool, desc_act: bool, k: int, n: int,
          dtype: torch.dtype, fmt: str | None = None, bias: bool = False, seed: int = 0) -> QuantLinear:
    q = quantize_rtn(make_weight(n, k, seed), bits=bits, group_size=group, sym=sym, desc_act=desc_act)
    layer = create_layer(q, format=fmt or fmt_of(cls), backend=cls.backend, dtype=dtype,
                               bias=torch.randn(n) * 0.1 if bias else None)
    assert type(layer) is cls
    return layer


def oracle(layer: QuantLinear) -> np.ndarray:
    """Float64 weight [N, K] from the checkpoint buffers, by the independent numpy oracle."""
    sd = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in layer.state_dict().items()
          if k != "bias"}
    s = layer.scheme
    if s.format is FORMAT.GEMM:
        return awq_numpy.dequantize("gemm", sd, s.bits, s.in_features, s.out_features, s.group_size)
    return gptq_numpy.dequantize_checkpoint(sd, s.bits, s.in_features, s.out_features, s.format.value)


def rel_err(y: torch.Tensor, x: torch.Tensor, w64: np.ndarray, bias: torch.Tensor | None) -> float:
    ref = x.double().numpy() @ w64.T
    if bias is not None:
        ref = ref + bias.double().numpy()
    return float(np.abs(y.double().numpy() - ref).max() / np.abs(ref).max())


def paths_of(layer: QuantLinear, m: int = 1) -> list[cpu_int4.Path | None]:
    """Every path an int4 layer can take here for ``m`` rows (None for the 8-bit kernel: its own rule); the
    native extra's kernels by what this CPU has (without AMX only the M=1 GEMV)."""
    if not isinstance(layer, cpu_int4.Int4PackMixin):
        return [None]
    layer.ensure_prepared()
    rt, paths = layer._rt, [cpu_int4.Path.DECODE]
    if rt.op:
        paths.append(cpu_int4.Path.OP)
    if native_int4.kernel_for(m, rt.group, rt.block, rt.k_pad) is not None:
        paths.append(cpu_int4.Path.NATIVE)
    return paths


@contextlib.contextmanager
def forced(layer: QuantLinear, path: cpu_int4.Path | None) -> Iterator[None]:
    """Run ``layer`` on ``path`` whatever M (None: leave the layer's own rule)."""
    if path is not None:
        layer.path = lambda m, grad: path
    try:
        yield
    finally:
        layer.__dict__.pop("path", None)


def cases() -> list[tuple[type[QuantLinear], int, bool, bool]]:
    out = []
    for cls in ALL:
        acts = [False] if fmt_of(cls) == "gemm" else sorted(cls.caps.desc_act)
        for group, sym, act in itertools.product(sorted(cls.caps.group_sizes), (True, False), acts):
            out.append((cls, group, sym, act))
    return out


@pytest.mark.parametrize(("cls", "group", "sym", "desc_act"), cases(),
                         ids=lambda v: v.__name__ if isinstance(v, type) else str(v))
def test_forward_matches_float64_oracle(cls, group, sym, desc_act) -> None:
    runnable(cls)
    bits = max(cls.caps.bits)
    n = 32 if cls.caps.out_divisible == 32 else 40
    dtypes = sorted(cls.caps.dtypes, key=str)
    layer = build(cls, bits, group, sym, desc_act, K_FOR[group], n, dtypes[0], bias=True, seed=group + 7 * sym)
    w64 = oracle(layer)
    for dtype, m in itertools.product(dtypes, (1, 3, 37)):
        x = torch.randn(m, layer.in_features).to(dtype)
        for path in paths_of(layer, m):
            with forced(layer, path):
                y = layer(x)
            assert y.dtype == dtype and y.shape == (m, n)
            assert rel_err(y, x, w64, layer.bias) < TOL, (dtype, m, path)
    y3 = layer(torch.randn(2, 3, layer.in_features).to(dtypes[0]))
    assert y3.shape == (2, 3, n)


@pytest.mark.parametrize("cls", INT4, ids=lambda c: c.__name__)
def test_paths_agree_and_amx_is_preferred(cls) -> None:
    runnable(cls)
    layer = build(cls, 4, 128, False, False, 512, 64, torch.bfloat16)
    x = torch.randn(5, 512, dtype=torch.bfloat16)
    outs = {}
    for path in paths_of(layer, 5):
        with forced(layer, path):
            outs[path] = layer(x).float()
    ref = outs[cpu_int4.Path.DECODE]
    for path, y in outs.items():
        assert (y - ref).abs().max() <= 2e-2 * ref.abs().max(), path
    assert layer._rt.block == 64  # the op's bytes are the layout the decode path and AMX read, on this CPU
    mod = native_int4.native_int4()
    if mod is not None and mod.amx_available() and mod.mv_available():  # this repo's CPU: every M native
        assert cpu_int4.Path.NATIVE in outs
        assert all(layer.path(m, False) is cpu_int4.Path.NATIVE for m in (1, 2, 40, 300, 1024))
        assert layer.path(1025, False) is cpu_int4.Path.DECODE  # oneDNN's GEMM wins at very large M
    assert layer.path(5, True) is cpu_int4.Path.DECODE  # gradients


def test_other_cpu_builds_packings(monkeypatch) -> None:
    """AVX2 builds pack blocks of 32 channels: the decoder reads them; an unknown layout runs the op at every M."""
    runnable(cpu_int4.TorchAtenLinear)
    layer = build(cpu_int4.TorchAtenLinear, 4, 64, False, True, 256, 96, torch.bfloat16)
    x = torch.randn(40, 256, dtype=torch.bfloat16)
    w64 = oracle(layer)
    avx2 = lambda codes, tiles: int4pack_runtime.pack_blocks(codes, 32).view(codes.shape[0], -1)  # noqa: E731
    monkeypatch.setattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", avx2)
    layer.prepare()
    assert layer._rt.block == 32 and layer.path(40, False) is cpu_int4.Path.DECODE  # no AMX on 32-blocks
    assert rel_err(layer(x), x, w64, None) < TOL
    monkeypatch.undo()
    monkeypatch.setattr(int4pack_runtime, "BLOCKS", (32,))
    layer.prepare()
    assert layer._rt.block == 0 and layer.path(40, False) is cpu_int4.Path.OP
    assert rel_err(layer(x), x, w64, None) < TOL
    with pytest.raises(RuntimeError, match="gradients need the decode path"):
        layer(x.clone().requires_grad_())


@pytest.mark.parametrize("group", [-1, 32])
def test_int8_asymmetric_zeros_beyond_the_int8_range(group: int) -> None:
    """All-positive rows quantize to z = 0 and codes up to 255: q - z does not fit int8, q - 128 does."""
    runnable(cpu_int8.TorchInt8Linear)
    w = torch.rand(48, 200, generator=torch.Generator().manual_seed(3)) + 0.01
    q = quantize_rtn(w, bits=8, group_size=group, sym=False)
    assert int(q.zeros.max()) == 0 and int(q.codes.max()) == 255
    layer = create_layer(q, format="gptq_v2", backend="gptq_torch_int8", dtype=torch.float32)
    w64 = oracle(layer)
    for m in (1, 37):
        x = torch.randn(m, 200)
        assert rel_err(layer(x), x, w64, None) < TOL


def test_fused_honours_asymmetric_zeros() -> None:
    """formats.md 2.11: the reference's TorchFusedLinear writes zero_offset 0 (assumes z = 8): error 1.31."""
    runnable(cpu_int4.TorchFusedLinear)
    layer = build(cpu_int4.TorchFusedLinear, 4, 64, False, False, 256, 64, torch.bfloat16, fmt="gptq_v2")
    q = layer.affine()
    assert (q.zeros != 8).float().mean() > 0.5  # genuinely asymmetric
    x = torch.randn(8, 256, dtype=torch.bfloat16)
    w64 = oracle(layer)
    assert rel_err(layer(x), x, w64, None) < TOL
    g = q.g_idx.long()
    as_if_z8 = (q.scales.double()[:, g] * (q.codes.double() - 8)).numpy()  # what the reference computes
    assert rel_err(x.double() @ torch.from_numpy(as_if_z8).t(), x, w64, None) > 0.1


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_conformance_every_declared_combination_runs(cls) -> None:
    """Every combination the class declares that the selector accepts here must run and be right.

    All groups x desc_act x sym x bits x accepted dtypes; the checkpoint format alternates (gptq, gptq_v2
    share every line of kernel code after ``affine()``), a deterministic half of the full product.
    """
    runnable(cls)
    c, failures, ran = cls.caps, [], 0
    combos = itertools.product(c.bits, sorted(c.group_sizes), sorted(c.desc_act), sorted(c.sym))
    formats = sorted(c.formats, key=lambda f: f.value)
    for i, (bits, group, act, sym) in enumerate(combos):
        fmt = formats[i % len(formats)]
        k = max(2 * abs(group), 64) + (0 if c.in_divisible > 1 or not c.auto_padding else 32)
        n = 64 if c.out_divisible > 1 else 24
        try:
            scheme = Scheme(bits=bits, group_size=group, in_features=k, out_features=n, sym=sym, desc_act=act,
                            method="awq" if fmt is FORMAT.GEMM else "gptq", format=fmt)
        except ConfigError:
            continue  # not a checkpoint that can exist (AWQ with desc_act)
        accepted = [d for d in c.dtypes if explain(Problem(scheme, d), HERE, cls.backend).kernel is cls]
        if not accepted:
            continue
        try:
            layer = build(cls, bits, group, sym, act, k, n, accepted[0], fmt=fmt.value, seed=bits + k)
            w = layer.affine().dequantize(torch.float64)
            for d, m in itertools.product(accepted, (1, 37)):
                x = torch.randn(m, k).to(d)
                err = rel_err(layer(x), x, w.numpy(), None)
                assert err < TOL, f"relative error {err:.2e}"
                ran += 1
        except Exception as e:  # every failure is collected and reported
            failures.append(f"{fmt.value} {bits}-bit g{group} desc_act={act} sym={sym}: {type(e).__name__}: {e}")
    assert not failures, "declared and accepted, but failed:\n" + "\n".join(failures)
    assert ran > 0


def resident_bytes(layer: QuantLinear) -> tuple[int, int]:
    """(checkpoint buffer bytes, runtime tensor bytes)."""
    buffers = sum(b.numel() * b.element_size() for b in layer.buffers())
    return buffers, sum(t.numel() * t.element_size() for t in layer._rt.tensors())


def test_no_dense_or_expanded_weight_survives_forwards() -> None:
    """After forwards on both paths, no tensor of K*N values or more exists (8-bit: but its int8 operand), and
    each layer holds about its packed size twice (checkpoint buffers + runtime), never a dense weight."""
    k = n = 1024
    layers = [build(cls, max(cls.caps.bits), 128, False, False, k, n, torch.bfloat16)
              for cls in ALL if not cls.target_reasons(HERE)]
    assert len(layers) >= 3
    for layer, m in itertools.product(layers, (1, 37, 1, 37)):
        layer(torch.randn(m, k, dtype=torch.bfloat16))
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on some torch.distributed shims warns
        warnings.simplefilter("ignore")
        big = [t for t in gc.get_objects() if isinstance(t, torch.Tensor)
               and (t.numel() > k * n or (t.numel() == k * n and (t.dtype != torch.int8 or t.is_floating_point())))]
    assert big == [], [(tuple(t.shape), t.dtype) for t in big]
    for layer in layers:
        buffers, runtime = resident_bytes(layer)
        packed = k * n * layer.scheme.bits // 8
        assert runtime < packed * 1.25, type(layer).__name__  # int4pack / int8 operand + per-group scales
        assert buffers + runtime < packed * 2.5, type(layer).__name__  # dense bf16 = 16 / bits x packed


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_mutation_and_reload_re_prepare(cls) -> None:
    runnable(cls)
    bits = max(cls.caps.bits)
    layer = build(cls, bits, 32, False, False, 64, 32, torch.bfloat16, seed=1)
    other = quantize_rtn(make_weight(32, 64, 2), bits=bits, group_size=32, sym=False)
    calls = []
    original = layer.prepare
    layer.prepare = lambda: (calls.append(1), original())[1]
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    before = layer(x)
    assert calls == []
    layer.load_affine(other)
    y = layer(x)
    assert calls == [1] and rel_err(y, x, oracle(layer), None) < TOL
    with torch.no_grad():
        layer.scales.mul_(2)  # in place: same storage, new version
    assert torch.allclose(layer(x).float(), 2 * y.float(), rtol=2e-2, atol=1e-3) and calls == [1, 1]
    assert not torch.equal(before, y)


@pytest.mark.parametrize("cls", [cpu_int4.TorchAtenLinear, cpu_int4.TorchFusedLinear], ids=lambda c: c.__name__)
def test_gradients_flow_through_the_decode_path(cls) -> None:
    runnable(cls)
    layer = build(cls, 4, 32, False, True, 96, 40, torch.bfloat16)
    x = torch.randn(3, 96, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().sum().backward()
    expected = torch.from_numpy(oracle(layer)).sum(0)
    assert (x.grad[0].double() - expected).abs().max() < 2e-2 * expected.abs().max()


def test_retired_int8_awq_raises_and_reports_its_migration() -> None:
    retired = kernel_by_name("TorchInt8AwqLinear")
    scheme = Scheme(bits=4, group_size=128, in_features=256, out_features=64, method="awq", format="gemm")
    with pytest.raises(RetiredKernelError, match="AwqTorchLinear.*awq_torch_aten"):
        retired(scheme)
    with pytest.raises(NoKernelError, match="TorchInt8AwqLinear  no: retired: persistent AWQ INT4-to-INT8"):
        select(Problem(scheme, torch.bfloat16), HERE, "awq_torch_int8")
    assert retired.reasons(Problem(scheme), HERE)[0].startswith("retired: persistent AWQ INT4-to-INT8 expansion")


def test_selection_on_cpus_with_and_without_what_the_kernels_need() -> None:
    p = Problem(Scheme(bits=4, group_size=128, in_features=4096, out_features=4096, format="gptq_v2"),
                torch.bfloat16)
    ops = {op: True for op in cpu_int4.declared.INT4PACK_CPU_OPS}
    amx = Target.fake_cpu(frozenset({"avx512f", "avx512_bf16"}), ops=ops)
    assert select(p, amx).kernel is cpu_int4.TorchCpuAvx512Linear
    assert select(p, Target.fake_cpu(frozenset({"avx512f"}), ops=ops)).kernel is cpu_int4.TorchAtenLinear
    assert select(p, Target.fake_cpu()).kernel.__name__ == "TorchLinear"  # no int4pack ops in that torch
    bare = cpu_int4.TorchCpuAvx512Linear.reasons(p, Target.fake_cpu(frozenset({"avx512_bf16"})))
    assert bare == [f"this torch build lacks torch.ops.{op}" for op in cpu_int4.declared.INT4PACK_CPU_OPS]
    xpu = Target((DeviceInfo(DEVICE.XPU, 0),), ops=ops)
    assert any("XPU fused INT4 path is declared but not implemented" in r
               for r in cpu_int4.TorchFusedLinear.reasons(p, xpu))
    int8 = Problem(Scheme(bits=8, group_size=128, in_features=256, out_features=64, format="gptq"))
    assert explain(int8, Target.fake_cpu(ops={"aten._weight_int8pack_mm": True}), "gptq_torch_int8").kernel \
        is cpu_int8.TorchInt8Linear


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_input_errors(cls) -> None:
    runnable(cls)
    layer = build(cls, max(cls.caps.bits), 32, True, False, 64, 32, torch.bfloat16)
    with pytest.raises(ValueError, match=r"input: expected last dimension 64 \(in_features\), got shape \(2, 63\)"):
        layer(torch.randn(2, 63, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="input: dtype torch.int64 not supported"):
        layer(torch.ones(2, 64, dtype=torch.long))
    assert layer(torch.randn(0, 64, dtype=torch.bfloat16)).shape == (0, 32)
