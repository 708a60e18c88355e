"""Run GPTQModel 7.7.0's ``VPTQLinear`` (nn_modules/qlinear/vptq_torch.py) on test cases, in .venv-ref.

Usage: ``python gptqmodel_vptq_vectors.py IN.safetensors OUT.safetensors`` (a subprocess of
test_vptq_producers.py). Per case: GPTQModel's packing of the codes (``utils.vptq.pack_vptq_indices``), its
``dequantize()`` and its ``forward(x)``; the layer is configured as GPTQModel's ``VPTQConfig`` would (outliers by
``npercent``, groups by ``group_size``) and its buffers filled with the case's tensors.
"""

from __future__ import annotations

import json
import sys

import torch
from gptqmodel.nn_modules.qlinear.vptq_torch import VPTQLinear
from gptqmodel.utils.vptq import pack_vptq_indices
from safetensors import safe_open
from safetensors.torch import save_file


def main(src: str, dst: str) -> None:
    with safe_open(src, "pt") as fh:
        cases = json.loads(fh.metadata()["cases"])
        t = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    out = {}
    for c in cases:
        n = c["name"]
        dtype = getattr(torch, c["dtype"])
        layer = VPTQLinear(bits=2, in_features=c["K"], out_features=c["N"], bias=f"{n}/bias" in t,
                           vector_lens=[c["vo"] if c["os"] else -1, c["v"]],
                           num_centroids=[c["Co"] if c["os"] else -1, c["C"]],
                           num_res_centroids=[-1, c["R"] if c["R"] > 0 else -1],
                           npercent=c["npercent"], group_size=c["gs"], enable_norm=c["norm"],
                           norm_dim=c["norm_dim"], enable_perm=c["perm"], dtype=dtype)
        assert (layer.outlier_size, layer.group_size, layer.group_num) == (c["os"], c["gs"], c["G"]), n
        ib, rb = layer.index_bits, layer.res_index_bits
        packed = pack_vptq_indices(t[f"{n}/idx"], ib, res_indices=t.get(f"{n}/res"), res_bits=rb)
        out[f"{n}/indices"] = packed.contiguous()
        with torch.no_grad():
            layer.indices.copy_(packed)
            layer.centroids.weight.copy_(t[f"{n}/centroids"])
            if c["R"] > 0:
                layer.res_centroids.weight.copy_(t[f"{n}/rcentroids"])
            if c["os"]:
                layer.outlier_centroids.weight.copy_(t[f"{n}/ocentroids"])
                layer.outlier_indices.copy_(t[f"{n}/oidx"].to(torch.int32))
            if c["perm"]:
                layer.perm.copy_(t[f"{n}/perm"].to(torch.int32))
            if c["norm"]:
                layer.weight_scale.copy_(t[f"{n}/scale"])
                layer.weight_bias.copy_(t[f"{n}/shift"])
            if f"{n}/bias" in t:
                layer.bias.copy_(t[f"{n}/bias"])
        layer._validate_loaded_state()
        out[f"{n}/weight"] = layer.dequantize().contiguous()
        for tag in ("float16", "bfloat16"):
            out[f"{n}/y_{tag}"] = layer(t[f"{n}/x"].to(getattr(torch, tag))).contiguous()
    save_file(out, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
