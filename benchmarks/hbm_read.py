"""HBM read bandwidth for the roofline column: a contiguous Triton read (a weight-streaming kernel's pattern),
beside the device-to-device copy.

Why: on the H200 ``b.copy_(a)`` of 1 GiB measured 2.75 TB/s (read + write counted) while this read of the
8192x28672 weight reached 4.04 TB/s with 8 programs per SM, 2048 words a step, 8 warps
(``results/h200-gemv_profile-2026-12-02.md``, ``gemv_profile.py --sweep``), so a roofline against the copy read
above 100%. The quantized kernels only read their weights; their ceiling is the read rate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def flat_kernel(W, OUT, NUMEL, PER, BLOCK: tl.constexpr):
    """A contiguous read of ``PER`` words per program (the best pattern for the bytes), summed so that nothing
    is optimised away: the ceiling."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(pid * PER, tl.minimum(pid * PER + PER, NUMEL), BLOCK):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(W + offs, mask=offs < NUMEL, other=0)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


def flat_read(words: torch.Tensor, out: torch.Tensor, block: int, warps: int) -> torch.Tensor:
    """The sum (int32, wrapping) of each program's share of the int32 ``words`` into ``out`` (one slot each)."""
    numel = words.numel()
    programs = out.numel()
    per = -(-numel // programs // block) * block
    flat_kernel[(programs,)](words, out, numel, per, BLOCK=block, num_warps=warps)
    return out


def read_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes/s of one read of ``nbytes`` (median of ``reps`` CUDA-graph replays), the measured best grid."""
    from gpu_linear import timed

    words = torch.zeros(nbytes // 4, dtype=torch.int32, device=device)
    out = torch.empty(8 * torch.cuda.get_device_properties(device).multi_processor_count, dtype=torch.int32,
                      device=device)
    us = timed([lambda w: flat_read(w, out, 2048, 8)], words, reps)
    return nbytes / (us * 1e-6)
