"""QQQ layers made by the reference GPTQModel 7.7.0 itself, saved as test vectors (run under .venv-ref)::

    python tests/external/gptqmodel_qqq_vectors.py OUT.safetensors

For each case a random ``nn.Linear`` is fake-quantized by GPTQModel's own QQQ ``Quantizer`` (RTN: ``find_params``
per group of ``group_size`` columns, or per row; ``quantize``), the grouped cases also get its 8-bit per-channel
``scale_extra`` exactly as ``QQQ.quantize`` computes it, and ``QQQTorchLinear.pack(linear, scales, s_extra)`` writes
the buffers. Stored per case ``<case>/``: the packer's inputs (``weight`` the fake-quantized weight, ``scales
[N, G]``, ``s_extra [1, N]``), its outputs as GPTQModel saves them (``B``, ``s_channel``, ``s_group``, ``bias``),
``_dequantize_weight_for_torch()`` (``w8`` as int8 ``[K, N]`` and ``s_channel_unpermuted``), and the forward on
``x_<dtype>`` (``[5, K]``, one all-zero row) for float16 and bfloat16: ``y_<dtype>`` (the default CPU path, the
AVX512 ``qqq_int4`` op where it is built) and ``y_torch_<dtype>`` (the plain torch path, the op disabled).
Case parameters are in the metadata key ``cases`` (JSON). Shares no code with qlinear.
"""

from __future__ import annotations

import json
import sys

import torch


def cases() -> list[dict]:
    return [
        {"name": "g128_256x128", "in_features": 256, "out_features": 128, "group_size": 128, "dtype": "float16",
         "bias": True},
        {"name": "g128_512x192", "in_features": 512, "out_features": 192, "group_size": 128, "dtype": "float16",
         "bias": False},
        {"name": "g128_bf16_384x256", "in_features": 384, "out_features": 256, "group_size": 128,
         "dtype": "bfloat16", "bias": True},
        {"name": "channel_128x256", "in_features": 128, "out_features": 256, "group_size": -1, "dtype": "float16",
         "bias": True},
        {"name": "channel_192x128", "in_features": 192, "out_features": 128, "group_size": -1, "dtype": "float16",
         "bias": False},
    ]


def fake_quantize(weight: torch.Tensor, group_size: int):
    """GPTQModel's QQQ quantizer, RTN: the fake-quantized weight, scales [N, G] and (grouped) s_extra [N, 1]."""
    from gptqmodel.quantization.qqq import Quantizer

    w = weight.float()
    k = w.shape[1]
    q = Quantizer()
    q.configure(4, perchannel=True, sym=True, groupsize=group_size, mse=False)
    step = k if group_size == -1 else group_size
    parts, scales = [], []
    for k0 in range(0, k, step):
        q.find_params(w[:, k0:k0 + step], weight=True)
        parts.append(q.quantize(w[:, k0:k0 + step]))
        scales.append(q.scale)
    extra = None
    if group_size != -1:
        qe = Quantizer()
        qe.configure(bits=8, perchannel=True, groupsize=-1, sym=True, mse=False)
        qe.find_params(weight.clone(), weight=True)
        extra = qe.scale
    return torch.cat(parts, dim=1).to(weight.dtype), torch.cat(scales, dim=1), extra


def main(path: str) -> None:
    from gptqmodel.nn_modules.qlinear.qqq import QQQTorchLinear
    from safetensors.torch import save_file

    tensors, meta = {}, cases()
    for i, c in enumerate(meta):
        g = torch.Generator().manual_seed(10 + i)
        dtype = getattr(torch, c["dtype"])
        k, n, gs = c["in_features"], c["out_features"], c["group_size"]
        linear = torch.nn.Linear(k, n, bias=c["bias"]).to(dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(n, k, generator=g) * 0.05)
            if c["bias"]:
                linear.bias.copy_(torch.randn(n, generator=g) * 0.1)
        fake, scales, extra = fake_quantize(linear.weight.detach(), gs)
        with torch.no_grad():
            linear.weight.copy_(fake)
        layer = QQQTorchLinear(bits=4, group_size=gs, desc_act=False, sym=True, in_features=k, out_features=n,
                               bias=c["bias"], register_buffers=False)
        layer.pack(linear, scales, s_extra=extra)
        layer.post_init()
        name = c["name"]
        tensors[f"{name}/weight"] = fake.contiguous()
        tensors[f"{name}/scales"] = scales.contiguous()
        if extra is not None:
            tensors[f"{name}/s_extra"] = extra.reshape(1, n).contiguous()
        for leaf in ("B", "s_channel", "s_group") + (("bias",) if c["bias"] else ()):
            tensors[f"{name}/{leaf}"] = getattr(layer, leaf).detach().clone().contiguous()
        w8, s_channel = layer._dequantize_weight_for_torch()
        tensors[f"{name}/w8"] = w8.to(torch.int8).contiguous()
        tensors[f"{name}/s_channel_unpermuted"] = s_channel.reshape(-1).contiguous()
        for xdt in (torch.float16, torch.bfloat16):
            tag = str(xdt).removeprefix("torch.")
            x = (torch.randn(5, k, generator=g) * 2).to(xdt)
            x[3] = 0  # an all-zero row: scale 0
            with torch.inference_mode():
                y = layer(x)
                packed = layer._packed_cpu_matmul
                layer._packed_cpu_matmul = lambda _a: None
                y_torch = layer(x)
                layer._packed_cpu_matmul = packed
            tensors[f"{name}/x_{tag}"] = x
            tensors[f"{name}/y_{tag}"] = y.contiguous()
            tensors[f"{name}/y_torch_{tag}"] = y_torch.contiguous()
    save_file(tensors, path, metadata={"cases": json.dumps(meta)})


if __name__ == "__main__":
    main(sys.argv[1])
