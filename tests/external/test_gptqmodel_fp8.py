"""GPTQModel 7.7.0's own FP8 layers (packed by its TorchFP8Linear in .venv-ref, see gptqmodel_fp8_vectors.py):
qlinear reads their buffers as a GPTQModel ``fp8`` checkpoint holds them and dequantizes exactly as GPTQModel's
divide formula does, for E4M3 and E5M2, row, tensor and block scales. Where every row's absmax is >= 448,
GPTQModel's CPU helper guesses "multiply" and is ~98% wrong; qlinear reads the format's rule and is not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from qlinear.checkpoint.plan_fp8 import fp8_scheme
from qlinear.enums import FORMAT
from qlinear.layouts import float_layouts

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_fp8_vectors.py")


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[list[dict], dict[str, torch.Tensor]]:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("ref") / "fp8.safetensors"
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(out)], check=True, capture_output=True, timeout=600)
    with safe_open(str(out), "pt") as fh:
        return json.loads(fh.metadata()["cases"]), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def test_gptqmodel_fp8_buffers_decode_as_gptqmodel_divides(vectors) -> None:
    cases, t = vectors
    assert len(cases) == 12
    pitfalls = 0
    for c in cases:
        n = c["name"]
        config = {"quant_method": "fp8", "format": c["format"], "weight_scale_method": c["method"],
                  "weight_block_size": c["block"], "weight_scale_semantics": "inverse"}
        scheme = fp8_scheme(FORMAT.FP8, config, "x", c["out_features"], c["in_features"], "test")
        tensors = {"weight": t[f"{n}/weight"], "weight_scale_inv": t[f"{n}/weight_scale_inv"]}
        ours = float_layouts.from_checkpoint(tensors, scheme).dequantize(torch.float32)
        assert torch.equal(ours, t[f"{n}/deq_divide"].t()), n
        back = float_layouts.to_checkpoint(float_layouts.from_checkpoint(tensors, scheme), scheme)
        assert all(torch.equal(back[k].reshape(-1).view(torch.uint8), tensors[k].reshape(-1).view(torch.uint8))
                   and back[k].shape == tensors[k].shape for k in tensors), n
        src = t[f"{n}/source"]
        if float((t[f"{n}/deq"].t() - src).norm() / src.norm()) > 0.5:  # the reference's CPU guess went wrong
            pitfalls += 1
            assert float((ours - src).norm() / src.norm()) < 0.06, n
    assert pitfalls == 3  # E4M3 row, tensor and block at x1000
