"""GGUF blocks on torch's CPU int4pack op: the fast bfloat16 path of ``GGUFTorchLinear`` for small M, and
for every M where a kernel of the native extra runs (``native_int4``; it reads the same tensors).

Types whose values are ``scale * code + offset`` over runs of 32 (``layouts/gguf/affine32``: Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) or of 16 (``affine16``: Q2_K, Q3_K, Q6_K) are re-laid, on the first call that
needs them, as the op's 4-bit planes with that group:

* codes of up to 4 bits: one plane, codes centred on the op's 8 (2-bit ``c + 6``, 3-bit ``c + 4``), so the
  zero ``offset + 2**(bits-1) * scale`` stays small (Q3_K's is 0);
* 5- to 8-bit codes ``u = 16 * hi + lo``: two planes side by side along K, read with the activations
  twice (``[x | x]``): ``lo`` with ``scale``, ``hi`` (centred likewise) with ``16 * scale`` and zero 0; the low
  zero carries the rest, exactly ``8 * scale`` for Q8_0 (``16d * (hi - 8) + d * (lo - 8) + 8d``) and Q6_K.

Groups of 16 are below what torch's op takes (32..256): those types run only on the native extra.

The op takes bfloat16 scales and zeros, so the weight is that of the blocks with its per-32 scale (and
offset) rounded to bfloat16, the same relative rounding as the bfloat16 activations. Memory: 0.5 byte per
weight per plane plus 4 bytes per 32 weights per plane; never a dense weight. The raw blocks stay the
layer's checkpoint (memory-mapped when loaded from a file) for ``dequantize`` and the large-M path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layouts.gguf.affine16 import AFFINE16_BITS, affine16
from ..layouts.gguf.affine32 import AFFINE32_BITS, affine32
from . import native_int4
from .int4pack_runtime import pack_blocks

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
#: qtype -> (bits of its codes, values per scale)
AFFINE = {**{t: (b, 32) for t, b in AFFINE32_BITS.items()}, **{t: (b, 16) for t, b in AFFINE16_BITS.items()}}


@dataclass(eq=False)
class GGUFInt4Pack:
    """Kernel-private (never saved): the op's packed planes and their ``[groups, N_pad, 2]`` scales/zeros."""

    packed: torch.Tensor  # [N_pad, planes * K_pad / 2] uint8, the op's CPU layout
    scales_zeros: torch.Tensor  # [planes * K_pad / 32, N_pad, 2] bfloat16
    planes: int
    k_pad: int
    n_pad: int
    block: int  # channels per block of the op's packing when it is the [N/B, K, B/2] layout, else 0
    group: int = 32  # values per scale: 32, or 16 (which only the native extra takes)

    def native_kernel(self, m: int) -> native_int4.Kernel | None:
        """The native extra's kernel for ``m`` rows of these planes, if one runs them (then faster than the op at
        every M measured, one or two planes: ``benchmarks/gguf_linear.py --cpu``'s op and native columns)."""
        return native_int4.kernel_for(m, self.group, self.block, self.planes * self.k_pad)

    @property
    def op(self) -> bool:
        """Can torch's int4pack op run these planes (its groups are 32..256)?"""
        return self.group >= 32


def supported(qtype: str) -> bool:
    return qtype in AFFINE


def planes_of(qtype: str) -> int:
    return 1 if AFFINE[qtype][0] <= 4 else 2


def _plane_params(scale: torch.Tensor, offset: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """Per plane ``[N, G, 2]`` float32 (scale, zero) with ``sum over planes of (c' - 8) * S + Z == s*u + o`` for the
    shifted plane codes ``c'`` of ``_planes``. Codes are centred on the op's 8 so that the zeros stay small (they
    are rounded to bfloat16 like the scales): exact for Q3_K (zero 0), Q6_K and Q8_0 (low zero ``8 s``)."""
    if bits <= 4:
        return [torch.stack([scale, offset + (1 << (bits - 1)) * scale], -1)]
    high = 8 + (1 << (bits - 1))  # (lo - 8) s + (hi - 2**(bits-5)) 16 s == s u - high * s
    return [torch.stack([scale, offset + high * scale], -1), torch.stack([16 * scale, torch.zeros_like(scale)], -1)]


def _planes(codes: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """Unsigned ``bits``-bit codes -> 4-bit plane codes, each plane's values centred on 8 (see ``_plane_params``)."""
    if bits <= 4:
        return [codes + (8 - (1 << (bits - 1)))]
    return [codes & 15, (codes >> 4) + (8 - (1 << (bits - 5)))]


def build(qweight: torch.Tensor, qtype: str, k: int, n: int) -> GGUFInt4Pack:
    """Convert ``uint8 [n, row_bytes]`` GGML rows, ``CHUNK_ROWS`` output channels at a time (bounded temporaries)."""
    bits, group = AFFINE[qtype]
    planes = planes_of(qtype)
    affine = affine32 if group == 32 else affine16
    n_pad = -(-n // N_BLOCK) * N_BLOCK
    packed, params, block = [], [], N_BLOCK
    for r0 in range(0, n_pad, CHUNK_ROWS):
        r1 = min(n_pad, r0 + CHUNK_ROWS)
        codes, scale, offset = affine(qweight[r0:min(r1, n)], qtype, k)
        if r1 > n:  # padding channels: code 0, scale 0, offset 0 (their outputs are dropped)
            codes, scale, offset = (F.pad(t, (0, 0, 0, r1 - n)) for t in (codes, scale, offset))
        cat = torch.cat(_planes(codes.to(torch.int32), bits), 1).contiguous()
        packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(cat, 1))
        if block and not torch.equal(packed[-1].view(-1), pack_blocks(cat, N_BLOCK).view(-1)):
            block = 0  # another build's packing: the op reads it, AMX does not
        params.append(torch.cat(_plane_params(scale, offset, bits), 1))  # [rows, planes*G, 2]
    sz = torch.cat(params, 0).transpose(0, 1).to(BF16).contiguous()  # [planes*G, N_pad, 2]
    k_pad = sz.shape[0] // planes * group
    return GGUFInt4Pack(torch.cat(packed, 0), sz, planes, k_pad, n_pad, block, group)


def matmul(rt: GGUFInt4Pack, x: torch.Tensor, n: int) -> torch.Tensor:
    """``x [M, K]`` (any float dtype) -> ``[M, n]`` bfloat16 through the native extra where it runs, else the op."""
    xb = x.to(BF16)
    if rt.k_pad > xb.shape[1]:
        xb = F.pad(xb, (0, rt.k_pad - xb.shape[1]))
    if rt.planes == 2:
        xb = torch.cat([xb, xb], 1)
    kernel = rt.native_kernel(xb.shape[0])
    if kernel is not None:
        y = native_int4.matmul(xb, rt.packed, rt.scales_zeros, rt.group, kernel)
    elif rt.op:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), rt.packed, rt.group, rt.scales_zeros)
    else:
        raise RuntimeError(f"gguf_int4pack.matmul: groups of {rt.group} run only on the native extra "
                           "(pip install ./native), which cannot run this call here")
    return y[:, :n]
