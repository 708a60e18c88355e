"""Run in .venv-ref (GPTQModel 7.7.0): random EXL3 layers through GPTQModel's ``ExllamaV3TorchLinear`` on CPU.

Usage: ``python gptqmodel_exl3_vectors.py OUT.safetensors``. Random trellis words are valid codes (every state
decodes), so each case is a random layer: int16 trellis, float16 suh/svh, float32 inputs. Saved per case: the
inputs, GPTQModel's states (``_unpack_indices``), inner weight (``_decode_inner_weight``), full weight
(``get_weight_tensor``) and forward output.
"""

from __future__ import annotations

import json
import sys

import torch
from gptqmodel.nn_modules.exllamav3_torch import ExllamaV3TorchLinear
from safetensors.torch import save_file

MARKERS = {"mcg": 0xCBAC1FED - (1 << 32), "mul1": 0x83DCD12D - (1 << 32)}
CASES = [(1, "3inst", 128, 256), (2, "mcg", 256, 128), (3, "3inst", 256, 256), (4, "mul1", 256, 384),
         (4, "3inst", 384, 256), (5, "mcg", 128, 128), (6, "3inst", 128, 256), (7, "mul1", 128, 128),
         (8, "mcg", 256, 128), (2, "mul1", 128, 256)]


def main(out: str) -> None:
    tensors, cases = {}, []
    for i, (bits, cb, k, n) in enumerate(CASES):
        g = torch.Generator().manual_seed(100 + i)
        name = f"c{i}"
        t = {"trellis": torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), generator=g,
                                      dtype=torch.int32).to(torch.int16),
             "suh": (torch.randn(k, generator=g) * 0.02).half(),
             "svh": (torch.randn(n, generator=g) * 0.05).half()}
        if cb in MARKERS:
            t[cb] = torch.tensor(MARKERS[cb], dtype=torch.int32)
        if i % 3 == 0:
            t["bias"] = torch.randn(n, generator=g).half()
        x = torch.randn(3, k, generator=g)
        layer = ExllamaV3TorchLinear.from_tensors(in_features=k, out_features=n, name=name, tensors=t)
        with torch.no_grad():
            tensors[f"{name}/states"] = layer._unpack_indices().to(torch.int32).contiguous()
            tensors[f"{name}/inner"] = layer._decode_inner_weight().contiguous()
            tensors[f"{name}/weight"] = layer.get_weight_tensor(torch.float32).contiguous()
            tensors[f"{name}/y"] = layer(x).contiguous()
        tensors[f"{name}/x"] = x
        for leaf, v in t.items():
            tensors[f"{name}/{leaf}"] = v.contiguous()
        cases.append({"name": name, "bits": bits, "codebook": cb, "k": k, "n": n, "bias": "bias" in t})
    save_file(tensors, out, metadata={"cases": json.dumps(cases)})


if __name__ == "__main__":
    main(sys.argv[1])
