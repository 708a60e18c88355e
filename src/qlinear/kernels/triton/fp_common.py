"""Shared pieces of the float-weight kernels (``fp8mm``, ``fp8_w8a8``, ``fp4mm``): the launch config, the
argument checks every launcher runs, the split-K scratch, and the jit helpers for block scales and tile order.

Block scales (FP8): ``scale [ceil(N / bn), ceil(K / bk)]`` float32 with ``block = (bn, bk)``; weight ``(n, k)``
is multiplied by ``scale[n // bn, k // bk]``. A kernel applies them in one of three ways (``SCALE_MODE``):

* ``0`` (``KCONST``) one scale column (``bk >= K``: per-tensor, per-channel): the float32 accumulator is scaled
  once at the end, per output column;
* ``1`` (``STEP``) every K step of ``BLOCK_K`` lies in one scale column (``bk % BLOCK_K == 0``): each step's
  partial product is scaled in float32 and added (the products themselves stay exact);
* ``3`` (``GROUPS``, CUDA-core bodies only) a step holds whole scale columns (``BLOCK_K % bk == 0``): the
  step's ``BLOCK_K / bk`` scales per row are loaded once and repeated along K in registers, and each weight
  is multiplied by its scale in float32;
* ``2`` (``FOLD``) anything else: the weight is multiplied by its scale (gathered per element) in float32
  before the product (GEMV: no extra rounding beyond float32; tensor-core tiles: one rounding to the
  activation dtype per weight). Tensor-core launchers shrink the K step first (``step_for``) so that this
  only happens for block widths that are no multiple of 16.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from .runtime import interpreting

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
KCONST, STEP, FOLD, GROUPS = 0, 1, 2, 3
#: the same modes as compile-time values the bodies can read
M_KCONST, M_STEP, M_FOLD, M_GROUPS = (tl.constexpr(v) for v in (KCONST, STEP, FOLD, GROUPS))


@dataclass(frozen=True)
class FConfig:
    """One launch of a float-weight kernel. ``variant``: ``gemv`` (CUDA cores, ``block_m`` rows a program,
    1, 2 or 4), ``skinny`` (``tl.dot`` swap-AB: weights are the MMA's M side, ``block_m`` activation rows its
    N), ``mma`` (``tl.dot`` tiles, x as A), ``dense`` (a transient dense weight + torch.matmul).
    ``group_m``: M tiles per L2 swizzle group (``mma``). ``tma``: x and weight tiles through host-built TMA
    tensor descriptors (``mma``/``skinny`` where the kernel has it; needs 16-byte row strides). ``fp8_bits``: FP8
    weights decoded by bit arithmetic instead of the hardware conversion (``fp8mm.decode_by_bits``)."""

    variant: str
    block_m: int = 16
    block_n: int = 128
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    tma: bool = False
    fp8_bits: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def short(self) -> str:
        extra = (" tma" if self.tma else "") + (" bits" if self.fp8_bits else "")
        return (f"{self.variant} {self.block_m}x{self.block_n}x{self.block_k} s{self.split_k} "
                f"w{self.num_warps} st{self.num_stages}{extra}")


def fail(op: str, name: str, expected: str, found: object) -> ValueError:
    return ValueError(f"{op}: {name}: expected {expected}, found {found}")


def check_tensor(op: str, name: str, t: object, dtypes: tuple[torch.dtype, ...] | None = None,
                 shape: tuple[int, ...] | None = None, device: torch.device | None = None,
                 contiguous: bool = True) -> None:
    """Raise ValueError naming ``name``, the expected and the found property (dtype, shape, device, layout)."""
    if not isinstance(t, torch.Tensor):
        raise fail(op, name, "a torch.Tensor", type(t).__name__)
    if dtypes is not None and t.dtype not in dtypes:
        raise fail(op, name, "dtype " + " or ".join(str(d).replace("torch.", "") for d in dtypes),
                   str(t.dtype).replace("torch.", ""))
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise fail(op, name, f"shape {list(shape)}", list(t.shape))
    if device is not None and t.device != device:
        raise fail(op, name, f"device {device} (the activations' device)", t.device)
    if contiguous and not t.is_contiguous():
        raise fail(op, name, "a contiguous tensor", f"strides {list(t.stride())}")


def check_x(op: str, x: object) -> torch.Tensor:
    """Activations: 2-D float16/bfloat16, contiguous, on CUDA (or on CPU under the interpreter)."""
    check_tensor(op, "x", x, (torch.float16, torch.bfloat16))
    assert isinstance(x, torch.Tensor)
    if x.dim() != 2:
        raise fail(op, "x", "a 2-D [M, K] tensor", f"{x.dim()}-D shape {list(x.shape)}")
    if x.device.type != "cuda" and not interpreting():
        raise fail(op, "x", "a CUDA tensor (TRITON_INTERPRET=1 runs the kernels on CPU tensors, for tests)",
                   x.device)
    return x


def check_bias(op: str, bias: object, n: int, device: torch.device) -> None:
    if bias is not None:
        check_tensor(op, "bias", bias, (torch.float16, torch.bfloat16, torch.float32), (n,), device)


def check_block(op: str, block: object, scale: object, n: int, k: int, device: torch.device,
                scale_name: str = "scale") -> tuple[int, int]:
    """``block = (bn, bk)`` positive ints; ``scale`` float32 ``[ceil(N / bn), ceil(K / bk)]`` on ``device``."""
    ok = isinstance(block, (tuple, list)) and len(block) == 2 and all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)
    if not ok:
        raise fail(op, "block", "(bn, bk), two positive ints", block)
    bn, bk = int(block[0]), int(block[1])  # type: ignore[index]
    check_tensor(op, scale_name, scale, (torch.float32,), (-(-n // bn), -(-k // bk)), device)
    return bn, bk


def check_fp8_weight(op: str, w: object, scale: object, block: object, k: int, device: torch.device,
                     dtypes: tuple[torch.dtype, ...] = FP8, scale_name: str = "scale") -> tuple[int, int, int]:
    """Weight ``[N, K]`` fp8 contiguous on x's device, and its block scales; returns ``(N, bn, bk)``."""
    check_tensor(op, "w", w, dtypes, device=device)
    assert isinstance(w, torch.Tensor)
    if w.dim() != 2 or w.shape[1] != k:
        raise fail(op, "w", f"shape [N, {k}] (K from x)", list(w.shape))
    n = w.shape[0]
    bn, bk = check_block(op, block, scale, n, k, device, scale_name)
    return n, bn, bk


