"""FP8 layers made by the reference GPTQModel 7.7.0 itself, saved as test vectors (run under .venv-ref)::

    python tests/external/gptqmodel_fp8_vectors.py OUT.safetensors

For each case a ``TorchFP8Linear`` (GPTQModel's) packs a random ``nn.Linear`` with ``pack_original`` and the
script stores its checkpoint buffers as GPTQModel saves them (``<case>/weight``, ``<case>/weight_scale_inv``,
``<case>/bias``) and GPTQModel's own dequantizations: ``<case>/deq`` = ``dequantize_weight(dtype=float32)`` on
CPU (its CPU helper path, ``dequantize_fp8``, which guesses multiply-or-divide from the scale values) and
``<case>/deq_divide`` = ``weight / expanded scale_inv`` in float32 (its GPU path's formula), both ``[K, N]``
as GPTQModel returns them. Case parameters are in the metadata key ``cases`` (JSON). Shares no code with qlinear.
"""

from __future__ import annotations

import json
import sys

import torch


def cases() -> list[dict]:
    out = []
    for fmt in ("float8_e4m3fn", "float8_e5m2"):
        for method, block in (("row", None), ("tensor", None), ("block", [16, 32])):
            for scale in (1.0, 1000.0):  # x1000: every row's absmax >= 448, the reference CPU helper's pitfall
                out.append({"name": f"{fmt}_{method}_x{int(scale)}", "format": fmt, "method": method, "block": block,
                            "scale": scale, "in_features": 96, "out_features": 48, "bias": method == "row"})
    return out


def main(path: str) -> None:
    from gptqmodel.nn_modules.qlinear.fp8 import TorchFP8Linear
    from safetensors.torch import save_file

    tensors, meta = {}, cases()
    for i, c in enumerate(meta):
        g = torch.Generator().manual_seed(i)
        linear = torch.nn.Linear(c["in_features"], c["out_features"], bias=c["bias"])
        with torch.no_grad():
            std = 0.05 if c["scale"] == 1.0 else c["scale"]  # x1000: rows with absmax in the thousands
            linear.weight.copy_(torch.randn(c["out_features"], c["in_features"], generator=g) * std)
            if c["bias"]:
                linear.bias.copy_(torch.randn(c["out_features"], generator=g) * 0.1)
        layer = TorchFP8Linear(bits=8, group_size=-1, sym=True, desc_act=False, in_features=c["in_features"],
                               out_features=c["out_features"], bias=c["bias"], format=c["format"],
                               weight_scale_method=c["method"], weight_block_size=c["block"])
        layer.pack_original(linear, scales=None, zeros=None)
        n = c["name"]
        tensors[f"{n}/source"] = linear.weight.detach().clone()
        tensors[f"{n}/weight"] = layer.weight.detach().clone()
        tensors[f"{n}/weight_scale_inv"] = layer.weight_scale_inv.detach().clone()
        if c["bias"]:
            tensors[f"{n}/bias"] = layer.bias.detach().clone()
        tensors[f"{n}/deq"] = layer.dequantize_weight(dtype=torch.float32).contiguous()
        scale = layer._expanded_scale_inv(target_device=torch.device("cpu"), target_dtype=torch.float32)
        tensors[f"{n}/deq_divide"] = (layer.weight.to(torch.float32) / scale).t().contiguous()
    save_file(tensors, path, metadata={"cases": json.dumps(meta)})


if __name__ == "__main__":
    main(sys.argv[1])
