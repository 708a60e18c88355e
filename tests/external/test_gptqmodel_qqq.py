"""GPTQModel 7.7.0's own QQQ layers (quantized by its QQQ ``Quantizer`` and packed by ``QQQTorchLinear.pack`` in
.venv-ref, see gptqmodel_qqq_vectors.py) against qlinear: the same packer inputs give bit-identical ``B``,
``s_channel`` and ``s_group``; qlinear decodes GPTQModel's buffers to GPTQModel's own int8 weight and channel
scales; ``QQQTorchLinear`` on them gives GPTQModel's forward bit for bit (float16 and bfloat16 inputs, an all-zero
row included), for grouped (g128) and per-channel layers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from qlinear.kernels.qqq import QQQTorchLinear
from qlinear.layouts import qqq
from qlinear.spec import Scheme

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_qqq_vectors.py")


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> tuple[list[dict], dict[str, torch.Tensor]]:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors import safe_open

    out = tmp_path_factory.mktemp("ref") / "qqq.safetensors"
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(out)], check=True, capture_output=True, timeout=600)
    with safe_open(str(out), "pt") as fh:
        return json.loads(fh.metadata()["cases"]), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def test_cases_cover_grouped_and_per_channel(vectors) -> None:
    cases, _ = vectors
    assert len(cases) == 5
    assert {c["group_size"] for c in cases} == {128, -1}


def test_pack_is_bit_exact_with_gptqmodel(vectors) -> None:
    cases, t = vectors
    for c in cases:
        n = c["name"]
        qw = qqq.from_fake_quantized(t[f"{n}/weight"], t[f"{n}/scales"], t.get(f"{n}/s_extra"), c["group_size"])
        ours = qqq.pack(qw)
        for leaf in ("B", "s_channel", "s_group"):
            theirs = t[f"{n}/{leaf}"]
            assert ours[leaf].dtype == theirs.dtype and ours[leaf].shape == theirs.shape, (n, leaf)
            assert torch.equal(ours[leaf], theirs), (n, leaf)


def test_decode_matches_gptqmodel_dequantization(vectors) -> None:
    cases, t = vectors
    for c in cases:
        n = c["name"]
        qw = qqq.unpack({leaf: t[f"{n}/{leaf}"] for leaf in ("B", "s_channel", "s_group")})
        assert qw.grouped == (c["group_size"] != -1), n
        assert torch.equal(qw.int8_weight(), t[f"{n}/w8"].t()), n
        assert torch.equal(qw.channel_scales, t[f"{n}/s_channel_unpermuted"]), n


def test_torch_kernel_matches_gptqmodel_forward(vectors) -> None:
    cases, t = vectors
    for c in cases:
        n, k, out = c["name"], c["in_features"], c["out_features"]
        gs = -1 if c["group_size"] == -1 else c["group_size"]
        scheme = Scheme(bits=4, group_size=gs, in_features=k, out_features=out, method="qqq", format="qqq")
        for tag, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
            layer = QQQTorchLinear(scheme, bias=c["bias"], dtype=dtype)
            state = {leaf: t[f"{n}/{leaf}"] for leaf in ("B", "s_channel", "s_group", "bias") if f"{n}/{leaf}" in t}
            layer.load_state_dict(state, strict=True)
            y = layer(t[f"{n}/x_{tag}"])
            assert torch.equal(t[f"{n}/y_{tag}"], t[f"{n}/y_torch_{tag}"]), (n, tag)  # GPTQModel's two CPU paths
            assert y.dtype == dtype and torch.equal(y, t[f"{n}/y_{tag}"]), (n, tag)
