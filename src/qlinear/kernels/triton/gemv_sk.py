"""Stream-K GEMV (variant ``gemv_sk``): a grid the size of the GPU, every program an equal share of the work.

The split-K GEMV (``qmm_kernel``, variant ``gemv``) cuts each N tile's K range into ``split_k`` equal
parts, so its CTA count is (N tiles x splits), rarely a multiple of what the GPU holds at once (132 SMs
x CTAs per SM on an H200): ncu on 4096x14336 showed the SMs busy for only 71% of the kernel's time.
Here the (N tile, K step) pairs are laid end to end, tile-major, and program ``c`` of ``P`` takes steps
``[c * per, (c + 1) * per)``: equal work per program, whatever N and K are. A program walks its steps tile
by tile; a tile covered by one program is written directly, one shared by several (at most
``ceil(nkb / per) + 1``) gets each program's partial in slot ``c - first`` and the last to arrive sums the
slots in order (deterministic), as the split-K epilogue does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import gemv_step, group_params, load_words, store_out, store_split
from .configs import Config
from .layout import Packed


@triton.jit
def gemv_sk_kernel(X, W, S, Z, OFF, PERM, BIAS, Y, PART, LOCK,
                   M, N, K, KW, G, KP, NP, GS, NKB, NT, PER, stride_xm, stride_ym,
                   BITS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr, ONE_GROUP: tl.constexpr,
                   HAS_Z: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                   HAS_OFF: tl.constexpr = False):
    PF: tl.constexpr = 32 // BITS
    BKW: tl.constexpr = BLOCK_K // PF
    pid_m = tl.program_id(0)
    c = tl.program_id(1)
    offs_m = pid_m + tl.arange(0, 1)
    s0 = c * PER
    s1 = tl.minimum(s0 + PER, NT * NKB)
    while s0 < s1:
        t = s0 // NKB
        e = tl.minimum(s1, (t + 1) * NKB)
        offs_n = t * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for kb in range(s0 - t * NKB, e - t * NKB):
            row0 = kb * BKW
            rows = row0 + tl.arange(0, BKW)
            w = load_words(W, rows, offs_n, KW, NP, EVEN_K, EVEN_N)
            s, z, o = group_params(S, Z, OFF, rows, row0, offs_n, G, NP, GS, PF, R, BLOCK_N, ZC, HAS_Z, ONE_GROUP,
                                   EVEN_N, HAS_OFF)
            acc += gemv_step(X, PERM, w, s, z, o, pid_m, rows, K, KP, stride_xm, BITS, R, HAS_PERM, EVEN_K, HAS_OFF)
        first = (t * NKB) // PER  # the programs that share tile t: first .. last
        last = ((t + 1) * NKB - 1) // PER
        if first == last:
            store_out(Y, BIAS, acc[None, :], offs_m, offs_n, M, N, stride_ym, HAS_BIAS)
        else:
            store_split(Y, BIAS, PART, LOCK, acc[None, :], offs_m, offs_n, M, N, stride_ym, pid_m * NT + t,
                        c - first, last - first + 1, HAS_BIAS, True, 1, BLOCK_N)
        s0 = e


def slots(nkb: int, per: int) -> int:
    """Most programs that share one N tile (partial slots per tile)."""
    return -(-nkb // per) + 1


def gemv_sk(x2: torch.Tensor, p: Packed, cfg: Config, bias: torch.Tensor | None, lock: torch.Tensor,
            y: torch.Tensor, one_group: bool) -> torch.Tensor:
    """Launch ``gemv_sk_kernel``: ``cfg.split_k`` programs per row of x (``Config`` doc: the grid size)."""
    m = x2.shape[0]
    nkb = triton.cdiv(p.qweight.shape[0], cfg.block_k * p.bits // 32)
    nt = triton.cdiv(p.n, cfg.block_n)
    if m * nt > lock.numel():
        raise ValueError(f"gemv_sk: {m} rows x {nt} N tiles need as many split-K counters, the layer has "
                         f"{lock.numel()}")
    programs = max(1, min(cfg.split_k, nt * nkb))
    per = triton.cdiv(nt * nkb, programs)
    programs = triton.cdiv(nt * nkb, per)
    part = torch.empty((slots(nkb, per), m, p.n), dtype=torch.float32, device=x2.device)
    gemv_sk_kernel[(m, programs)](
        x2, p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales, p.offset_arg(),
        p.perm if p.perm is not None else p.qweight, bias if bias is not None else y, y, part, lock,
        m, p.n, p.k, p.qweight.shape[0], p.scales.shape[0], p.kp, p.np, p.group, nkb, nt, per,
        x2.stride(0), y.stride(0),
        BITS=p.bits, R=p.rows_per_block, ZC=p.zero_const, ONE_GROUP=one_group, HAS_Z=p.zeros is not None,
        HAS_PERM=p.perm is not None, HAS_BIAS=bias is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVEN_K=p.k == p.kp and p.kp % cfg.block_k == 0, EVEN_N=p.np % cfg.block_n == 0, HAS_OFF=p.offsets is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y
