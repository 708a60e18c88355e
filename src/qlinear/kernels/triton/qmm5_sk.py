"""gemm5 over a stream-K schedule: as many CTAs as fit on the GPU at once split the tiles' K steps evenly.

With whole tiles per CTA the last wave is often part-empty: 28672 channels make 224 tiles of 128 for 132 SMs, so
the second wave runs 92 tiles while 40 SMs idle. Here all tile x K iterations are laid end to end and CTA ``c``
of ``G`` takes iterations ``[c I / G, (c + 1) I / G)``: its range crosses at most a few tile boundaries, and
each piece of a tile (a *segment*) runs gemm5's pipelined loop. A tile covered by one segment stores directly;
a tile cut by CTA boundaries gets one float32 partial per segment (slot ``2 c`` for a CTA's first segment,
``2 c + 1`` for its last), and the last segment to finish (a counter per tile) sums them in CTA order
(deterministic) and stores. No CTA waits on another, so the schedule is correct whatever runs at once; ``G``
is what fits on the GPU at once (registers and shared memory), so that it is also even.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .configs import Config
from .layout import Packed
from .qmm4 import _store_out, code_layout, cta_barrier, mma_layout
from .qmm5 import _fill, _run, row_layout, slot_rows


@gluon.jit
def _piece(r, it, it1, c, G, NDP, steps):
    """CTA ``c``'s next piece: its data-parallel tile ``c + r G`` while ``r < NDP`` (whole), then the tile of
    stream-K iteration ``it``. Returns the tile, its first K step, the piece's steps and the advanced ``r, it``."""
    dp = (r < NDP).to(gl.int32)
    ts = it // steps
    k0 = (1 - dp) * (it - ts * steps)
    n = dp * steps + (1 - dp) * gl.minimum(steps - k0, it1 - it)
    return dp * (c + r * G) + (1 - dp) * ts, k0, n, r + dp, it + (1 - dp) * n


