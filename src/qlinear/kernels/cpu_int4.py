"""CPU 4-bit kernels on torch's int4pack ops: TorchAten, TorchFused and TorchCpuAvx512, GPTQ and AWQ.

One runtime (``Int4PackRuntime``) serves all six classes: ``prepare()`` builds it from ``self.affine()``,
so GPTQ v1/v2 and AWQ checkpoints meet the same code. Each forward picks, from M (rows of the input):

* with the optional native extra (``pip install ./native``) on a CPU it runs on: its kernels
  (``native_int4``: AVX512-BF16 dot products for one or two rows, AMX tiles above, or AVX512-BF16 dot
  products on the decoded weight where the CPU has no AMX; the weight decoded once per call; faster than the
  op and than dense bfloat16 at every measured M, except that without AMX the op keeps a few small M where it
  measured faster: ``native_int4.OP_MAX_M_WITHOUT_AMX``),
* small M: ``_weight_int4pack_mm_for_cpu`` (bfloat16; reads the 4-bit weight once per call),
* large M (above ``INT4PACK_MAX_M``, measured): decode a tile of output channels (about 1 MiB) to
  bfloat16 ``s * (q - 8)`` from the same packed bytes and run a bfloat16 GEMM (AMX on this CPU); the
  zero offset ``(8 - z) * s`` is added as one small GEMM of group sums. No dense weight outlives a tile.
  The decode is one native pass when the optional ``qlinear_native`` extra is installed (``pip install
  ./native``), torch ops otherwise; both give the same bits.

Groups the op cannot take are made exact, not refused: a group of 512 (or a channelwise row) becomes
runs of one op group (32..256) with its scale repeated; K and N are padded with zero activations.
Group 16 has no op group: it always takes the decode path. Activations are computed in bfloat16
whatever the layer dtype (the op's only fast dtype), then cast back; float16 and float32 results are
therefore bfloat16-accurate. A forward that needs gradients takes the decode path (the op has none).
Unlike the reference's TorchFusedLinear, asymmetric zeros are honoured (formats.md 2.11).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

import torch
import torch.nn.functional as F

from ..caps import Problem
from ..enums import DEVICE
from ..target import Target
from . import native_int4
from .awq_base import AwqQuantLinear
from .gptq_base import GPTQQuantLinear
from .int4pack_runtime import Int4PackRuntime, op_group, runtime_of
from .planned import cpu as declared
from .resident_codes import CodesInRuntime
from .torch_awq import AwqTorchLinear

BF16 = torch.bfloat16
#: Largest M that still runs the int4pack op, by layer shape (K, N): above it, decode + bfloat16 GEMM.
#: Measured by ``python benchmarks/cpu_linear.py --crossover --reps 7`` on 2026-12-02 (one thread,
#: 2-core Xeon with AVX512-BF16 and AMX, torch 2.13): op vs decode ms at M = 32: 11.6 vs 16.0 (4096x4096),
#: 41.2 vs 60.7 (4096x14336); at M = 64: 23.2 vs 17.5 and 79.7 vs 62.3. The nearest shape by K*N decides.
INT4PACK_MAX_M: dict[tuple[int, int], int] = {(4096, 4096): 32, (4096, 14336): 32}
#: The same with the native decode installed (``qlinear_native``), which makes decode + GEMM cheaper:
#: op vs decode ms at M = 32: 12.4 vs 6.2 (4096x4096), 42.9 vs 26.5 (4096x14336); at M = 16 the op still
#: wins (6.5 vs 7.1, 21.6 vs 25.2). Same command, results/cpu_crossover-native-2026-12-02.md.
INT4PACK_MAX_M_NATIVE: dict[tuple[int, int], int] = {(4096, 4096): 16, (4096, 14336): 16}


def int4pack_max_m(k: int, n: int) -> int:
    """The crossover for the measured shape nearest to ``k * n`` (in log scale), for the decode in use."""
    table = INT4PACK_MAX_M_NATIVE if native_decoder() is not None else INT4PACK_MAX_M
    shape = min(table, key=lambda s: abs(math.log(s[0] * s[1]) - math.log(max(1, k * n))))
    return table[shape]


def build_runtime(layer: torch.nn.Module) -> Int4PackRuntime:
    """Convert the layer's canonical weight into the int4pack runtime (padding and group splitting)."""
    return runtime_of(layer.affine())


