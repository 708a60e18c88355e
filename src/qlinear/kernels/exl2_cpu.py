"""``Exl2CpuLinear``: EXL2 mixed-bit layers on CPU through qlinear's int4 kernels (native AVX512-BF16 / AMX, the
int4pack op).

``Exl2TorchLinear`` decodes the whole weight with torch in every forward (650 ms for 4096x14336 at M=1 on one
thread, 62x dense bf16). Here ``prepare()`` turns the groups into 4-bit parts once, each run by the int4 runtime
the GPTQ CPU kernels use (``int4pack_runtime.runtime_of``):

* 4, 3 and 2-bit groups: codes moved up to the constant zero 8 (``exl2_runtime.segments`` with ``CPU_BITS``), as
  the GPU path moves them to its word widths;
* 8, 6 and 5-bit groups: codes moved up to zero 128, then split into two 4-bit parts, exactly:
  ``q' - 128 = 16 (h - 8) + l`` with ``h = q' >> 4``, ``l = q' & 15`` (scales ``16 s`` and ``s``, zeros 8 and 0).

The parts are concatenated along K into one 4-bit weight (``merged``; an 8-bit row's two nibble parts read the same
input channel twice), so a forward is one gather of x and one int4 product on the path M picks
(``cpu_int4.choose_path``). The arithmetic is the GPTQ CPU kernels' (bfloat16 weights and activations, float32
sums), so float32 activations stay on the exact ``Exl2TorchLinear``. The merged weight keeps every code, so it
replaces ``q_weight`` (``Exl2ReplacedWeight``): the file's words are rebuilt from its bytes (``stored_codes_of``)
when saved, decoded or sharded.
"""

from __future__ import annotations

import math

import torch

from ..affine import AffineWeight
from ..caps import Caps, Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import exl2
from ..target import Target
from . import exl2_runtime
from .cpu_int4 import Int4PositionsForward, ops_reasons
from .exl2 import exl2_params
from .exl2_replaced import Exl2ReplacedWeight
from .int4pack_runtime import Int4PackRuntime, runtime_of

#: EXL2 width -> the width its codes take before the CPU parts are cut (8-bit runs become two 4-bit parts)
CPU_BITS = {8: 8, 6: 8, 5: 8, 4: 4, 3: 4, 2: 4}

