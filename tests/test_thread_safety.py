"""Concurrent forwards of one layer from several threads give the outputs a lone thread gives.

Each CPU kernel family runs one shared layer from 8 threads at once (different inputs and batch sizes per
thread, so M-dependent paths and caches are hit together), twice: once prepared, and once right after its
checkpoint tensors were replaced, so that every thread races into the lazy re-preparation at the same moment.
On CUDA the same check runs with one stream per thread.
"""

from __future__ import annotations

import threading

import pytest
import torch

from qlinear import QuantLinear, create_layer, quantize_rtn

THREADS, ROUNDS = 8, 6
K, N = 512, 96


def affine_layer(fmt: str, backend: str, bits: int = 4, dtype: torch.dtype = torch.float16,
                 device: str = "cpu") -> QuantLinear:
    g = torch.Generator().manual_seed(bits)
    q = quantize_rtn(torch.randn(N, K, generator=g) * 0.02, bits=bits, group_size=64, sym=False)
    return create_layer(q, format=fmt, backend=backend, dtype=dtype, device=device)


LAYERS = {
    "gptq_torch": lambda: affine_layer("gptq_v2", "gptq_torch"),
    "gptq_torch_aten": lambda: affine_layer("gptq_v2", "gptq_torch_aten"),
    "gptq_torch_int8": lambda: affine_layer("gptq_v2", "gptq_torch_int8", bits=8),
    "gptq_torch_fused": lambda: affine_layer("gptq_v2", "gptq_torch_fused"),
    "awq_torch": lambda: affine_layer("gemm", "awq_torch"),
    "auto": lambda: affine_layer("gptq_v2", "auto"),
}


def inputs(device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(m, K, generator=g).to(device, dtype) for m in (1, 2, 3, 5, 8, 16, 33, 64)]


def hammer(layer: QuantLinear, xs: list[torch.Tensor], streams: list[object] | None = None) -> list[list[torch.Tensor]]:
    """Every thread runs every input ROUNDS times, all threads released together; their outputs."""
    barrier = threading.Barrier(THREADS)
    outs: list[list[torch.Tensor]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            barrier.wait()
            ctx = torch.cuda.stream(streams[t]) if streams else torch.no_grad()
            with ctx, torch.no_grad():
                for r in range(ROUNDS):
                    for i in range(len(xs)):
                        outs[t].append(layer(xs[(i + t + r) % len(xs)]).clone())
            if streams:
                streams[t].synchronize()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, f"{len(errors)} thread(s) raised: {errors[0]!r}"
    return outs


def check(layer: QuantLinear, xs: list[torch.Tensor], streams: list[object] | None = None) -> None:
    with torch.no_grad():
        alone = [layer(x).clone() for x in xs]
    for first in (False, True):
        if first:  # new checkpoint tensors: every thread meets a stale runtime state at once
            for name, buf in list(layer.named_buffers(recurse=False)):
                if buf is not None:
                    setattr(layer, name, buf.clone())
        outs = hammer(layer, xs, streams)
        for t in range(THREADS):
            for j, y in enumerate(outs[t]):
                r, i = divmod(j, len(xs))
                want = alone[(i + t + r) % len(xs)]
                assert torch.equal(y, want), f"thread {t}, call {j}: output differs from a lone thread's"


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_threads_share_one_layer(kind: str) -> None:
    torch.set_num_threads(1)
    layer = LAYERS[kind]()
    check(layer, inputs("cpu", torch.float16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["gptq_triton", "auto"])
def test_cuda_streams_share_one_layer(backend: str) -> None:
    layer = affine_layer("gptq_v2", backend, device="cuda")
    streams = [torch.cuda.Stream() for _ in range(THREADS)]
    check(layer, inputs("cuda", torch.float16), streams)
