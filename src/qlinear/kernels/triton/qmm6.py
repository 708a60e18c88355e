"""``gemm6``: large-M 4-bit product with the dequantization on a warpgroup of its own (Gluon, sm_90).

gemm5 (``qmm5.py``) dequantizes in the warps that issue wgmma, the weight tile going to wgmma from registers. At
M >= 1024 that is what holds it under cuBLAS (ncu on an H100, 4096x14336 M=4096: SM throughput 84.5 % against
cuBLAS's 92.8 %, issue slots 24.8 % busy against 15.8 %, 168 registers, results/h100-ncu-cells-2026-12-05.md):
the tensor pipe waits on the ALU work between wgmma issues. Here three partitions split the step:

* the loader warp brings x, the packed words and the group's scale (and zero) row by TMA into a ring of
  ``STAGES`` slots (``full`` / ``empty``; a slot is free once both readers released it);
* a transform warpgroup loads a slot's words in the wgmma A-fragment layout (``qmm4.code_layout``), dequantizes
  them exactly as gemm5 does (``qmm4._dequant``) and stores the bf16/f16 tile ``[BN, BK]`` into a second ring of
  ``WSTAGES`` swizzled tiles (``ready`` / ``free``);
* the consumer warpgroups only wait and issue wgmma with both operands in shared memory, as a dense GEMM does.

Same weights, group rows and numerics as gemm5 (4-bit, one group a step, symmetric or with zeros); no split-K
(large M has tiles enough). The consumer's first step is peeled out of its loop for the reason gemm5 gives
(ptxas serializes wgmma when a zero-trip path reaches the final wait).
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .configs import Config
from .layout import Packed
from .qmm4 import _dequant, _epilogue, code_layout, gluon_inputs, mma_layout, tma_load
from .qmm5 import _descriptor, _row, row_layout, slot_rows
from .runtime import bind_cuda_context

#: warps of the transform partition (one warpgroup: the A-fragment layout it dequantizes into is a warpgroup's)
TRANSFORM_WARPS = 4
#: registers of the loader warp and of the transform warpgroup (``setmaxnreg``); the consumers keep the rest
LOADER_REGISTERS = 40
TRANSFORM_REGISTERS = 152


@gluon.jit
def _loader(x_desc, w_desc, s_desc, z_desc, xs, ws, ss, zs, full, empty, m0, n0, steps, GS: gl.constexpr,
            HAS_Z: gl.constexpr, BLOCK_K: gl.constexpr, BKW: gl.constexpr, STAGES: gl.constexpr):
    """Step ``i``'s x tile, words and group row(s) into slot ``i % STAGES`` once the transform and the consumers
    both released it (``empty`` counts two arrivals)."""
    nbytes: gl.constexpr = (x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
                            + (z_desc.block_type.nbytes if HAS_Z else 0))
    for i in range(steps):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1
        bar = full.index(slot)
        mbarrier.expect(bar, nbytes)
        g = i * BLOCK_K // GS
        tma_load(x_desc, [m0, i * BLOCK_K], bar, xs.index(slot))
        tma_load(w_desc, [i * BKW, n0], bar, ws.index(slot))
        tma_load(s_desc, [g, n0], bar, ss.index(slot).slice(0, 1))
        if HAS_Z:
            tma_load(z_desc, [g, n0], bar, zs.index(slot).slice(0, 1))


@gluon.jit
def _transform(ws, ss, zs, wt, full, empty, ready, free, steps, ZC: gl.constexpr, HAS_Z: gl.constexpr,
               BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, WSTAGES: gl.constexpr):
    """Slot ``i``'s words -> the dequantized ``[BN, BK]`` tile in ``wt`` slot ``i % WSTAGES``."""
    NW: gl.constexpr = gl.num_warps()
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout(16, NW), k_width=2)
    w_layout: gl.constexpr = code_layout(BLOCK_N, BLOCK_K // 8, NW)
    r_layout: gl.constexpr = row_layout(BLOCK_N, NW)
    for i in range(steps):
        slot = i % STAGES
        mbarrier.wait(full.index(slot), (i // STAGES) & 1)
        w = ws.index(slot).permute((1, 0)).load(w_layout)
        s = _row(ss, slot, r_layout, w_layout, BLOCK_N)
        z = _row(zs, slot, r_layout, w_layout, BLOCK_N) if HAS_Z else s
        a = _dequant(w, s, z, ZC, HAS_Z, BLOCK_N, BLOCK_K, a_layout, wt.dtype)
        mbarrier.arrive(empty.index(slot))  # the words are in registers (the arrive follows a partition barrier)
        t = i % WSTAGES
        mbarrier.wait(free.index(t), ((i // WSTAGES) & 1) ^ 1)
        wt.index(t).store(a)
        fence_async_shared()  # the generic-proxy stores before wgmma (async proxy) reads them
        mbarrier.arrive(ready.index(t))


@gluon.jit
def _issue(acc, i, xs, wt, full, ready, STAGES: gl.constexpr, WSTAGES: gl.constexpr):
    """Wait for step ``i``'s x and dequantized tile, issue its wgmma, wait for wgmma ``i - 1``."""
    mbarrier.wait(full.index(i % STAGES), (i // STAGES) & 1)
    mbarrier.wait(ready.index(i % WSTAGES), (i // WSTAGES) & 1)
    acc = warpgroup_mma(wt.index(i % WSTAGES), xs.index(i % STAGES).permute((1, 0)), acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=1, deps=[acc])


@gluon.constexpr_function
def acc_layout(block_m: int, num_warps: int) -> gl.NVMMADistributedLayout:
    """The ``[BN, BM]`` accumulator's wgmma layout: warpgroups over channels, except a 256-row M tile on two
    warpgroups, which they split along M (one m64n256 wgmma would hold 128 accumulator registers, more than
    ptxas gives an instruction when 13 warps cap the launch at 128 a thread)."""
    if block_m == 256 and num_warps == 8:
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 128, 16])
    return mma_layout(block_m, num_warps)


@gluon.jit
def _consumer(xs, wt, full, empty, ready, free, steps, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, WSTAGES: gl.constexpr):
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout(BLOCK_M, gl.num_warps()))
    acc = _issue(acc, 0, xs, wt, full, ready, STAGES, WSTAGES)  # peeled (module docstring)
    for i in range(1, steps):
        acc = _issue(acc, i, xs, wt, full, ready, STAGES, WSTAGES)
        mbarrier.arrive(empty.index((i - 1) % STAGES))  # wgmma i - 1 is done with its x and its tile
        mbarrier.arrive(free.index((i - 1) % WSTAGES))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)


@gluon.jit
def qmm6_kernel(x_desc, w_desc, s_desc, z_desc, BIAS, Y, M, N, KW, stride_ym, GS: gl.constexpr, ZC: gl.constexpr,
                HAS_Z: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                BLOCK_K: gl.constexpr, STAGES: gl.constexpr, WSTAGES: gl.constexpr, LOADER_REGS: gl.constexpr,
                TRANSFORM_REGS: gl.constexpr):
    """Grid: M tiles x N tiles, M tiles fastest; ``num_warps`` consumer warps, one loader warp, one transform
    warpgroup. x (sorted order) by ``x_desc`` in ``[BM, BK]`` tiles, zero past its edges."""
    NW: gl.constexpr = gl.num_warps()
    BKW: gl.constexpr = BLOCK_K // 8
    tiles_m = gl.cdiv(M, BLOCK_M)
    pid = gl.program_id(0)
    m0 = (pid % tiles_m) * BLOCK_M
    n0 = (pid // tiles_m) * BLOCK_N
    steps = gl.cdiv(KW, BKW)

    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    ws = gl.allocate_shared_memory(gl.int32, [STAGES, BKW, BLOCK_N], w_desc.layout)
    ss = gl.allocate_shared_memory(s_desc.dtype, [STAGES, slot_rows(s_desc.block_type.nbytes), BLOCK_N],
                                   s_desc.layout)
    zs = gl.allocate_shared_memory(z_desc.dtype, [STAGES if HAS_Z else 1, slot_rows(z_desc.block_type.nbytes),
                                                  BLOCK_N], z_desc.layout)
    wt_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], x_desc.dtype)
    wt = gl.allocate_shared_memory(x_desc.dtype, [WSTAGES, BLOCK_N, BLOCK_K], wt_layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [WSTAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [WSTAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # the transform and the consumers
    for i in gl.static_range(WSTAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(free.index(i), count=1)
    (acc,) = gl.warp_specialize(
        [(_consumer, (xs, wt, full, empty, ready, free, steps, BLOCK_M, BLOCK_N, STAGES, WSTAGES)),
         (_loader, (x_desc, w_desc, s_desc, z_desc, xs, ws, ss, zs, full, empty, m0, n0, steps, GS, HAS_Z, BLOCK_K,
                    BKW, STAGES)),
         (_transform, (ws, ss, zs, wt, full, empty, ready, free, steps, ZC, HAS_Z, BLOCK_N, BLOCK_K, STAGES,
                       WSTAGES))],
        [1, 4], [LOADER_REGS, TRANSFORM_REGS])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(full.index(i))
        mbarrier.invalidate(empty.index(i))
    for i in gl.static_range(WSTAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(free.index(i))
    _epilogue(acc, Y, BIAS, Y, Y, pid, m0, n0, M, N, 1, stride_ym, HAS_BIAS, False, BLOCK_N, BLOCK_M, NW)


def gemm6_reasons(p: Packed, cfg: Config) -> list[str]:
    """What gemm6 cannot take beyond gemm4's limits: one group a step, no split-K, its tile shapes."""
    out = []
    if p.bits != 4 or p.offsets is not None or p.supers is not None:
        out.append(f"{p.bits}-bit words{' with additive offsets' if p.offsets is not None else ''} (gemm6 takes "
                   "4-bit GPTQ-style words: scale and optional zero per group)")
    if p.group < cfg.block_k:
        out.append(f"groups of {p.group} (gemm6 takes one group a K step: group >= block_k {cfg.block_k})")
    if cfg.num_warps not in (4, 8) or cfg.block_n != 16 * cfg.num_warps * (cfg.block_n // (16 * cfg.num_warps)):
        out.append(f"{cfg.num_warps} consumer warps for block_n {cfg.block_n} (expected 4 or 8 warps, "
                   "16 channels a warp times 1, 2 or 4)")
    if cfg.block_m == 256 and cfg.num_warps == 8 and cfg.block_n != 128:
        out.append(f"block_n {cfg.block_n} for a 256-row M tile (expected 128: the warpgroups split M)")
    if cfg.block_m * cfg.block_n // (32 * cfg.num_warps) > 128:
        out.append(f"block {cfg.block_m}x{cfg.block_n} on {cfg.num_warps} warps (over 128 accumulator registers)")
    return out


def qmm6(x2: torch.Tensor, p: Packed, cfg: Config, bias: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """Launch ``qmm6_kernel`` (x gathered to sorted order first when the weight is act-order)."""
    why = gemm6_reasons(p, cfg)
    if why:
        raise ValueError("gemm6 cannot run this call: " + "; ".join(why))
    bind_cuda_context(x2.device)
    m = x2.shape[0]
    x2, kx, bk = gluon_inputs(x2, p, replace(cfg, variant="gemm4"))  # gemm4's limits and input
    bm, bn = cfg.block_m, cfg.block_n
    x_desc = _descriptor(x2[:, :kx] if x2.shape[1] != kx else x2, [bm, bk])
    s = _descriptor(p.scales, [1, bn])
    descs = (x_desc, _descriptor(p.qweight, [bk // 8, bn]), s,
             _descriptor(p.zeros, [1, bn]) if p.zeros is not None else s)
    tiles = triton.cdiv(m, bm) * triton.cdiv(p.n, bn)
    qmm6_kernel[(tiles,)](
        *descs, bias if bias is not None else y, y, m, p.n, p.kw, y.stride(0), GS=p.group, ZC=p.zero_const,
        HAS_Z=p.zeros is not None, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        STAGES=cfg.num_stages, WSTAGES=cfg.w_stages, LOADER_REGS=LOADER_REGISTERS, TRANSFORM_REGS=TRANSFORM_REGISTERS,
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}), num_warps=cfg.num_warps)
    return y