def part_weights(q_weight: torch.Tensor, scales: torch.Tensor, p: exl2.Exl2Params) -> list[tuple[int, AffineWeight]]:
    """``(first stored row, 4-bit AffineWeight over the part's stored rows)`` per part, from ``q_weight`` and the
    float16 group scales ``[G, N]`` (``exl2.row_scales``); summed over parts they are the layer's weight exactly."""
    codes = exl2.stored_codes(q_weight, p)  # uint8 [K, N]
    n = codes.shape[1]
    out = []
    for seg in exl2_runtime.segments(p, CPU_BITS):
        c = codes[seg.row0:seg.row0 + seg.rows].to(torch.int16) + seg.shifts(p)[:, None]
        lengths = torch.tensor(p.group_rows[seg.first:seg.first + seg.count])
        s = torch.repeat_interleave(scales[seg.first:seg.first + seg.count].float(), lengths // seg.group, dim=0)
        pieces = [(c, s, 8)] if seg.bits == 4 else [(c >> 4, s * 16, 8), (c & 15, s, 0)]
        g_idx = (torch.arange(seg.rows) // seg.group).to(torch.int32)
        for cc, ss, zero in pieces:
            out.append((seg.row0, AffineWeight(cc.t().to(torch.uint8).contiguous(), ss.t().contiguous(),
                                               torch.full((n, ss.shape[0]), zero, dtype=torch.int32), g_idx, 4,
                                               seg.group, zero == 8)))
    return out


def merged(parts: list[tuple[int, AffineWeight]]) -> tuple[torch.Tensor, AffineWeight]:
    """The parts as one 4-bit weight along K: ``(stored row read at each K position, AffineWeight)``. One launch and
    no sums (at M=256 on one thread three launches and two float32 sums took 45 ms where one takes 30); groups are
    the gcd of the parts' (a longer group repeats its scale and zero)."""
    g = math.gcd(*(q.group_size for _, q in parts))
    rows = torch.cat([torch.arange(r0, r0 + q.in_features) for r0, q in parts])
    codes = torch.cat([q.codes for _, q in parts], dim=1)
    scales = torch.cat([q.scales.repeat_interleave(q.group_size // g, dim=1) for _, q in parts], dim=1)
    zeros = torch.cat([q.zeros.repeat_interleave(q.group_size // g, dim=1) for _, q in parts], dim=1)
    g_idx = (torch.arange(rows.numel()) // g).to(torch.int32)
    return rows, AffineWeight(codes, scales, zeros, g_idx, 4, g, bool((zeros == 8).all()))


def stored_codes_of(rt: Int4PackRuntime, p: exl2.Exl2Params, n: int) -> torch.Tensor:
    """``merged`` undone: the stored codes ``[K, N]`` uint8 from the runtime's bytes (``Int4PackRuntime.codes``;
    4-bit parts shifted down, the two nibble parts of a wide row joined)."""
    total = sum(seg.rows * (1 if seg.bits == 4 else 2) for seg in exl2_runtime.segments(p, CPU_BITS))
    positions = rt.codes(n, total).t()  # [K positions, N]
    codes = torch.empty(p.in_features, n, dtype=torch.uint8)
    pos = 0
    for seg in exl2_runtime.segments(p, CPU_BITS):
        c = positions[pos:pos + seg.rows].to(torch.int16)
        if seg.bits == 8:
            c = (c << 4) | positions[pos + seg.rows:pos + 2 * seg.rows]
        pos += seg.rows * (1 if seg.bits == 4 else 2)
        codes[seg.row0:seg.row0 + seg.rows] = (c - seg.shifts(p)[:, None]).to(torch.uint8)
    return codes


def runtime_of_exl2(q_weight: torch.Tensor, scales: torch.Tensor, perm: torch.Tensor,
                    p: exl2.Exl2Params) -> tuple[Int4PackRuntime, torch.Tensor]:
    """The layer's weight as one int4 runtime, its parts merged, and the input channel each K position reads
    (``perm``, int64: the input channel of each stored row)."""
    rows, q = merged(part_weights(q_weight, scales, p))
    return runtime_of(q), perm[rows].contiguous()


class Exl2CpuLinear(Int4PositionsForward, Exl2ReplacedWeight):
    """EXL2 (2/3/4/5/6/8-bit row groups) on CPU as 4-bit parts run by the int4 kernels (bfloat16 arithmetic)."""

    backend = BACKEND.EXL2_CPU
    caps = Caps(
        formats={FORMAT.EXL2: 20},
        bits=frozenset(exl2.BITS),
        group_sizes=None,
        desc_act=None,
        sym=None,
        devices=frozenset({DEVICE.CPU}),
        dtypes=frozenset({torch.float16, torch.bfloat16}),  # bfloat16 arithmetic: float32 stays on Exl2TorchLinear
        pack_dtypes=frozenset({torch.int32}),
        out_divisible=8,
    )

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return ops_reasons(target)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        p = problem.scheme.layout_params
        segs = exl2_runtime.segments(p, CPU_BITS) if isinstance(p, exl2.Exl2Params) else ()
        parts = sum(1 if s.bits == 4 else 2 for s in segs)
        rows = sum(s.rows * (1 if s.bits == 4 else 2) for s in segs)
        return (f"{parts} 4-bit part(s) merged into one 4-bit weight of {rows} K positions on the int4 kernels "
                "(4/3/2-bit groups as 4-bit codes; 8/6/5-bit groups as two exact nibble parts), on its path by M "
                "(native AVX512-BF16 / AMX, the int4pack op, decode + bfloat16 GEMM)")

    def rebuilt_words(self) -> torch.Tensor:
        p = exl2_params(self.scheme)
        return exl2.pack_codes(stored_codes_of(self._rt, p, self.out_features), p)

    def prepare(self) -> None:
        """Check the file's tensors, build the merged 4-bit runtime from them and, where its bytes can be read back,
        drop ``q_weight`` (read back from the current runtime when it was dropped before)."""
        super().prepare()  # checks the tensors; q_perm (int64), the float16 group scales
        rt, rows = runtime_of_exl2(self.q_weight, self._scales, self._perm, exl2_params(self.scheme))
        self.keep_words_unless(rt.readable())
        self._rt, self._rows = rt, rows
        self._perm = self._scales = self._groups = None  # the torch decode's tensors: the runtime holds them now
        self.drop_codes_buffer()


KERNELS = (Exl2CpuLinear,)
