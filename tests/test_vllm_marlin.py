"""Marlin / Machete through vLLM's ops: what the selector says with and without the op library, the act-order
row gathering, and the clear refusals. The GPU numerics are checked on the H200 by
benchmarks/gpu_vllm_backends.py (every declared combination against a float64 reference)."""

from __future__ import annotations

import pytest
import torch

import qlinear
from qlinear.caps import Problem
from qlinear.kernels import vllm_ops
from qlinear.kernels.vllm_marlin import AwqMarlinLinear, MacheteLinear, MarlinLinear, sorted_rows
from qlinear.select import explain
from qlinear.spec import Scheme
from qlinear.target import Target

OPS = {f"_C.{n}": True for n in ("gptq_marlin_repack", "marlin_gemm", "machete_prepack_B", "machete_mm")}


def problem(fmt: str = "gptq", bits: int = 4, k: int = 4096, n: int = 4096) -> Problem:
    return Problem(Scheme(bits=bits, group_size=128, in_features=k, out_features=n, format=fmt,
                          method="awq" if fmt == "gemm" else "gptq"), torch.bfloat16)


def test_without_vllm_every_class_says_how_to_get_it() -> None:
    target = Target.fake_cuda((9, 0), modules={"triton": True})
    for cls in (MarlinLinear, MacheteLinear):
        reasons = cls.reasons(problem(), target)
        assert any("pip install vllm==0.33.0" in r and "use_library" in r for r in reasons), reasons


def test_with_vllm_ops_they_run_and_auto_keeps_triton_on_sm90_with_the_evidence() -> None:
    target = Target.fake_cuda((9, 0), modules={"triton": True}, ops=OPS)
    assert MarlinLinear.reasons(problem(), target) == []
    assert MacheteLinear.reasons(problem(), target) == []
    choice = explain(problem(), target)
    assert choice.kernel.__name__ == "TritonV2Linear"
    text = choice.explain(width=None)
    assert "AUTO prefers gptq_triton" in text and "h200-gpu_linear-2026-12-03-tail.md" in text
    # asked for by name, the evidence is no obstacle
    assert explain(problem(), target, backend="gptq_machete").kernel is MacheteLinear


def test_on_other_gpus_the_reference_priorities_stand() -> None:
    target = Target.fake_cuda((8, 0), modules={"triton": True}, ops=OPS)
    assert explain(problem(), target).kernel is MarlinLinear  # Machete is sm_90 only; Marlin 90 > Triton 40


def test_marlin_tile_rule_and_awq_8bit_refusal() -> None:
    target = Target.fake_cuda((9, 0), modules={"triton": True}, ops=OPS)
    assert any("tile_n 64" in r for r in MarlinLinear.reasons(problem(n=4096 + 32), target))
    reasons = AwqMarlinLinear.reasons(problem("gemm", bits=8), target)
    assert any("no kernel for 8-bit weights with zero points" in r for r in reasons), reasons
    assert AwqMarlinLinear.reasons(problem("gemm", bits=4), target) == []


def test_a_cpu_target_never_probes_cuda_libraries(monkeypatch) -> None:
    monkeypatch.setattr(vllm_ops, "installed_paths", lambda: pytest.fail("probed vLLM for a CPU target"))
    reasons = MarlinLinear.reasons(problem(), Target.here("cpu"))
    assert any("not supported" in r for r in reasons)


def test_missing_library_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="_C_stable_libtorch"):
        vllm_ops.use_library(tmp_path / "nope.so")
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"not an ELF file")
    with pytest.raises(RuntimeError, match="did not load"):
        vllm_ops.use_library(bad)


def test_scalar_type_ids_match_vllm() -> None:
    # the two ids vLLM 0.33's ScalarType gives (shared/specs/peers.md), and the bias-free types derived the same way
    assert vllm_ops.scalar_type_id(4, 8) == 1125899907892224
    assert vllm_ops.scalar_type_id(8, 128) == 1125899923621888
    assert vllm_ops.scalar_type_id(4, 0) == vllm_ops.scalar_type_id(4, 8) - (8 << 17)


def test_act_order_rows_are_gathered_so_groups_are_contiguous() -> None:
    g = torch.Generator().manual_seed(0)
    q = qlinear.quantize_rtn(torch.randn(16, 256, generator=g), bits=4, group_size=64, sym=True)
    perm = torch.randperm(256, generator=g)
    g_idx = (torch.argsort(perm) // 64).to(torch.int32)
    qa = qlinear.AffineWeight(q.codes, q.scales, q.zeros, g_idx, 4, 64, True)
    codes, p = sorted_rows(qa)
    assert torch.equal(g_idx[p.long()], torch.arange(256, dtype=torch.int32) // 64)
    assert torch.equal(codes, qa.codes.t()[p.long()])
    # the product is unchanged when the input is gathered the same way
    x = torch.randn(3, 256, dtype=torch.float64)
    w = qa.dequantize(torch.float64)
    assert torch.allclose(x[:, p.long()] @ w.t()[p.long()], x @ w.t())
    assert sorted_rows(q)[1] is None


def test_uneven_groups_are_refused() -> None:
    q = qlinear.quantize_rtn(torch.randn(8, 128), bits=4, group_size=64, sym=True)
    g_idx = torch.zeros(128, dtype=torch.int32)
    g_idx[:10] = 1  # group 1 holds 10 inputs, group 0 holds 118
    qa = qlinear.AffineWeight(q.codes, q.scales, q.zeros, g_idx, 4, 64, True)
    with pytest.raises(ValueError, match="exactly 64 inputs"):
        sorted_rows(qa)


def test_forward_refuses_cpu_tensors() -> None:
    q = qlinear.quantize_rtn(torch.randn(64, 128), bits=4, group_size=64, sym=True)
    layer = MarlinLinear(Scheme(bits=4, group_size=64, in_features=128, out_features=64, format="gptq_v2"),
                         dtype=torch.bfloat16)
    layer.load_affine(q)
    with pytest.raises(ValueError, match="runs on cuda tensors only"):
        layer(torch.randn(2, 128, dtype=torch.bfloat16))
