"""AWQ gemv / gemv_fast checkpoints written by GPTQModel 7.7.0's own packers (see make_fixtures.py, AWQ_REPACKED).

The layout is read with ``plan_checkpoint`` + ``qlinear.layouts.awq.from_checkpoint`` and compared with the
weights GPTQModel's own unpackers decode from the same buffers (layer 0, ``reference/tool_outputs.safetensors``).
No kernel (qlinear's or GPTQModel's) runs these formats on a CPU, so ``load_checkpoint`` re-encodes them to
AWQ gemm in memory (``qlinear.checkpoint.repack``) and the layers run there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qlinear.checkpoint import CheckpointError, load_checkpoint, plan_checkpoint
from qlinear.layouts import awq

FIXTURES = Path(__file__).parent / "fixtures"
EXPECT = {  # name -> (format, group_size, sym)
    "awq_gemv_4bit_g64": ("gemv", 64, False), "awq_gemv_4bit_g64_sym": ("gemv", 64, True),
    "awq_gemv_fast_4bit_g32": ("gemv_fast", 32, False), "awq_gemv_fast_4bit_g32_sym": ("gemv_fast", 32, True),
}


def decoded(name: str) -> dict[str, tuple]:
    path = FIXTURES / name
    plan, tensors = plan_checkpoint(path), load_file(path / "model.safetensors")
    out = {}
    for module, mp in plan.modules.items():
        leaves = {leaf: tensors[f"{module}.{leaf}"] for leaf in awq.checkpoint_shapes(mp.scheme)}
        out[module] = (mp.scheme, leaves, awq.from_checkpoint(leaves, mp.scheme))
    return out


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_dequantize_equals_the_tools_own(name: str) -> None:
    fmt, gs, sym = EXPECT[name]
    ref = load_file(FIXTURES / name / "reference" / "tool_outputs.safetensors")
    layers = decoded(name)
    assert len(layers) == 14 and len(ref) == 7
    for module, (scheme, leaves, q) in layers.items():
        assert (scheme.format.value, scheme.group_size, scheme.sym, scheme.bits) == (fmt, gs, sym, 4)
        again = awq.to_checkpoint(q, fmt)  # re-encoding reproduces GPTQModel's bytes
        assert again.keys() == leaves.keys() and all(torch.equal(t, leaves[k]) for k, t in again.items()), module
        if f"{module}.weight" not in ref:
            continue
        r = ref[f"{module}.weight"]
        w = q.dequantize(torch.float32)
        if fmt == "gemv":  # GPTQModel's decode: fp16(q*s - z*s) == fp16(s*(q-z)), one rounding, as ours
            assert torch.equal(w.to(torch.float16), r), module
            continue
        # gemv_fast stores fp16(-(s*z)); the tool's weight is fp16(q*s + that): rebuild it from our decode exactly,
        s = q.scales.float().repeat_interleave(gs, dim=1)
        zb = awq.scaled_zeros(q.scales.t(), q.zeros.t()).t().float().repeat_interleave(gs, dim=1)
        assert torch.equal((q.codes.float() * s + zb).to(torch.float16), r), module
        # and our exact s*(q-z) differs from it only by the rounding of s*z to float16 plus the final rounding.
        z = q.zeros.float().repeat_interleave(gs, dim=1)
        assert bool(((w - r.float()).abs() <= 2.0**-11 * ((s * z).abs() + r.float().abs()) + 2.0**-24).all())
        if sym:
            assert torch.equal(w.to(torch.float16), r), module


@pytest.mark.parametrize("name", sorted(EXPECT))
@pytest.mark.parametrize("backend", ["auto", "awq_torch"])
def test_loads_on_cpu_by_lossless_reencode_to_gemm(name: str, backend: str) -> None:
    """No kernel runs gemv/gemv_fast on a CPU, so the loader re-encodes to gemm in memory and says so."""
    fmt = EXPECT[name][0]
    ref = load_file(FIXTURES / name / "reference" / "tool_outputs.safetensors")
    layers = load_checkpoint(FIXTURES / name, dtype=torch.float32, backend=backend)
    expected = decoded(name)
    assert layers.keys() == expected.keys()
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for module, layer in layers.items():
        assert layer.scheme.format.value == "gemm"
        assert f"stored as {fmt}" in layer.choice.note and "re-encoded to gemm" in layer.choice.note
        assert f"note: stored as {fmt}" in layer.choice.explain()
        w = expected[module][2].dequantize(torch.float64)
        assert torch.equal(layer.dequantize().double(), w), module  # same integers, same float scales
        if f"{module}.weight" in ref and fmt == "gemv":
            assert torch.equal(layer.dequantize().to(torch.float16), ref[f"{module}.weight"]), module
        xi = x[:, : w.shape[1]]
        y = layer(xi.float()).double()
        assert torch.allclose(y, xi @ w.t(), rtol=1e-5, atol=1e-5), module


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_inspect_reports_the_reencode(name: str) -> None:
    from qlinear.checkpoint.inspect import inspect_checkpoint

    rows = inspect_checkpoint(FIXTURES / name, dtype=torch.float32)["modules"]
    assert rows and all(r["format"] == EXPECT[name][0] and r["runs_as"] == "gemm" for r in rows)
    assert all("re-encoded to gemm in memory" in r["why"] for r in rows)


def test_a_backend_that_runs_neither_layout_is_refused_with_the_stored_formats_table() -> None:
    with pytest.raises(CheckpointError, match=r"no kernel can run this layer\ngemv 4-bit g64"):
        load_checkpoint(FIXTURES / "awq_gemv_4bit_g64", backend="gptq_torch")
