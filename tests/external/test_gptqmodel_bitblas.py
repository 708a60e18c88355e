"""GPTQModel 7.7.0's own GPTQ/AWQ unpacking for BitBLAS (run in .venv-ref, gptqmodel_bitblas_vectors.py) against
the codes and zero points qlinear's BitBLAS codec stores. 4-bit zeros agree; for 2 and 8 bits GPTQModel's
``unpack_gptq_qzeros`` masks every zero with ``0xF`` whatever the bit width, so the zeros it hands BitBLAS are wrong
(2 bits: neighbours leak in; 8 bits: the high nibble is lost). qlinear stores the true zeros; the test pins the
producer's behaviour so a fix upstream is noticed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from qlinear.layouts import awq, bitblas, gptq
from qlinear.spec import Scheme
from tests.test_bitblas import weight

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_bitblas_vectors.py")
CASES = [{"name": f"{m}_{b}_{gs}", "method": m, "bits": b, "gs": gs}
         for m, b, gs in (("gptq", 4, 32), ("gptq", 2, 64), ("gptq", 8, 32), ("gptq", 4, 128), ("awq", 4, 64))]


def bitblas_scheme(c: dict) -> Scheme:
    return Scheme(bits=c["bits"], group_size=c["gs"], in_features=128, out_features=64, sym=False,
                  method=c["method"], format="bitblas")


def test_codes_and_zeros_agree_with_gptqmodel(tmp_path: Path) -> None:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors.torch import load_file, save_file

    src, stored = {}, {}
    for c in CASES:
        s = bitblas_scheme(c)
        q = weight(s, seed=c["bits"] + c["gs"])
        if c["method"] == "gptq":
            t = gptq.to_checkpoint(q, gptq.FORMAT.GPTQ_V2, torch.int32)
        else:
            t = awq.to_checkpoint(q, awq.FORMAT.GEMM, scale_dtype=torch.float16)
        src |= {f"{c['name']}/qweight": t["qweight"], f"{c['name']}/qzeros": t["qzeros"]}
        stored[c["name"]] = bitblas.to_checkpoint(q, s)
    save_file(src, str(tmp_path / "in.safetensors"), metadata={"cases": json.dumps(CASES)})
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors")],
                   check=True, capture_output=True, timeout=300)
    ref = load_file(str(tmp_path / "out.safetensors"))
    for c in CASES:
        s, t, name, b = bitblas_scheme(c), stored[c["name"]], c["name"], c["bits"]
        assert torch.equal(bitblas.unpack_qweight(t["qweight"], b, 128).to(torch.int8), ref[f"{name}/intweight"]), c
        assert torch.equal(t["qweight"], bitblas.pack_qweight(ref[f"{name}/intweight"].view(torch.uint8), b)), c
        zeros = bitblas.decompress(t["qzeros"], b, 64).to(torch.int8)
        if b == 4:
            assert torch.equal(zeros, ref[f"{name}/intzeros"]), c
        else:  # GPTQModel's & 0xF mask (module docstring)
            assert not torch.equal(zeros, ref[f"{name}/intzeros"]), c
