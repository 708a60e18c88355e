"""GPTQModel 7.7.0's ``ExllamaV3TorchLinear`` (run in .venv-ref on random EXL3 layers, see gptqmodel_exl3_vectors.py)
against qlinear: the trellis states are identical for widths 1..8; qlinear's float16 inner weight is GPTQModel's
float32 one rounded to float16, bit for bit, for all three codebooks (GPTQModel keeps the unrounded sum, exllamav3's
CUDA decode rounds it: qlinear follows exllamav3); the full weight and the forward agree to that rounding
(relative 2^-11 of a value, so 1e-3 of the output's scale)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from qlinear.kernels.exl3 import ExllamaV3TorchLinear
from qlinear.layouts import exl3
from qlinear.layouts.exl3 import Exl3Params
from qlinear.spec import Scheme

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_exl3_vectors.py")
LEAVES = ("trellis", "suh", "svh", "mcg", "mul1", "bias")


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[list[dict], dict[str, torch.Tensor]]:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("ref") / "exl3.safetensors"
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(out)], check=True, capture_output=True, timeout=600)
    with safe_open(str(out), "pt") as fh:
        return json.loads(fh.metadata()["cases"]), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def module(c: dict, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {leaf: t[f"{c['name']}/{leaf}"] for leaf in LEAVES if f"{c['name']}/{leaf}" in t}


def test_cases_cover_every_width_and_codebook(vectors) -> None:
    cases, _ = vectors
    assert {c["bits"] for c in cases} == set(range(1, 9))
    assert {c["codebook"] for c in cases} == set(exl3.CODEBOOKS)


def test_states_and_inner_weight_match(vectors) -> None:
    cases, t = vectors
    for c in cases:
        n, bits = c["name"], c["bits"]
        assert torch.equal(exl3.tile_states(t[f"{n}/trellis"], bits).to(torch.int32), t[f"{n}/states"]), n
        ours = exl3.inner_weight(t[f"{n}/trellis"], bits, exl3.codebook_table(c["codebook"]))
        assert torch.equal(ours, t[f"{n}/inner"].half()), n


def test_weight_and_forward_agree_to_the_codebook_rounding(vectors) -> None:
    cases, t = vectors
    for c in cases:
        n = c["name"]
        params = Exl3Params(c["bits"], c["codebook"])
        w = exl3.dense_weight(module(c, t), params)
        ref = t[f"{n}/weight"]
        torch.testing.assert_close(w, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
        layer = ExllamaV3TorchLinear(Scheme(bits=c["bits"], group_size=-1, in_features=c["k"], out_features=c["n"],
                                            method="exl3", format="exl3", pack_dtype=torch.int16,
                                            layout_params=params), bias=c["bias"], dtype=torch.float32)
        layer.load_state_dict(module(c, t), strict=True)
        y, want = layer(t[f"{n}/x"]), t[f"{n}/y"]
        torch.testing.assert_close(y, want, rtol=1e-3, atol=1e-3 * want.abs().max().item())