def scale_mode(bk: int, k: int, block_k: int, groups: bool = False) -> int:
    """How a kernel with K steps of ``block_k`` applies block scales of width ``bk`` (module docstring);
    ``groups``: the body can repeat a step's scales along K (CUDA-core bodies)."""
    if bk >= k:
        return KCONST
    if bk % block_k == 0:
        return STEP
    return GROUPS if groups and block_k % bk == 0 else FOLD


def step_for(bk: int, k: int, block_k: int, smallest: int = 16) -> int:
    """The largest power-of-two K step <= ``block_k`` (>= ``smallest``) that keeps every step inside one scale
    column (``bk % step == 0``), else ``block_k`` unchanged (the caller then folds)."""
    if bk >= k:
        return block_k
    step = block_k
    while step >= smallest:
        if bk % step == 0:
            return step
        step //= 2
    return block_k


def split_buffers(m: int, n: int, tiles: int, split: int, device: torch.device,
                  lock: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Float32 partials ``[split, M, N]`` and the per-tile counters (int32 zeros; a caller may keep its own,
    ``>= tiles`` slots, which every launch leaves at zero) for a split-K launch, else ``(None, None)``."""
    if split <= 1:
        return None, None
    part = torch.empty((split, m, n), dtype=torch.float32, device=device)
    if lock is None or lock.numel() < tiles:
        lock = torch.zeros(tiles, dtype=torch.int32, device=device)
    return part, lock


def split_for(tiles: int, k: int, block_k: int, sms: int, waves: int = 4, min_steps: int = 2) -> int:
    """Split K so that about ``waves`` CTAs per SM exist, each keeping ``min_steps`` K steps."""
    if tiles >= sms * waves:
        return 1
    return max(1, min(-(-sms * waves // tiles), -(-k // block_k) // min_steps))


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (132 under the interpreter: the H200's, so configs match the target's)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


@triton.jit
def swizzle(pid, grid_m, grid_n, GROUP_M: tl.constexpr):
    """Tile ``(pid_m, pid_n)`` of program ``pid``: ``GROUP_M`` M tiles walk N together, so the weight tiles
    they share are read from HBM once and from L2 after."""
    width = GROUP_M * grid_n
    group = pid // width
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    return pid_m, pid_n


@triton.jit
def tile_of(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The tile of ``program_id(0)`` in a swizzled ``[M, N]`` grid: ``(pid_m, pid_n, grid_n, offs_m, offs_n, rm,
    rn)``; ``rm``/``rn`` are the offsets wrapped into range (every load in bounds; rows past M never stored)."""
    grid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = swizzle(tl.program_id(0), tl.cdiv(M, BLOCK_M), grid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return pid_m, pid_n, grid_n, offs_m, offs_n, offs_m % M, offs_n % N


@triton.jit
def k_range(K, BLOCK_K: tl.constexpr, SPLIT_K, pid_k):
    """This split's K blocks ``[kb0, kb1)``."""
    nkb = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(nkb, SPLIT_K)
    kb0 = pid_k * per
    return kb0, tl.minimum(kb0 + per, nkb)


@triton.jit
def step_scale(S, srow, k0, SBK):
    """The scale of each output row ``srow`` (offsets of ``n // bn`` rows) for the K step starting at ``k0``."""
    return tl.load(S + srow + k0 // SBK)


@triton.jit
def elem_scale(S, srow, kk, SBK, K):
    """Scales ``[len(srow), len(kk)]`` of weights at columns ``kk`` (any block width)."""
    return tl.load(S + srow[:, None] + (kk // SBK)[None, :], mask=(kk < K)[None, :], other=0.0)


@triton.jit
def repeat_cols(s, R: tl.constexpr):
    """``[BN, G] -> [BN, G * R]``: each column repeated ``R`` times (in registers)."""
    BN: tl.constexpr = s.shape[0]
    G: tl.constexpr = s.shape[1]
    return tl.reshape(tl.broadcast_to(s[:, :, None], (BN, G, R)), (BN, G * R))


@triton.jit
def group_scale(S, srow, k0, NKS, BLOCK_K: tl.constexpr, GS: tl.constexpr):
    """Scales ``[len(srow), BLOCK_K]`` of the step at ``k0`` when it holds whole scale columns of ``GS``."""
    g = k0 // GS + tl.arange(0, BLOCK_K // GS)
    s = tl.load(S + srow[:, None] + g[None, :], mask=(g < NKS)[None, :], other=0.0)
    return repeat_cols(s, GS)