def native_decoder() -> Any:
    """``qlinear_native.decode_int4_bf16`` when the optional native extra is installed (``pip install
    ./native``: compiled for this CPU at install), else None; the torch-ops decode is used then."""
    global _NATIVE
    if _NATIVE is None:
        try:
            from qlinear_native import decode_int4_bf16
        except ImportError:
            decode_int4_bf16 = False
        _NATIVE = decode_int4_bf16
    return _NATIVE or None


_NATIVE: Any = None


def decode_matmul(rt: Int4PackRuntime, xb: torch.Tensor, tile_blocks: int) -> torch.Tensor:
    """``xb [M, K_pad]`` bf16 times the weight decoded ``B * tile_blocks`` output channels at a time.

    Each B-channel block of packed bytes ``[K, B/2]`` becomes bfloat16 ``s * (q - 8)`` in a reused tile
    (about 1 MiB), then one GEMM per tile: in one native pass when ``qlinear_native`` is installed, else
    with torch ops. With gradients each tile is fresh (autograd keeps it until backward). Returns
    ``[M, N_pad]``: bfloat16, or float32 when the ``(8 - z) * s`` offsets are added.
    """
    m, kp = xb.shape
    bl = rt.block
    nb, cols = rt.n_pad // bl, bl * tile_blocks
    grad = torch.is_grad_enabled() and xb.requires_grad
    native = native_decoder()
    scales = rt.scales()
    b2, shifted = torch.empty(kp, bl // 2, dtype=torch.int8), torch.empty(kp, bl // 2, dtype=torch.int8)
    signed = torch.empty(kp, bl, dtype=torch.int8)
    w = torch.empty(kp, cols, dtype=BF16)
    y = torch.empty(m, rt.n_pad, dtype=BF16)
    parts = []
    for b0 in range(0, nb, tile_blocks):
        t = min(tile_blocks, nb - b0)
        if grad:
            w = torch.empty(kp, cols, dtype=BF16)
        tile = w[:, :t * bl]
        if native is not None:  # scales applied in the same pass
            native(rt.packed[b0].data_ptr(), scales.data_ptr(), w.data_ptr(), kp, rt.group, rt.n_pad, b0 * bl,
                   t, bl // 2, cols)
        else:
            for j in range(t):  # nibble q -> signed q - 8 (q ^ 8 as 4-bit two's complement), low then high
                torch.bitwise_xor(rt.packed[b0 + j].view(torch.int8), -120, out=b2)
                torch.bitwise_left_shift(b2, 4, out=shifted)
                torch.cat([shifted >> 4, b2 >> 4], 1, out=signed)
                w[:, j * bl:(j + 1) * bl].copy_(signed)
            tile.view(kp // rt.group, rt.group, t * bl).mul_(scales[:, None, b0 * bl:(b0 + t) * bl])
        if grad:
            parts.append(xb @ tile)
        else:
            y[:, b0 * bl:(b0 + t) * bl] = xb @ tile
    if grad:
        y = torch.cat(parts, 1)
    if not rt.has_offsets:
        return y
    sums = xb.float().reshape(m, -1, rt.group).sum(2)  # [M, K_pad/gs]
    return y.float() + sums @ rt.offsets()


class Path(Enum):
    """How one forward of an int4pack layer runs."""

    NATIVE = "native extra (AVX512-BF16 / AMX)"
    OP = "int4pack op"
    DECODE = "decode + bfloat16 GEMM"


class Int4PackMixin(CodesInRuntime):
    """Runtime mixin: ``prepare()`` builds an ``Int4PackRuntime`` and drops ``qweight`` (the runtime holds every
    code: ``resident_codes.py``); ``forward`` routes by M."""

    #: Decoded elements per tile (K_pad x channels): about 1 MiB of bfloat16, kept in L2.
    TILE_ELEMENTS = 1 << 19

    @classmethod
    def auto_reasons(cls, problem: Problem, target: Target) -> list[str]:
        if problem.dtype == torch.float32 and torch.float32 in cls.caps.dtypes:
            return ["computes in bfloat16: AUTO keeps float32 layers on exact kernels "
                    "(name this backend to accept bfloat16 accuracy)"]
        return []

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        s = problem.scheme
        group = op_group(s.group_size, s.in_features, s.channelwise) or s.group_size
        if not native_int4.native_int4():
            op_max = int4pack_max_m(s.in_features, s.out_features)
            return native_int4.describe(group, f"the int4pack op up to M={op_max}, decode + bfloat16 GEMM above")
        return native_int4.describe(group, "decode + bfloat16 GEMM", native_to=native_int4.native_max_m())

    def prepare(self) -> None:
        rt = build_runtime(self)
        self.keep_words_unless(rt.readable())
        self._rt = rt
        super().prepare()
        self.drop_codes_buffer()

    def runtime_can_rebuild(self) -> bool:
        rt = self.__dict__.get("_rt")
        return rt is not None and rt.readable()

    def rebuilt_words(self) -> torch.Tensor:
        return self.words_of(self._rt.codes(self.out_features, self.in_features))

    def runtime_anchor(self) -> torch.Tensor:
        return self._rt.packed

    def drop_runtime(self) -> None:
        self._rt = None

    def path(self, m: int, grad: bool) -> Path:
        """The path for ``m`` rows (``choose_path``)."""
        return choose_path(self._rt, m, self.in_features, self.out_features, grad, type(self).__name__)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.in_features, self.out_features
        self.check_input(x, "cpu")
        self.ensure_prepared()
        rt = self._rt
        xb = x.reshape(-1, k).to(BF16)
        if xb.shape[0] == 0:
            return x.new_zeros(*x.shape[:-1], n)
        if rt.ret_idx is not None:
            xb = xb.index_select(1, rt.ret_idx)
        if rt.k_pad > k:
            xb = F.pad(xb, (0, rt.k_pad - k))
        path = self.path(xb.shape[0], torch.is_grad_enabled() and xb.requires_grad)
        y = run_path(rt, xb, path, self.TILE_ELEMENTS, type(self).__name__)[:, :n].to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], n)


def choose_path(rt: Int4PackRuntime, m: int, k: int, n: int, grad: bool, who: str) -> Path:
    """The path for ``m`` rows of a ``[n, k]`` weight: the native extra where one of its kernels runs (up to
    ``native_int4.native_max_m()``), else the op up to its measured crossover, else decode + GEMM (also for
    gradients, which neither the op nor the extra has)."""
    if grad:
        if not rt.block:
            raise RuntimeError(f"{who}: gradients need the decode path, and this torch build packs int4 in a layout "
                               "it cannot read; use backend gptq_torch / awq_torch")
        return Path.DECODE
    if m <= native_int4.native_max_m() and native_int4.kernel_for(m, rt.group, rt.block, rt.k_pad) is not None:
        return Path.NATIVE
    if rt.op and (not rt.block or m <= int4pack_max_m(k, n)):
        return Path.OP
    return Path.DECODE


class Int4PositionsForward:
    """Runtime mixin of the layers of other formats on the int4 runtime (EXL2 and MLX on CPU): ``_rt``, whose K
    positions read input channels ``_rows`` (None: in order; a channel may be read twice, as the two nibble parts
    of a wide code), built by the layer's ``prepare()``; the forward and what ``CodesInRuntime`` asks of it."""

    #: Decoded elements per tile on the decode path, as ``Int4PackMixin``'s.
    TILE_ELEMENTS = 1 << 19
    _rt: Int4PackRuntime | None = None
    _rows: torch.Tensor | None = None

    def runtime_can_rebuild(self) -> bool:
        return self._rt is not None and self._rt.readable()

    def runtime_anchor(self) -> torch.Tensor:
        return self._rt.packed

    def drop_runtime(self) -> None:
        self._rt = self._rows = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, who = self.out_features, type(self).__name__
        self.check_input(x, "cpu")
        self.ensure_prepared()
        rt = self._rt
        xb = x.reshape(-1, self.in_features).to(BF16)
        grad = torch.is_grad_enabled() and xb.requires_grad
        xp = xb if self._rows is None else xb.index_select(1, self._rows)
        positions = xp.shape[1]
        if rt.k_pad > positions:
            xp = F.pad(xp, (0, rt.k_pad - positions))
        path = choose_path(rt, xb.shape[0], positions, n, grad, who)
        y = run_path(rt, xp, path, self.TILE_ELEMENTS, who)[:, :n]
        if self.bias is not None:  # in place into float32 sums (a fresh [M, N] float32 costs a pass at large M)
            y = y.add_(self.bias) if y.dtype == torch.float32 and not grad else y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], n)


