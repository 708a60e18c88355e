"""GPTQModel 7.7.0's own ParoLinear (random AWQ words and random rotations, run in .venv-ref by
gptqmodel_paro_vectors.py) against qlinear's: the rotation is bit-identical to GPTQModel's CPU rotation (and to its
``apply_paroquant_rotation_reference``) for float16 and bfloat16 inputs, krot 1..8, group sizes 32..128 and -1, the
identity transform included; ``ParoLinear``'s output is bit-identical to GPTQModel's dense path (the rotated input
times the weight dequantized in the scales' dtype). GPTQModel's default CPU forward takes the ATen int4pack or
AVX-512 kernels where the shape allows (different accumulation); where it falls back to the dense path the two
agree bit for bit as well."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from qlinear.kernels.paroquant import ParoLinear
from qlinear.layouts.paroquant import ParoParams
from qlinear.spec import Scheme

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_paro_vectors.py")
LEAVES = ("qweight", "qzeros", "scales", "pairs", "theta", "channel_scales", "bias")


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[list[dict], dict[str, torch.Tensor]]:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("ref") / "paro.safetensors"
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(out)], check=True, capture_output=True, timeout=600)
    with safe_open(str(out), "pt") as fh:
        return json.loads(fh.metadata()["cases"]), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def layer_for(c: dict, t: dict[str, torch.Tensor]) -> ParoLinear:
    n = c["name"]
    scheme = Scheme(bits=4, group_size=c["group_size"], in_features=c["in_features"],
                    out_features=c["out_features"], method="paroquant", format="paroquant",
                    layout_params=ParoParams(c["krot"]))
    layer = ParoLinear(scheme, bias=c["bias"])
    layer.load_state_dict({leaf: t[f"{n}/{leaf}"] for leaf in LEAVES if f"{n}/{leaf}" in t}, strict=True)
    return layer


def test_cases_cover_rounds_groups_and_identity(vectors) -> None:
    cases, _ = vectors
    assert {c["krot"] for c in cases} >= {1, 3, 8} and -1 in {c["group_size"] for c in cases}
    assert any(c["identity"] for c in cases)


def test_rotation_is_bit_exact_with_gptqmodel(vectors) -> None:
    cases, t = vectors
    for c in cases:
        layer = layer_for(c, t)
        layer.ensure_prepared()
        for tag in ("float16", "bfloat16"):
            n = c["name"]
            assert torch.equal(t[f"{n}/rot_{tag}"], t[f"{n}/rot_ref_{tag}"]), (n, tag)  # GPTQModel's two paths
            got = layer.rotate_input(t[f"{n}/x_{tag}"])
            assert got.dtype == t[f"{n}/rot_{tag}"].dtype and torch.equal(got, t[f"{n}/rot_{tag}"]), (n, tag)


def test_forward_is_bit_exact_with_gptqmodel_dense_path(vectors) -> None:
    cases, t = vectors
    for c in cases:
        layer, n = layer_for(c, t), c["name"]
        for tag in ("float16", "bfloat16"):
            y = layer(t[f"{n}/x_{tag}"])
            assert torch.equal(y, t[f"{n}/y_dense_{tag}"]), (n, tag)
            if c["out_features"] % 16:  # GPTQModel's int4pack/AVX-512 routes refuse N % 16: its dense path ran
                assert torch.equal(y, t[f"{n}/y_{tag}"]), (n, tag)
            else:
                torch.testing.assert_close(y, t[f"{n}/y_{tag}"], rtol=2e-2, atol=4e-2)
