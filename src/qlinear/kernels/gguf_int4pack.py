"""GGUF blocks on torch's CPU int4pack op: the fast bfloat16 path of ``GGUFTorchLinear`` for small M, and
for every M where a kernel of the native extra runs (``native_int4``; it reads the same tensors).

Types whose values are ``scale * code + offset`` over runs of 32 (``layouts/gguf/affine32``: Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) are re-laid, once per prepare, as the op's 4-bit planes with group 32:

* 4-bit codes: one plane, ``zero = offset + 8 * scale``;
* 5- and 8-bit codes ``u = 16 * hi + lo``: two planes side by side along K, read with the activations
  twice (``[x | x]``): ``lo`` with ``scale``, ``hi`` with ``16 * scale``. The zeros are split so that the
  signed types need no large offsets: Q8_0 becomes ``16d * (hi - 8) + d * lo`` exactly.

The op takes bfloat16 scales and zeros, so the weight is that of the blocks with its per-32 scale (and
offset) rounded to bfloat16, the same relative rounding as the bfloat16 activations. Memory: 0.5 byte per
weight per plane plus 4 bytes per 32 weights per plane; never a dense weight. The raw blocks stay the
layer's checkpoint (memory-mapped when loaded from a file) for ``dequantize`` and the large-M path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layouts.gguf.affine32 import AFFINE32_BITS, affine32
from . import native_int4
from .cpu_int4 import pack_blocks

BF16 = torch.bfloat16
#: Output channels are padded to this (the op's AVX512 packing block); rows are converted in chunks of it.
N_BLOCK = 64
CHUNK_ROWS = 16 * N_BLOCK
#: Largest M that runs the op, per plane count: the op re-reads the weight for every row of M, so above
#: this the decode path (one decode, one GEMM) wins. Measured with ``python benchmarks/gguf_linear.py --cpu
#: --ms 1,4,16,32,64 --reps 7`` (one thread, this repo's CPU; results/cpu-gguf_linear-int4pack-2026-12-02.md):
#: 4096x4096 Q4_0 at M=64, op 25.6 ms vs decode 58.7; Q8_0 (two planes) at M=32, 27.1 vs 31.9, at M=64,
#: 52.4 vs 39.7.
MAX_M = {1: 64, 2: 32}


@dataclass(eq=False)
class GGUFInt4Pack:
    """Kernel-private (never saved): the op's packed planes and their ``[groups, N_pad, 2]`` scales/zeros."""

    packed: torch.Tensor  # [N_pad, planes * K_pad / 2] uint8, the op's CPU layout
    scales_zeros: torch.Tensor  # [planes * K_pad / 32, N_pad, 2] bfloat16
    planes: int
    k_pad: int
    n_pad: int
    block: int  # channels per block of the op's packing when it is the [N/B, K, B/2] layout, else 0

    def native_kernel(self, m: int) -> native_int4.Kernel | None:
        """The native extra's kernel for ``m`` rows of these planes, if one runs them (then faster than the op at
        every M measured, one or two planes: ``benchmarks/gguf_linear.py --cpu``'s op and native columns)."""
        return native_int4.kernel_for(m, 32, self.block, self.planes * self.k_pad)


def supported(qtype: str) -> bool:
    return qtype in AFFINE32_BITS


def _plane_params(scale: torch.Tensor, offset: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """Per plane ``[N, G, 2]`` float32 (scale, zero) with ``sum over planes of (c - 8) * S + Z == s*u + o``."""
    if bits == 4:
        return [torch.stack([scale, offset + 8 * scale], -1)]
    z_hi = torch.zeros_like(scale) if bits == 8 else 128 * scale
    z_lo = offset + 136 * scale - z_hi
    return [torch.stack([scale, z_lo], -1), torch.stack([16 * scale, z_hi], -1)]


def build(qweight: torch.Tensor, qtype: str, k: int, n: int) -> GGUFInt4Pack:
    """Convert ``uint8 [n, row_bytes]`` GGML rows, ``CHUNK_ROWS`` output channels at a time (bounded temporaries)."""
    bits = AFFINE32_BITS[qtype]
    planes = 1 if bits == 4 else 2
    n_pad = -(-n // N_BLOCK) * N_BLOCK
    packed, params, block = [], [], N_BLOCK
    for r0 in range(0, n_pad, CHUNK_ROWS):
        r1 = min(n_pad, r0 + CHUNK_ROWS)
        codes, scale, offset = affine32(qweight[r0:min(r1, n)], qtype, k)
        if r1 > n:  # padding channels: code 0, scale 0, offset 0 (their outputs are dropped)
            codes, scale, offset = (F.pad(t, (0, 0, 0, r1 - n)) for t in (codes, scale, offset))
        split = [codes] if planes == 1 else [codes & 15, codes >> 4]
        cat = torch.cat(split, 1).to(torch.int32).contiguous()
        packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(cat, 1))
        if block and not torch.equal(packed[-1].view(-1), pack_blocks(cat, N_BLOCK).view(-1)):
            block = 0  # another build's packing: the op reads it, AMX does not
        params.append(torch.cat(_plane_params(scale, offset, bits), 1))  # [rows, planes*G, 2]
    sz = torch.cat(params, 0).transpose(0, 1).to(BF16).contiguous()  # [planes*G, N_pad, 2]
    k_pad = sz.shape[0] // planes * 32
    return GGUFInt4Pack(torch.cat(packed, 0), sz, planes, k_pad, n_pad, block)


def matmul(rt: GGUFInt4Pack, x: torch.Tensor, n: int) -> torch.Tensor:
    """``x [M, K]`` (any float dtype) -> ``[M, n]`` bfloat16 through the native extra where it runs, else the op."""
    xb = x.to(BF16)
    if rt.k_pad > xb.shape[1]:
        xb = F.pad(xb, (0, rt.k_pad - xb.shape[1]))
    if rt.planes == 2:
        xb = torch.cat([xb, xb], 1)
    kernel = rt.native_kernel(xb.shape[0])
    if kernel is not None:
        y = native_int4.matmul(xb, rt.packed, rt.scales_zeros, 32, kernel)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), rt.packed, 32, rt.scales_zeros)
    return y[:, :n]
