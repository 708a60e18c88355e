"""GPTQModel 7.7.0's own Marlin helpers (run in .venv-ref, see gptqmodel_marlin_vectors.py) against qlinear's codec,
bit for bit: scale and bias permutations, Marlin zero points (from true zeros and from AWQ words, 4 and 8 bits),
act-order sorting, and the legacy 4-bit weight table applied by the legacy procedure."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from qlinear.layouts import marlin as m

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_marlin_vectors.py")


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[list[dict], dict[str, torch.Tensor]]:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("ref") / "marlin.safetensors"
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(out)], check=True, capture_output=True, timeout=600)
    with safe_open(str(out), "pt") as fh:
        return json.loads(fh.metadata()["cases"]), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_every_helper_agrees_bit_for_bit(vectors) -> None:
    cases, t = vectors
    seen: dict[str, int] = {}
    for c in cases:
        v = {k.split("/", 1)[1]: x for k, x in t.items() if k.startswith(c["name"] + "/")}
        kind = c["kind"]
        seen[kind] = seen.get(kind, 0) + 1
        if kind == "scales":
            assert bitwise(m.permute_scales(v["scales"]), v["out"]), c
            assert bitwise(m.unpermute_scales(v["out"]), v["scales"]), c
        elif kind == "bias":
            assert bitwise(m.permute_bias(v["bias"]), v["out"]), c
        elif kind == "zeros":
            assert bitwise(m.pack_zeros(v["zeros"], c["bits"]), v["out"]), c
            assert bitwise(m.unpack_zeros(v["out"], c["bits"]), v["zeros"]), c
        elif kind == "awq_zeros":
            assert bitwise(m.awq_to_marlin_zeros(v["qzeros"], c["bits"]), v["out"]), c
            assert bitwise(m.marlin_to_awq_zeros(v["out"], c["bits"]), v["qzeros"]), c
        elif kind == "sort":
            ours, perm = m.sort_g_idx(v["g_idx"])
            assert bitwise(ours, v["sorted"]), c
            assert torch.equal(v["g_idx"][v["perm"].long()], v["sorted"])  # GPTQModel's perm sorts too
            # torch.argsort is not stable: GPTQModel's tie order may differ from ours; both are valid sorts
            assert torch.equal(v["g_idx"][perm.long()], ours)
        else:
            perm = v["perm"] if c["act"] else None
            assert bitwise(m.pack_weight(v["codes"], 4, perm), v["out"]), c
            assert bitwise(m.unpack_weight(v["out"], 4, c["k"], c["n"], perm), v["codes"]), c
    assert seen == {"scales": 4, "bias": 1, "zeros": 4, "awq_zeros": 4, "sort": 1, "weight": 3}
