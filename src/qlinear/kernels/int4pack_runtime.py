"""The int4pack runtime: the CPU int4 kernels' private form of a 4-bit weight (``cpu_int4.py`` runs it).

Codes in the op's CPU packing (``[N/B, K, B/2]`` bytes: low nibble = channel j, high nibble = channel j + B/2 of a
block of B output channels) and bfloat16 (scale, offset) pairs per op group: the weight is ``(q - 8) * scale +
offset``. Built from an ``AffineWeight`` (GPTQ, AWQ, EXL2's parts) or from codes and pairs directly (MLX's float
biases); read back to codes for the layers that drop their packed words (``resident_codes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..layouts.int4pack import OP_GROUP_SIZES, to_int4pack_inputs
from .planned import cpu as declared

#: Output channels per block of the op's CPU packing, by build: [N/B, K, B/2] bytes, low nibble = channel j,
#: high nibble = channel j + B/2 (AVX512: B = 64, AVX2: 32). Each prepare compares the op's bytes with ours.
BLOCKS = (64, 32)
BLOCK = BLOCKS[0]  # N is padded to a multiple of this
def op_group(group_size: int, k: int, channelwise: bool) -> int | None:
    """The op group that splits ``group_size`` exactly (largest), or None (group 16: decode only)."""
    if channelwise:  # any split works: pick the least K padding, then the largest group
        return min(OP_GROUP_SIZES, key=lambda g: (-(-k // g) * g, -g))
    return next((g for g in sorted(OP_GROUP_SIZES, reverse=True) if group_size % g == 0), None)


def pack_blocks(codes: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """``[N, K]`` codes (N a multiple of ``block``) -> ``[N/block, K, block/2]`` bytes, the op's CPU layout."""
    c = codes.to(torch.uint8).view(-1, 2, block // 2, codes.shape[1])
    return (c[:, 0] | (c[:, 1] << 4)).transpose(1, 2).contiguous()


def unpack_blocks(packed: torch.Tensor) -> torch.Tensor:
    """``pack_blocks`` undone: ``[N/B, K, B/2]`` bytes -> codes ``[N, K]`` uint8."""
    blocks, k, half = packed.shape
    return torch.stack((packed & 15, packed >> 4), dim=1).transpose(2, 3).reshape(blocks * 2 * half, k)


@dataclass(eq=False)
class Int4PackRuntime:
    """Kernel-private tensors (never saved): packed codes, per-op-group scales and offsets, K order."""

    packed: torch.Tensor  # [N_pad/B, K_pad, B/2] uint8; also the op's [N_pad, K_pad/2] bytes
    scales_zeros: torch.Tensor  # [K_pad/gs, N_pad, 2] bf16 (scale, (8 - z) * scale): every path reads these
    op: bool  # the int4pack op can run this group
    has_offsets: bool  # some (8 - z) * s is not zero
    ret_idx: torch.Tensor | None  # input channel read at each position, None when plain
    group: int
    k_pad: int
    n_pad: int
    block: int  # B of ``packed``; 0 when the op's bytes are in a layout the decode path cannot read

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.packed, self.scales_zeros, self.ret_idx) if t is not None]

    def readable(self) -> bool:
        """Can ``codes`` read the codes back? (Not where the op's bytes are in a layout of this torch build's own.)"""
        return bool(self.block)

    def codes(self, n: int, k: int) -> torch.Tensor:
        """The codes ``[n, k]`` uint8 in input-channel order, read back from ``packed`` (``readable()`` must hold)."""
        if not self.readable():
            raise ValueError("codes: this torch build packs int4 in a layout the decode path cannot read back")
        at_positions = unpack_blocks(self.packed)[:n, :k]
        if self.ret_idx is None:
            return at_positions
        codes = torch.empty_like(at_positions)
        codes[:, self.ret_idx] = at_positions  # position p holds input channel ret_idx[p]
        return codes

    def scales(self) -> torch.Tensor:
        """``[K_pad/gs, N_pad]`` bf16, contiguous: the decode path's, taken per call (1/gs of the tile work) rather
        than kept beside ``scales_zeros``."""
        return self.scales_zeros[..., 0].contiguous()

    def offsets(self) -> torch.Tensor:
        """``[K_pad/gs, N_pad]`` float32 ``(8 - z) * s`` (the bf16 pairs' values, exactly), per call as ``scales``."""
        return self.scales_zeros[..., 1].float()


def runtime_of(q: Any) -> Int4PackRuntime:
    """The int4pack runtime of a 4-bit ``AffineWeight`` (also for weights that are parts of another format's layer:
    ``exl2_cpu.py``)."""
    inputs = to_int4pack_inputs(q)  # codes reordered so each group is contiguous, [G, N, 2] bf16
    return runtime_from_pairs(inputs.weight, inputs.scales_and_zeros, q.group_size, q.num_groups == 1,
                              inputs.ret_idx)


def runtime_from_pairs(codes: torch.Tensor, pairs: torch.Tensor, group_size: int, channelwise: bool = False,
                       ret_idx: torch.Tensor | None = None) -> Int4PackRuntime:
    """The runtime of codes ``[N, K]`` (0..15, groups contiguous along K) and bf16 ``pairs [G, N, 2]`` of (scale,
    offset): the weight is ``(q - 8) * scale + offset`` (an affine zero gives offset ``(8 - z) * s``; formats with
    float offsets, as MLX's biases, give theirs: ``mlx_cpu.py``)."""
    n, k = codes.shape
    gop = op_group(group_size, k, channelwise)
    group = gop or group_size
    k_pad, n_pad = -(-k // group) * group, -(-n // BLOCK) * BLOCK
    if (k_pad, n_pad) != (k, n):
        codes = F.pad(codes, (0, k_pad - k, 0, n_pad - n), value=8)
    per = -(-group_size // group)  # op groups per real group
    sz = pairs.repeat_interleave(per, 0)[: k_pad // group]
    sz = F.pad(sz, (0, 0, 0, n_pad - n)).contiguous()
    op_ok = gop is not None and all(hasattr(torch.ops.aten, o.split(".")[1]) for o in declared.INT4PACK_CPU_OPS)
    packed, block = pack_blocks(codes), BLOCK
    if op_ok:
        theirs = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
        block = next((b for b in BLOCKS if torch.equal(theirs.view(-1), pack_blocks(codes, b).view(-1))), 0)
        packed = theirs.view(n_pad // block, k_pad, block // 2) if block else theirs  # 0: op for every M
    return Int4PackRuntime(packed=packed, scales_zeros=sz, op=op_ok, has_offsets=bool(sz[..., 1].any()),
                           ret_idx=ret_idx, group=group, k_pad=k_pad, n_pad=n_pad, block=block)
