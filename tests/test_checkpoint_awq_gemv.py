"""AWQ gemv / gemv_fast checkpoints written by GPTQModel 7.7.0's own packers (see make_fixtures.py, AWQ_REPACKED).

No qlinear kernel (and no GPTQModel kernel) runs these formats on the CPU, so the checkpoints are read with
``plan_checkpoint`` + ``qlinear.layouts.awq.from_checkpoint`` and compared with the weights GPTQModel's own
unpackers decode from the same buffers (layer 0, stored in ``reference/tool_outputs.safetensors``).
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
def test_no_cpu_kernel_runs_it(name: str) -> None:
    with pytest.raises(CheckpointError, match="no kernel can run this layer"):
        load_checkpoint(FIXTURES / name, backend="awq_torch")
