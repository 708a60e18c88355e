"""HBM read bandwidth for the roofline column: a Triton kernel that only reads (a weight-streaming kernel's
pattern), beside the device-to-device copy.

Why: on the H200 ``b.copy_(a)`` of 1 GiB measured 2.75 TB/s (read + write counted) while a flat Triton read of
117 MB reached 4.0 TB/s (``benchmarks/triton_notes.md``), so a roofline against the copy read above 100%. The
quantized kernels only read their weights; their ceiling is the read rate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def read_kernel(X, OUT, N, BLOCK: tl.constexpr):
    """Program ``p`` sums int32 words ``[p * BLOCK + i * programs * BLOCK ...]`` (16-byte loads, every word
    read once) and writes its sum, so nothing is optimised away."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, N, step):
        idx = start + offs
        acc += tl.load(X + idx, mask=idx < N, other=0)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


def stream_sum(x: torch.Tensor, programs: int, block: int = 4096) -> torch.Tensor:
    """Per-program sums of the int32 words of ``x`` (contiguous): the read kernel's launch (32 words a thread
    a step: eight 16-byte loads in flight)."""
    words = x.reshape(-1).view(torch.int32)
    out = torch.empty(programs, dtype=torch.int32, device=x.device)
    read_kernel[(programs,)](words, out, words.numel(), BLOCK=block, num_warps=4)
    return out


def read_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes/s of one read of ``nbytes`` (median of ``reps`` CUDA-graph replays; 8 programs per SM)."""
    from gpu_linear import timed

    x = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    programs = 8 * torch.cuda.get_device_properties(device).multi_processor_count
    us = timed([lambda x: stream_sum(x, programs)], x, reps)
    return nbytes / (us * 1e-6)