def run_path(rt: Int4PackRuntime, xb: torch.Tensor, path: Path, tile_elements: int, who: str) -> torch.Tensor:
    """``xb [M, K_pad]`` (bfloat16, K order of the runtime) times the runtime's weight on ``path``: ``[M, N_pad]``."""
    if path is Path.NATIVE:
        kernel = native_int4.kernel_for(xb.shape[0], rt.group, rt.block, rt.k_pad)
        if kernel is None:
            raise RuntimeError(f"{who}: no kernel of the native extra runs M={xb.shape[0]} here")
        return native_int4.matmul(xb, rt.packed, rt.scales_zeros, rt.group, kernel)
    if path is Path.OP:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), rt.packed.view(rt.n_pad, -1), rt.group,
                                                          rt.scales_zeros)
    return decode_matmul(rt, xb, max(1, tile_elements // (rt.k_pad * rt.block)))


def ops_reasons(target: Target) -> list[str]:
    """The op checks the AVX512 declaration does not carry (it names a native extension instead)."""
    return [f"this torch build lacks torch.ops.{op}" for op in declared.INT4PACK_CPU_OPS if not target.has_op(op)]


def xpu_reasons(target: Target) -> list[str]:
    """The fused XPU ABI (``_weight_int4pack_mm_with_scales_and_zeros``) is declared, not built."""
    return [f"{dev}: the XPU fused INT4 path is declared but not implemented in qlinear (CPU only)"
            for dev in target.devices if dev.kind is DEVICE.XPU]


class TorchAtenLinear(Int4PackMixin, GPTQQuantLinear):
    """GPTQ 4-bit on the CPU int4pack ops (decode + bf16 GEMM for large M)."""

    backend = declared.TorchAtenLinear.backend
    caps = declared.TorchAtenLinear.caps


class TorchAtenAwqLinear(Int4PackMixin, AwqQuantLinear):
    """AWQ GEMM 4-bit on the CPU int4pack ops (decode + bf16 GEMM for large M)."""

    backend = declared.TorchAtenAwqLinear.backend
    caps = declared.TorchAtenAwqLinear.caps

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return AwqTorchLinear.runtime_reasons(problem, target) + super().runtime_reasons(problem, target)


class TorchFusedLinear(Int4PackMixin, GPTQQuantLinear):
    """GPTQ 4-bit, Torch's fused INT4 ABI on CPU = the int4pack ops, asymmetric zeros honoured."""

    backend = declared.TorchFusedLinear.backend
    caps = declared.TorchFusedLinear.caps

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return xpu_reasons(target)


class TorchFusedAwqLinear(Int4PackMixin, AwqQuantLinear):
    """AWQ GEMM 4-bit, Torch's fused INT4 ABI on CPU = the int4pack ops, asymmetric zeros honoured."""

    backend = declared.TorchFusedAwqLinear.backend
    caps = declared.TorchFusedAwqLinear.caps

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return xpu_reasons(target)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return AwqTorchLinear.runtime_reasons(problem, target) + super().runtime_reasons(problem, target)


class TorchCpuAvx512Linear(Int4PackMixin, GPTQQuantLinear):
    """GPTQ 4-bit for AVX512-BF16 CPUs without a native extension: int4pack for small M, decode +
    bf16 GEMM (AMX where present) for large M and for group 16."""

    backend = declared.TorchCpuAvx512Linear.backend
    caps = declared.TorchCpuAvx512Linear.caps

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return declared.avx512_bf16_reasons(target) + ops_reasons(target)


class TorchCpuAvx512AwqLinear(Int4PackMixin, AwqQuantLinear):
    """AWQ GEMM 4-bit for AVX512-BF16 CPUs, as TorchCpuAvx512Linear."""

    backend = declared.TorchCpuAvx512AwqLinear.backend
    caps = declared.TorchCpuAvx512AwqLinear.caps

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return declared.avx512_bf16_reasons(target) + ops_reasons(target)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return AwqTorchLinear.runtime_reasons(problem, target) + super().runtime_reasons(problem, target)


KERNELS = (TorchAtenLinear, TorchAtenAwqLinear, TorchFusedLinear, TorchFusedAwqLinear, TorchCpuAvx512Linear,
           TorchCpuAvx512AwqLinear)
