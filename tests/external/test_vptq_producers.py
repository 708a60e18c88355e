"""qlinear's VPTQ layout and Torch kernel against the producers' own code, bit for bit:

* Microsoft VPTQ 0.0.5.post1 (``pip install --no-deps vptq==0.0.5.post1``; its ``pack_index`` and the Torch path
  of ``ops.quant_gemm`` / ``ops.dequant``, run in a subprocess by vptq_producer_vectors.py): our packing equals
  ``pack_index``; our decode of its packed codes equals its dequantized weight; ``VPTQLinear`` equals its forward.
* GPTQModel 7.7.0 in .venv-ref (``VPTQLinear`` of nn_modules/qlinear/vptq_torch.py, gptqmodel_vptq_vectors.py):
  the same for its packing, ``dequantize()`` and forward (float16 and bfloat16 inputs), with its int32
  ``perm``/``outlier_indices``, outliers chosen by ``npercent`` and a zero-padded last group.

The layers are random (random codes and codebooks are valid VPTQ layers). VPTQ's residual unpacking masks the
residual code with the main code's width, so its cases keep residual codebooks no larger than the main one.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qlinear.kernels.vptq import VPTQLinear
from qlinear.layouts import vptq
from tests import vptq_cases

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
HERE = Path(__file__).parent

VPTQ_CASES = [
    ("plain", dict(k=64, n=24, v=8, c=256, bias=True)),
    ("residual", dict(k=48, n=20, v=4, c=4096, r=256, seed=1)),
    ("groups_perm_norm", dict(k=96, n=16, v=8, c=64, r=16, gs=32, perm=True, norm=True, seed=2)),
    ("outliers", dict(k=80, n=18, v=6, c=64, os=16, vo=4, co=16, norm=True, perm=True, bias=True, seed=3)),
    ("bf16", dict(k=64, n=16, v=8, c=65536, r=256, perm=True, norm=True, dtype=torch.bfloat16, seed=4)),
]
GPTQMODEL_CASES = [
    ("plain", dict(k=64, n=24, v=8, c=256, bias=True)),
    ("residual_wide", dict(k=48, n=20, v=4, c=16, r=1024, seed=1)),  # residual codes wider than the main ones
    ("padded_groups", dict(k=70, n=16, v=8, c=64, r=16, gs=32, perm=True, norm=True, seed=2)),
    ("outliers", dict(k=256, n=18, v=6, c=64, os=16, vo=4, co=16, norm=True, perm=True, bias=True, seed=3)),
    ("norm_dim1_bf16", dict(k=64, n=16, v=8, c=1024, norm=True, norm_dim=1, dtype=torch.bfloat16, seed=4)),
]


def run_script(python: str, script: str, cases: list, tmp: Path) -> tuple[list, dict, dict]:
    from safetensors import safe_open
    from safetensors.torch import save_file

    metas, tensors = [], {}
    for name, kw in cases:
        meta, t = vptq_cases.make_case(name, **kw)
        metas.append(meta)
        tensors.update({f"{name}/{k}": v.contiguous() for k, v in t.items()})
    src, dst = tmp / "in.safetensors", tmp / "out.safetensors"
    save_file(tensors, str(src), metadata={"cases": json.dumps(metas)})
    proc = subprocess.run([python, str(HERE / script), str(src), str(dst)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with safe_open(str(dst), "pt") as fh:
        return metas, tensors, {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


@pytest.fixture(scope="module")
def vptq_run(tmp_path_factory):
    if importlib.util.find_spec("vptq") is None:
        pytest.skip("VPTQ is not installed: pip install --no-deps -r requirements/nodeps-vptq.txt")
    return run_script(sys.executable, "vptq_producer_vectors.py", VPTQ_CASES, tmp_path_factory.mktemp("vptq"))


@pytest.fixture(scope="module")
def gptqmodel_run(tmp_path_factory):
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    return run_script(str(REF_PYTHON), "gptqmodel_vptq_vectors.py", GPTQMODEL_CASES,
                      tmp_path_factory.mktemp("gptqmodel"))


def layer_for(meta: dict, t: dict, packed: torch.Tensor, aux: torch.dtype, x_dtype: torch.dtype) -> VPTQLinear:
    n = meta["name"]
    mine = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith(n + "/")}
    layer = VPTQLinear(vptq_cases.scheme(meta, aux), bias="bias" in mine, dtype=x_dtype)
    layer.load_state_dict(vptq_cases.checkpoint_tensors(meta, mine, packed, aux)
                          | ({"bias": mine["bias"]} if "bias" in mine else {}), strict=True)
    return layer


def check(metas: list, t: dict, theirs: dict, aux: torch.dtype, forwards: dict) -> None:
    for meta in metas:
        n = meta["name"]
        mine = {k.split("/", 1)[1]: v for k, v in t.items() if k.startswith(n + "/")}
        p = vptq_cases.params(meta, aux)
        ours = vptq.pack_indices(mine["idx"], mine.get("res"), p)
        assert torch.equal(ours, theirs[f"{n}/indices"]), n
        layer = layer_for(meta, t, theirs[f"{n}/indices"], aux, torch.float16)
        w = layer.dequantize()
        assert w.dtype == theirs[f"{n}/weight"].dtype and torch.equal(w, theirs[f"{n}/weight"]), n
        for key, dtype in forwards.items():
            x = mine["x"].to(dtype)
            if key == "y":  # VPTQ's Torch path multiplies in the codebook dtype
                x, dtype = mine["x"], mine["x"].dtype
            layer = layer_for(meta, t, theirs[f"{n}/indices"], aux, dtype)
            y = layer(x)
            ref = theirs[f"{n}/{key}"]
            assert y.dtype == ref.dtype, (n, key)
            assert torch.equal(y, ref), (n, key)  # one row tile: the producer's own F.linear call


def test_vptq_pack_decode_forward(vptq_run) -> None:
    metas, t, theirs = vptq_run
    check(metas, t, theirs, torch.int16, {"y": torch.float16})


def test_gptqmodel_pack_decode_forward(gptqmodel_run) -> None:
    metas, t, theirs = gptqmodel_run
    check(metas, t, theirs, torch.int32, {"y_float16": torch.float16, "y_bfloat16": torch.bfloat16})
