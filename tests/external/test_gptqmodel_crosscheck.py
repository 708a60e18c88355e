"""Bit-for-bit cross-check of qlinear's GPTQ packing against GPTQModel 7.7.0 itself.

GPTQModel lives in its own virtualenv (``.venv-ref``, built by ``make test``; see
requirements/gptqmodel-crosscheck.txt). It packs every case of gptqmodel_pack_vectors.py with its
``TorchLinear.pack_original``; we pack the same inputs with ``qlinear.hf_pack_layer`` and compare
every buffer. The reference run takes about 5 s; the install about a minute (once).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from qlinear import FORMAT, Scheme, TorchLinear, hf_pack_layer
from qlinear.layouts import gptq, planar

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_pack_vectors.py")
WORDS = {"int8": torch.int8, "int16": torch.int16, "int32": torch.int32}


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[list[dict], dict[str, torch.Tensor]]:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("ref") / "vectors.safetensors"
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(out)], check=True, capture_output=True, timeout=600)
    with safe_open(str(out), "pt") as fh:
        cases = json.loads(fh.metadata()["cases"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open is not a dict)
    return cases, tensors


def pack_ours(c: dict, t: dict[str, torch.Tensor], fmt: str, pack_impl: str | None = None) -> TorchLinear:
    name = c["name"]
    scheme = Scheme(bits=c["bits"], group_size=c["group_size"], in_features=c["in_features"],
                    out_features=c["out_features"], sym=c["sym"], desc_act=c["desc_act"], format=FORMAT(fmt),
                    pack_dtype=WORDS[c["pack_dtype"]])
    module = TorchLinear(scheme, bias=c["bias"], dtype=torch.float16)
    linear = torch.nn.Linear(c["in_features"], c["out_features"], bias=c["bias"], dtype=t[f"{name}/weight"].dtype)
    linear.weight.data = t[f"{name}/weight"]
    if c["bias"]:
        linear.bias.data = t[f"{name}/bias"]
    return hf_pack_layer(module, linear, t[f"{name}/scales"], t[f"{name}/zeros"], t[f"{name}/g_idx"],
                         pack_impl=pack_impl)


def test_every_case_matches_the_reference_bit_for_bit(vectors) -> None:
    cases, t = vectors
    assert len(cases) > 100
    v1_checked = v1_refused = 0
    for c in cases:
        name = c["name"]
        fmt = "gptq_p" if c["format"] == "gptq_p" else "gptq_v2"
        ours = pack_ours(c, t, fmt)
        for key in ("qweight", "qzeros", "scales", "g_idx") + (("bias",) if c["bias"] else ()):
            ref = t[f"{name}/out.{key}"]
            assert torch.equal(getattr(ours, key), ref), f"{name}: {key} differs from GPTQModel"
        if c["format"] == "gptq_p":
            codes = t[f"{name}/codes"].to(torch.uint8)
            assert torch.equal(planar.planar_pack_rows(codes, c["bits"]), t[f"{name}/planar.rows"]), name
            zeros = t[f"{name}/zeros"].t().contiguous().to(torch.uint8)
            assert torch.equal(planar.planar_pack_cols(zeros, c["bits"]), t[f"{name}/planar.cols"]), name
            continue
        # Reading the reference's v1 words gives the true zeros back, a zero point of 0 (its borrow) included.
        v1_read = gptq.unpack_qzeros(t[f"{name}/out.qzeros_v1"], c["bits"], c["out_features"], v1=True)
        assert torch.equal(v1_read, t[f"{name}/zeros"].t().int()), f"{name}: reading v1 qzeros"
        # Writing v1: identical words wherever no zero point is 0; a zero point of 0 is refused (docs/formats.md).
        if int(t[f"{name}/zeros"].min()) == 0:
            with pytest.raises(ValueError, match="zero point 0"):
                pack_ours(c, t, "gptq")
            v1_refused += 1
        else:
            assert torch.equal(pack_ours(c, t, "gptq").qzeros, t[f"{name}/out.qzeros_v1"]), f"{name}: v1 qzeros"
            v1_checked += 1
    assert v1_checked > 20 and v1_refused > 0


def test_every_pack_impl_gives_the_reference_bits(vectors) -> None:
    cases, t = vectors
    for c in cases[::7]:
        fmt = "gptq_p" if c["format"] == "gptq_p" else "gptq_v2"
        base = pack_ours(c, t, fmt)
        for impl in ("original", "block", "auto"):
            other = pack_ours(c, t, fmt, pack_impl=impl)
            for key in ("qweight", "qzeros", "scales"):
                assert torch.equal(getattr(other, key), getattr(base, key)), f"{c['name']} {impl} {key}"
