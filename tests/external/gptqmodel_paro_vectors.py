"""ParoQuant layers run by the reference GPTQModel 7.7.0 itself, saved as test vectors (run under .venv-ref)::

    python tests/external/gptqmodel_paro_vectors.py OUT.safetensors

For each case GPTQModel's ``ParoLinear`` (``nn_modules/qlinear/paroquant.py``) is built with random AWQ GEMM words
(any int32 word is a valid set of eight 4-bit codes or zeros), random float16 scales and bias, and a random input
transform as the producers write it: ``pairs [krot, K]`` int16 with every round and group a permutation of
``0..gs-1``, ``theta [krot, K/2]`` and ``channel_scales [1, K]`` float16. Two cases take the pairs from GPTQModel's
own schedule builder (``_build_random_rotation_buffers_cpu_legacy``: a quarter of each group paired, the rest
zero-angle dummies). Stored per case ``<case>/``: those buffers, and for float16 and bfloat16 inputs ``x_<dtype>``
([5, K], one all-zero row): ``rot_<dtype>`` (the layer's own ``_rotate_inputs``, the CPU vectorized rotation),
``rot_ref_<dtype>`` (``apply_paroquant_rotation_reference`` on the same dtype-cast angles and scales),
``y_dense_<dtype>`` (``_forward_dense`` of the rotated input: dequantized weight times it) and ``y_<dtype>`` (the
layer's default CPU forward). Case parameters are in the metadata key ``cases`` (JSON). Shares no code with qlinear.
"""

from __future__ import annotations

import json
import sys

import torch


def cases() -> list[dict]:
    return [
        {"name": "g128_k8_256x128", "in_features": 256, "out_features": 128, "group_size": 128, "krot": 8,
         "bias": True, "identity": False, "schedule": True},
        {"name": "g64_k1_128x64", "in_features": 128, "out_features": 64, "group_size": 64, "krot": 1,
         "bias": False, "identity": False},
        {"name": "g32_k3_96x40", "in_features": 96, "out_features": 40, "group_size": 32, "krot": 3,
         "bias": True, "identity": False, "schedule": True},
        {"name": "channel_k2_64x16", "in_features": 64, "out_features": 16, "group_size": -1, "krot": 2,
         "bias": False, "identity": False},
        {"name": "identity_g64_128x32", "in_features": 128, "out_features": 32, "group_size": 64, "krot": 8,
         "bias": True, "identity": True},
    ]


def make_case(c: dict, g: torch.Generator) -> dict[str, torch.Tensor]:
    from gptqmodel.nn_modules.qlinear.paroquant import ParoLinear
    from gptqmodel.utils.paroquant import apply_paroquant_rotation_reference

    k, n, krot = c["in_features"], c["out_features"], c["krot"]
    gs = k if c["group_size"] == -1 else c["group_size"]
    layer = ParoLinear(bits=4, group_size=c["group_size"], sym=True, desc_act=False, in_features=k, out_features=n,
                       bias=c["bias"], register_buffers=True, krot=krot)
    t: dict[str, torch.Tensor] = {
        "qweight": torch.randint(-2**31, 2**31 - 1, (k, n // 8), dtype=torch.int32, generator=g),
        "qzeros": torch.randint(-2**31, 2**31 - 1, (k // gs, n // 8), dtype=torch.int32, generator=g),
        "scales": (torch.rand(k // gs, n, generator=g) * 0.02 + 0.001).half(),
    }
    if c["identity"]:
        pairs = torch.arange(gs, dtype=torch.int16).repeat(k // gs).expand(krot, k).contiguous()
        theta = torch.zeros(krot, k // 2, dtype=torch.float16)
        scales = torch.ones(1, k, dtype=torch.float16)
    elif c.get("schedule"):  # GPTQModel's own rotation schedule: sparse pairs padded with zero-angle dummies
        from gptqmodel.quantization.paroquant.optimization import _build_random_rotation_buffers_cpu_legacy

        pairs, dummy = _build_random_rotation_buffers_cpu_legacy(in_features=k, group_size=gs, krot=krot,
                                                                 pair_ratio=0.25, seed=7)
        theta = ((torch.rand(krot, k // 2, generator=g) * 2 - 1) * 3.2).masked_fill(dummy, 0).half()
        scales = (torch.rand(1, k, generator=g) * 1.5 + 0.5).half()
    else:
        pairs = torch.stack([torch.cat([torch.randperm(gs, generator=g) for _ in range(k // gs)])
                             for _ in range(krot)]).to(torch.int16)
        theta = ((torch.rand(krot, k // 2, generator=g) * 2 - 1) * 3.2).half()
        scales = (torch.rand(1, k, generator=g) * 1.5 + 0.5).half()
    t |= {"pairs": pairs, "theta": theta, "channel_scales": scales}
    if c["bias"]:
        t["bias"] = (torch.randn(n, generator=g) * 0.1).half()
    for name, value in t.items():
        setattr(layer, name, value.clone())
    layer.post_init()
    layer.eval()
    out = {f"{c['name']}/{name}": value for name, value in t.items()}
    for tag, dtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        x = torch.randn(5, k, generator=g).to(dtype)
        x[2] = 0
        with torch.no_grad():
            rot = layer._rotate_inputs(x)
            rot_ref = apply_paroquant_rotation_reference(x, pairs, theta.to(dtype), scales.to(dtype), gs)
            y_dense = layer._forward_dense(rot)
            y = layer(x)
        out |= {f"{c['name']}/x_{tag}": x, f"{c['name']}/rot_{tag}": rot, f"{c['name']}/rot_ref_{tag}": rot_ref,
                f"{c['name']}/y_dense_{tag}": y_dense, f"{c['name']}/y_{tag}": y}
    return out


def main(path: str) -> None:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1234)
    tensors: dict[str, torch.Tensor] = {}
    for c in cases():
        tensors |= make_case(c, g)
    save_file({k: v.clone().contiguous() for k, v in tensors.items()}, path, metadata={"cases": json.dumps(cases())})


if __name__ == "__main__":
    main(sys.argv[1])
