"""Real checkpoints written by AutoAWQ 0.2.9 itself (quantizer + ``save_quantized``; see make_autoawq_fixtures.py).

The oracle is the tool: each fixture carries the float16 weight AutoAWQ handed to its packer (its own
pseudo-quantized ``(q - z) * s``) and, for gemm, AutoAWQ's CPU forward on a fixed input. Reference tensors are
read with the ``safetensors`` package, never with qlinear's reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qlinear.checkpoint import load_checkpoint, plan_checkpoint
from qlinear.checkpoint.inspect import inspect_checkpoint
from qlinear.checkpoint.save import convert_checkpoint
from qlinear.layouts import awq
from tests.test_checkpoint import tool_outputs

FIXTURES = Path(__file__).parent / "fixtures"
EXPECT = {"autoawq_gemm_4bit_g64": ("gemm", 64), "autoawq_gemv_4bit_g64": ("gemv", 64),
          "autoawq_gemv_fast_4bit_g32": ("gemv_fast", 32)}


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_config_and_every_module_are_read_as_autoawq_wrote_them(name: str) -> None:
    fmt, gs = EXPECT[name]
    plan = plan_checkpoint(FIXTURES / name)
    assert len(plan.modules) == 14 and plan.modules.keys() == tool_outputs(name).keys()
    stored = load_file(FIXTURES / name / "model.safetensors")
    for module, mp in plan.modules.items():
        s = mp.scheme
        assert (s.method.value, s.format.value, s.bits, s.group_size, s.sym) == ("awq", fmt, 4, gs, False)
        leaves = {leaf: stored[f"{module}.{leaf}"] for leaf in awq.checkpoint_shapes(s)}
        again = awq.to_checkpoint(awq.from_checkpoint(leaves, s), fmt)  # our encoder writes AutoAWQ's bytes
        assert all(torch.equal(again[k], v) for k, v in leaves.items()), module


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_dequantize_equals_the_weight_autoawq_packed(name: str) -> None:
    layers = load_checkpoint(FIXTURES / name, dtype=torch.float16)
    for module, r in tool_outputs(name).items():
        w = layers[module].dequantize(torch.float32)
        assert torch.equal(w.to(torch.float16), r["weight"]), module  # one rounding of s * (q - z), as AutoAWQ


@pytest.mark.parametrize("name", sorted(EXPECT))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_forward_matches_float64_and_autoawqs_own_forward(name: str, dtype: torch.dtype) -> None:
    layers = load_checkpoint(FIXTURES / name, dtype=dtype)
    g = torch.Generator().manual_seed(3)
    for module, r in tool_outputs(name).items():
        x = r["x"] if "x" in r else torch.randn(3, r["weight"].shape[1], generator=g).to(torch.float16)
        y64 = x.double() @ r["weight"].double().t()
        y = layers[module](x.to(dtype))
        tol = 1e-2 * float(y64.abs().max())  # bfloat16 kernels round activations to 8 bits
        torch.testing.assert_close(y.double(), y64, rtol=0, atol=tol, msg=module)
        if "y" in r:  # AutoAWQ's WQLinear_GEMM forward
            torch.testing.assert_close(y.double(), r["y"].double(), rtol=0, atol=tol, msg=module)


def test_gemv_layouts_run_on_cpu_through_the_lossless_gemm_reencode() -> None:
    for name in ("autoawq_gemv_4bit_g64", "autoawq_gemv_fast_4bit_g32"):
        rows = inspect_checkpoint(FIXTURES / name, dtype=torch.float16)["modules"]
        assert {r["runs_as"] for r in rows} == {"gemm"} and all(r["kernel"] for r in rows)
    assert all(r["runs_as"] == "gemm" and "re-encoded" not in r["why"]
               for r in inspect_checkpoint(FIXTURES / "autoawq_gemm_4bit_g64")["modules"])


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_converts_to_gptq_v2_and_back_to_the_same_bytes(name: str, tmp_path: Path) -> None:
    fmt = EXPECT[name][0]
    convert_checkpoint(FIXTURES / name, tmp_path / "v2", "gptq_v2")
    convert_checkpoint(tmp_path / "v2", tmp_path / "back", fmt)
    src, back = load_file(FIXTURES / name / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    ref = tool_outputs(name)
    for module in ref:
        for leaf in ("qweight", "qzeros", "scales"):
            assert torch.equal(back[f"{module}.{leaf}"], src[f"{module}.{leaf}"]), (module, leaf)
    v2 = load_checkpoint(tmp_path / "v2")
    for module, r in ref.items():
        assert torch.equal(v2[module].dequantize(torch.float32).to(torch.float16), r["weight"]), module
