"""Fuzz ``hf_repack_layer`` with layers whose checkpoint buffers were tampered with after loading.

Each input takes a valid layer (GPTQ v1/v2, act-order, AWQ GEMM; 4 and 8 bits; made by ``quantize_rtn`` and
``create_layer``) and replaces one buffer with a tensor of another shape, another dtype, or other values (g_idx out of
range, NaN/Inf/negative scales, random words), then repacks it for another backend. The outcome must be a repacked
layer or a qlinear error naming the tensor; never a foreign exception, a hang or a large allocation.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from .conftest import report_and_check
from .harness import run

SPECS = (("gptq", 4, 32, False, True), ("gptq_v2", 4, 32, False, False), ("gptq", 4, 32, True, True),
         ("gemm", 4, 32, False, False), ("gptq_v2", 8, 64, False, True))
BACKENDS = {"gptq": "gptq_torch", "gptq_v2": "gptq_torch", "gemm": "awq_torch"}
#: Where the tampered layers are repacked to: the first of these that takes the clean layer.
DESTINATIONS = ("gptq_torch_aten", "gptq_torch_int8", "gptq_torch_fused", "awq_torch_aten", "awq_torch_int8",
                "gptq_torch", "awq_torch")


def make_layers() -> list[tuple[str, torch.nn.Module]]:
    from qlinear.affine import quantize_rtn
    from qlinear.build import create_layer

    gen = torch.Generator().manual_seed(0)
    out = []
    for fmt, bits, gs, desc_act, sym in SPECS:
        w = torch.randn(64, 128, generator=gen)
        q = quantize_rtn(w, bits=bits, group_size=gs, sym=sym)
        if desc_act:
            perm = torch.randperm(128, generator=gen)
            q = type(q)(q.codes, q.scales, q.zeros, q.g_idx[perm], q.bits, q.group_size, q.sym)
        layer = create_layer(q, format=fmt, backend=BACKENDS[fmt])
        out.append((destination(layer), layer))
    return out


def destination(layer: torch.nn.Module) -> str:
    from qlinear.packing import hf_repack_layer
    from qlinear.select import NoKernelError

    for backend in DESTINATIONS:
        try:
            if hf_repack_layer(layer, backend) is not layer:
                return backend
        except NoKernelError:
            continue
    raise AssertionError(f"no destination backend takes {layer.scheme}")


def tamper(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    op = rng.randrange(6)
    if op == 0 and t.dim():  # one dimension off by one, or halved
        shape = list(t.shape)
        i = rng.randrange(len(shape))
        shape[i] = rng.choice((max(shape[i] - 1, 0), shape[i] + 1, shape[i] // 2))
        return torch.zeros(shape, dtype=t.dtype)
    if op == 1:
        return t.to(rng.choice((torch.float32, torch.int64, torch.int8, torch.bfloat16, torch.uint8)))
    out = t.clone()
    flat = out.view(-1)
    if not flat.numel():
        return out
    i = rng.randrange(flat.numel())
    if out.is_floating_point():
        flat[i] = rng.choice((float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e30, 6e4))
    else:
        info = torch.iinfo(out.dtype)
        flat[i] = rng.choice((info.min, info.max, -1, 10**6 % info.max, 0))
    return out


def test_fuzz_hf_repack_layer(fuzz_inputs: int) -> None:
    from qlinear.packing import hf_repack_layer

    torch.set_num_threads(1)
    rng = random.Random(3)
    layers = make_layers()

    def inputs() -> Iterator[tuple[tuple[torch.nn.Module, str], int]]:
        for dest, layer in layers:
            yield (layer, dest), 0
        for _ in range(fuzz_inputs):
            dest, layer = rng.choice(layers)
            victim = type(layer)(layer.scheme, bias=False, dtype=layer.dtype)
            victim.load_state_dict(layer.state_dict(), strict=False)
            name = rng.choice(sorted(k for k, v in victim._buffers.items() if v is not None))
            victim._buffers[name] = tamper(victim._buffers[name], rng)
            yield (victim, dest), sum(b.numel() * b.element_size() for b in victim.buffers())

    report = run("hf_repack_layer", inputs(), lambda item: hf_repack_layer(item[0], item[1]))
    report_and_check(report)
    assert report.refused > fuzz_inputs // 4
