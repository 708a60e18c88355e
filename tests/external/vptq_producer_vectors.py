"""Run Microsoft VPTQ 0.0.5.post1's own Python code on test cases (a subprocess of test_vptq_producers.py).

Usage: ``python vptq_producer_vectors.py IN.safetensors OUT.safetensors``. The wheel's package import pulls in
sentence_transformers and its CUDA extension; neither is needed by ``vptq/utils/pack.py`` (``pack_index``,
``unpack_index_tensor``) or ``vptq/ops/quant_gemm.py`` (``dequant``, ``quant_gemm``'s Torch path), so those two
files are loaded from the installed wheel with the unrelated imports stubbed. Writes, per case: ``indices`` packed
by ``pack_index``, the weight from ``ops.dequant`` and ``quant_gemm``'s output for ``x``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def load_vptq() -> tuple[types.ModuleType, types.ModuleType]:
    root = Path(importlib.util.find_spec("vptq").origin).parent
    for name in ("vptq", "vptq.utils", "vptq.ops", "sentence_transformers", "sentence_transformers.SentenceTransformer",
                 "accelerate", "tqdm"):
        mod = types.ModuleType(name)
        mod.__path__ = []
        mod.SentenceTransformer = type("SentenceTransformer", (), {})
        sys.modules[name] = mod
    mods = []
    for name, rel in (("vptq.utils.pack", "utils/pack.py"), ("vptq.ops.quant_gemm", "ops/quant_gemm.py")):
        spec = importlib.util.spec_from_file_location(name, root / rel)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods[0], mods[1]


def main(src: str, dst: str) -> None:
    pack, qg = load_vptq()
    with safe_open(src, "pt") as fh:
        cases = json.loads(fh.metadata()["cases"])
        t = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    out = {}
    for c in cases:
        n = c["name"]
        ib = (c["C"] - 1).bit_length()
        rb = (c["R"] - 1).bit_length() if c["R"] > 0 else 0
        res = t[f"{n}/res"].to(torch.int16) if c["R"] > 0 else None
        packed = pack.pack_index(t[f"{n}/idx"].to(torch.int16), ib, res, rb)
        out[f"{n}/indices"] = packed.contiguous()
        v, g = c["v"], c["G"]
        kw = dict(
            bias=t.get(f"{n}/bias"), indices=packed, centroids=t[f"{n}/centroids"],
            outlier_indices=t[f"{n}/oidx"].to(torch.int16) if c["os"] else None,
            outlier_centroids=t[f"{n}/ocentroids"] if c["os"] else None,
            residual_indices=None, residual_centroids=t[f"{n}/rcentroids"] if c["R"] > 0 else None,
            perm=t[f"{n}/perm"].to(torch.int16) if c["perm"] else None,
            weight_scale=t.get(f"{n}/scale"), weight_bias=t.get(f"{n}/shift"), vector_len=v,
            outlier_vector_len=c["vo"], num_codebooks=g, num_centroids=c["C"], num_outlier_centroids=c["Co"],
            num_res_centroids=c["R"], is_indice_packed=True, group_size=c["gs"], outlier_size=c["os"],
            in_features=c["K"], out_features=c["N"], padding=(-c["N"]) % v,
            outlier_padding=(-c["N"]) % c["vo"] if c["os"] else 0)
        out[f"{n}/y"] = qg.quant_gemm(t[f"{n}/x"], **kw).contiguous()
        # quant_gemm dequantizes with the same call; x = identity gives the weight itself (transposed)
        eye = torch.eye(c["K"], dtype=t[f"{n}/x"].dtype)
        kw["bias"] = None
        out[f"{n}/weight"] = qg.quant_gemm(eye, **kw).t().contiguous()
    save_file(out, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