@gluon.jit
def _sk_loader(x_desc, w_desc, s_desc, z_desc, xs, ws, ss, zs, full, empty, c, G, NDP, it0, it1, steps, tiles_m,
               GS: gl.constexpr, HAS_Z: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
               BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    i = it0 * 0
    r = it0 * 0
    it = it0
    while (r < NDP) | (it < it1):
        t, k0, n, r, it = _piece(r, it, it1, c, G, NDP, steps)
        n2 = gl.maximum(n + n % 2, 2)
        _fill(x_desc, w_desc, s_desc, z_desc, xs, ws, ss, zs, full, empty, i, (t % tiles_m) * BLOCK_M,
              (t // tiles_m) * BLOCK_N, k0, n2, GS, HAS_Z, BLOCK_K, STAGES)
        i += n2


@gluon.jit
def _owner(it, ITERS, G):
    """The CTA whose range holds iteration ``it`` (ranges start at ``floor(c I / G)``)."""
    return ((it + 1) * G + ITERS - 1) // ITERS - 1


@gluon.jit
def _sk_consumer(Y, BIAS, PART, LOCK, xs, ws, ss, zs, full, empty, c, G, NDP, it0, it1, SK0, SKI, steps, tiles_m,
                 M, N, stride_ym, ZC: gl.constexpr, HAS_Z: gl.constexpr, HAS_BIAS: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    acc_layout: gl.constexpr = mma_layout(BLOCK_M, NW)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = code_layout(BLOCK_N, BLOCK_K // 8, NW)
    r_layout: gl.constexpr = row_layout(BLOCK_N, NW)
    out_layout: gl.constexpr = gl.BlockedLayout([BLOCK_N // 32, 1], [32, 1], [1, NW], [0, 1])
    ln = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    lm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
    local = lm[None, :] * BLOCK_N + ln[:, None]  # channel-fastest, as the lanes hold them: coalesced
    i = it0 * 0
    r = it0 * 0
    it = it0
    while (r < NDP) | (it < it1):
        was = it
        t, _, n, r, it = _piece(r, it, it1, c, G, NDP, steps)
        n2 = gl.maximum(n + n % 2, 2)
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
        acc = _run(acc, i, n, n2, xs, ws, ss, zs, full, empty, ZC, HAS_Z, BLOCK_N, BLOCK_K, STAGES, a_layout,
                   w_layout, r_layout)
        out = gl.convert_layout(acc, out_layout)
        on = (t // tiles_m) * BLOCK_N + ln
        om = (t % tiles_m) * BLOCK_M + lm
        mask = (on < N)[:, None] & (om < M)[None, :]
        if n == steps:  # a whole tile in one piece
            _store_out(Y, BIAS, out, on, om, N, mask, stride_ym, HAS_BIAS)
        else:
            gl.store(PART + (2 * c + (was != it0).to(gl.int32)) * (BLOCK_N * BLOCK_M) + local, out)
            cta_barrier()  # every thread's partial is written before the counter is released
            first = _owner(t * steps - SK0, SKI, G)
            last = _owner(t * steps + steps - 1 - SK0, SKI, G)
            seen = gl.atomic_add(LOCK + t, 1, sem="acq_rel", scope="gpu")
            if seen == last - first:
                total = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, out_layout)
                for cc in range(first, last + 1):
                    # the first CTA's piece is its last one unless its range starts at the tile
                    slot = 2 * cc + ((cc == first) & (SK0 + (cc * SKI) // G != t * steps)).to(gl.int32)
                    total += gl.load(PART + slot * (BLOCK_N * BLOCK_M) + local, cache_modifier=".cg")
                _store_out(Y, BIAS, total, on, om, N, mask, stride_ym, HAS_BIAS)
                gl.atomic_xchg(LOCK + t, 0, sem="relaxed", scope="gpu")
        i += n2
    return ()


@gluon.jit
def qmm5_sk_kernel(x_desc, w_desc, s_desc, z_desc, BIAS, Y, PART, LOCK, M, N, KW, NDP, stride_ym, GS: gl.constexpr,
                   ZC: gl.constexpr, HAS_Z: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, LOADER_REGS: gl.constexpr):
    """Grid ``(G,)``: CTA ``c`` runs whole tiles ``c, c + G, ..`` (``NDP`` of them), then iterations
    ``[c I / G, (c + 1) I / G)`` of the ``I`` stream-K iterations (tile x K step) after the ``NDP G`` tiles."""
    BKW: gl.constexpr = BLOCK_K // 8
    tiles_m = gl.cdiv(M, BLOCK_M)
    steps = gl.cdiv(KW, BKW)
    G = gl.num_programs(0)
    SK0 = NDP * G * steps
    SKI = tiles_m * gl.cdiv(N, BLOCK_N) * steps - SK0
    c = gl.program_id(0)
    it0 = SK0 + (c * SKI) // G
    it1 = SK0 + ((c + 1) * SKI) // G
    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    ws = gl.allocate_shared_memory(gl.int32, [STAGES, BKW, BLOCK_N], w_desc.layout)
    ss = gl.allocate_shared_memory(s_desc.dtype, [STAGES, slot_rows(s_desc.block_type.nbytes), BLOCK_N],
                                   s_desc.layout)
    zs = gl.allocate_shared_memory(z_desc.dtype, [STAGES if HAS_Z else 1, slot_rows(z_desc.block_type.nbytes),
                                                  BLOCK_N], z_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize(
        [(_sk_consumer, (Y, BIAS, PART, LOCK, xs, ws, ss, zs, full, empty, c, G, NDP, it0, it1, SK0, SKI, steps,
                         tiles_m, M, N, stride_ym, ZC, HAS_Z, HAS_BIAS, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)),
         (_sk_loader, (x_desc, w_desc, s_desc, z_desc, xs, ws, ss, zs, full, empty, c, G, NDP, it0, it1, steps,
                       tiles_m, GS, HAS_Z, BLOCK_M, BLOCK_N, BLOCK_K, STAGES))], [1], [LOADER_REGS])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(full.index(i))
        mbarrier.invalidate(empty.index(i))


#: shared memory an SM offers its CTAs on sm_90 (227 KiB; 1 KiB of it reserved per CTA)
SM_SHARED = 227 * 1024


def resident(cfg: Config, block_k: int, scale_bytes: int) -> int:
    """CTAs of this config that fit on one SM: two under a register cap (4 + 4 warps at 128 registers), one
    otherwise; fewer when their shared-memory rings do not fit."""
    ring = cfg.num_stages * (cfg.block_m * block_k * 2 + block_k // 8 * cfg.block_n * 4 + 2 * max(128, scale_bytes))
    return max(1, min(2 if cfg.max_registers else 1, SM_SHARED // (ring + 2048)))


def data_parallel_waves(tiles: int, grid: int) -> int:
    """Waves of whole tiles before stream-K takes the rest: all of them when the tiles fill whole waves, else
    all but the last full one (stream-K then shares between one and two waves of tiles, so no piece is short)."""
    return tiles // grid if tiles % grid == 0 else max(0, tiles // grid - 1)


def launch_sk(descs: tuple, p: Packed, cfg: Config, m: int, bias: torch.Tensor | None, lock: torch.Tensor,
              y: torch.Tensor, sms: int, loader_regs: int, grid: int | None = None,
              waves: int | None = None) -> torch.Tensor:
    """Run the stream-K grid: as many CTAs as fit on the GPU at once (or ``grid``)."""
    bm, bn, bk = cfg.block_m, cfg.block_n, descs[0].block_shape[1]
    tiles = triton.cdiv(m, bm) * triton.cdiv(p.n, bn)
    iters = tiles * triton.cdiv(p.kw, bk // 8)
    grid = max(1, min(iters, grid or sms * resident(cfg, bk, bn * p.scales.element_size())))
    ndp = data_parallel_waves(tiles, grid) if waves is None else waves
    part = torch.empty((2 * grid, bn * bm), dtype=torch.float32, device=y.device)
    qmm5_sk_kernel[(grid,)](
        *descs, bias if bias is not None else y, y, part, lock, m, p.n, p.kw, ndp, y.stride(0),
        GS=p.group, ZC=p.zero_const, HAS_Z=p.zeros is not None, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=cfg.num_stages, LOADER_REGS=loader_regs,
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}), num_warps=cfg.num_warps)
    return y
