"""AwqExllamaV2Linear's runtime words against GPTQModel 7.7.0's own AWQ -> exllamav2 repacking
(``unpack_reorder_pack``, run in .venv-ref by gptqmodel_exllamav2_vectors.py): qlinear's runtime ``qweight``, once the
extension's ``shuffle_4bit_8`` is undone, and its ``qzeros`` equal GPTQModel's bit for bit. The shuffle itself (done
inside the CUDA extension, which cannot run here) is checked against a transcription in tests/test_exllamav2.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from qlinear import Scheme, quantize_rtn
from qlinear.kernels.exllamav2 import AwqExllamaV2Linear
from qlinear.layouts import exllamav2 as exv2

pytestmark = pytest.mark.external

ROOT = Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
SCRIPT = Path(__file__).with_name("gptqmodel_exllamav2_vectors.py")
CASES = {"g128_256x64": (256, 64, 128), "g32_128x96": (128, 96, 32), "g64_192x32": (192, 32, 64)}


def test_awq_runtime_matches_unpack_reorder_pack(tmp_path: Path) -> None:
    if not REF_PYTHON.exists():
        pytest.skip("reference environment missing: run `make .venv-ref/.installed-stamp` (GPTQModel 7.7.0 on CPU)")
    from safetensors.torch import load_file, save_file

    layers, inputs = {}, {}
    for name, (k, n, gs) in CASES.items():
        g = torch.Generator().manual_seed(k + n)
        q = quantize_rtn(torch.randn(n, k, generator=g) * 0.02, bits=4, group_size=gs, sym=False)
        layer = AwqExllamaV2Linear(Scheme(bits=4, group_size=gs, in_features=k, out_features=n, sym=False,
                                          method="awq", format="gemm"))
        layer.load_affine(q)
        layers[name] = layer
        inputs[f"{name}/qweight"], inputs[f"{name}/qzeros"] = layer.qweight, layer.qzeros
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    save_file(inputs, str(src))
    subprocess.run([str(REF_PYTHON), str(SCRIPT), str(src), str(dst)], check=True, capture_output=True, timeout=600)
    theirs = load_file(str(dst))
    for name, layer in layers.items():
        rt = layer.runtime()
        assert rt.q_perm is None
        assert torch.equal(exv2.unshuffle(rt.qweight), theirs[f"{name}/qweight"]), name
        assert torch.equal(rt.qzeros, theirs[f"{name}/qzeros"]), name
