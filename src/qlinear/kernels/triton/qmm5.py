"""``gemm5``: gemm4's product with its loads on a warp of their own (Gluon warp specialisation), sm_90.

gemm4 (``qmm4.py``) issues everything from the warps that run wgmma: the code and scale loads two steps ahead,
the TMA of x, and a CTA barrier before each TMA refills a slot a wgmma read. Here one loader warp brings x, the
packed codes and the scale (and zero) rows of every step into a ring of ``STAGES`` shared-memory slots by TMA
(``full`` / ``empty`` mbarriers), and the consumer warpgroups only load a slot's codes into the A-fragment
registers (``qmm4.code_layout``), dequantize, issue the step's wgmma and release the previous step's slot.

ptxas pipelines wgmma across a warp-specialised region only when nothing but wgmma defines the accumulator
between the first wgmma and the final ``wait_group``: a loop that may run zero times leaves a path where the
zero accumulator is moved into those registers right before the wait, and ptxas then serializes every HGMMA
(``ptxas -v``: C7515 "non wgmma instructions defining accumulator registers"). So the first pair of steps is
peeled out of the loop and every CTA runs at least two steps (a zero-step split runs two that add nothing).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from .configs import Config
from .fragment import dequant_rows, rows_params
from .fragment8 import dequant8
from .fragment_order import SUPER_ROWS
from .layout import Packed
from .qmm4 import _dequant, _epilogue, code_layout, gluon_inputs, mma_layout, tma_load
from .runtime import bind_cuda_context

#: K rows of a K-quant super-block (one ``d, -dmin`` pair), as a compile-time value for the loader
SUPER_K = gl.constexpr(SUPER_ROWS)
#: registers of the loader warp (it only issues TMA and waits on barriers)
LOADER_REGISTERS = 40


@gluon.constexpr_function
def row_layout(block_n: int, num_warps: int) -> gl.DistributedLinearLayout:
    """A ``[1, BN]`` scale or zero row spread as ``code_layout`` spreads output channels, so that converting it
    to the words' row slice moves nothing between threads."""
    regs = [[0, 8]] + [[0, 16 * num_warps * i] for i in (1, 2, 4) if 16 * num_warps * i < block_n]
    warps = [[0, 16 * i] for i in (1, 2, 4, 8) if i < num_warps]
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=[[0, 0], [0, 0], [0, 1], [0, 2], [0, 4]],
                                      warp_bases=warps, block_bases=[], shape=[1, block_n])


@gluon.constexpr_function
def slot_rows(box_bytes: int, box_rows: int = 1) -> int:
    """Rows a slot of ``box_rows`` group rows takes so that every slot starts 128-byte aligned, as TMA's
    shared-memory destination must (64 uint8 zeros a slot faulted on the H200: misaligned address)."""
    return max(box_rows, 128 // (box_bytes // box_rows))


@gluon.jit
def _loader(x_desc, w_desc, s_desc, z_desc, o_desc, u_desc, xs, ws, ss, zs, os, us, full, empty, m0, n0, kb0,
            steps2, GS: gl.constexpr, NG: gl.constexpr, HAS_Z: gl.constexpr, HAS_OFF: gl.constexpr,
            HAS_SUP: gl.constexpr, BLOCK_K: gl.constexpr, BKW: gl.constexpr, STAGES: gl.constexpr):
    """Step ``i``'s x tile, words and ``NG`` group rows (offsets and the super pair with them) into slot
    ``i % STAGES`` once the consumers released it. Past K (or the last group) TMA fills zeros; a pair's extra
    step inside K loads real data the consumers zero."""
    nbytes: gl.constexpr = (x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
                            + (z_desc.block_type.nbytes if HAS_Z else 0) + (o_desc.block_type.nbytes if HAS_OFF else 0)
                            + (u_desc.block_type.nbytes if HAS_SUP else 0))
    for i in range(steps2):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)  # a fresh barrier passes parity 1
        bar = full.index(slot)
        mbarrier.expect(bar, nbytes)
        kb = kb0 + i
        g = kb * BLOCK_K // GS
        tma_load(x_desc, [m0, kb * BLOCK_K], bar, xs.index(slot))
        tma_load(w_desc, [kb * BKW, n0], bar, ws.index(slot))
        tma_load(s_desc, [g, n0], bar, ss.index(slot).slice(0, NG))
        if HAS_Z:
            tma_load(z_desc, [g, n0], bar, zs.index(slot).slice(0, NG))
        if HAS_OFF:
            tma_load(o_desc, [g, n0], bar, os.index(slot).slice(0, NG))
        if HAS_SUP:
            tma_load(u_desc, [2 * (kb * BLOCK_K // SUPER_K), n0], bar, us.index(slot).slice(0, 2))


@gluon.jit
def _row(ring, slot, r_layout: gl.constexpr, w_layout: gl.constexpr, BLOCK_N: gl.constexpr):
    """Slot ``slot``'s ``[1, BN]`` group row as a vector over the words' output channels."""
    row = ring.index(slot).slice(0, 1).load(r_layout)
    return gl.convert_layout(gl.reshape(row, [BLOCK_N]), gl.SliceLayout(1, w_layout))


@gluon.jit
def _consume(acc, i, steps, xs, ws, ss, zs, os, us, full, empty, ZC: gl.constexpr, NG: gl.constexpr,
             RPG: gl.constexpr, BITS: gl.constexpr, HAS_Z: gl.constexpr, HAS_OFF: gl.constexpr,
             HAS_SUP: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
             a_layout: gl.constexpr, w_layout: gl.constexpr, r_layout: gl.constexpr):
    """Step ``i``: dequantize slot ``i`` (while wgmma ``i - 1`` runs), issue wgmma ``i``, wait for ``i - 1`` and
    release its slot. Called twice per loop body, as gemm4's ``_step``, so each step's A registers are its own."""
    slot = i % STAGES
    mbarrier.wait(full.index(slot), (i // STAGES) & 1)
    w = ws.index(slot).permute((1, 0)).load(w_layout)
    if BITS == 8:  # four fields a word (fragment8.py); a step's group rows by word row as over groups of 32
        s2, z2, o2 = rows_params(ss, zs, os, us, slot, i < steps, NG, RPG, HAS_Z, HAS_OFF, False, BLOCK_N,
                                 BLOCK_K // 4, r_layout, w_layout)
        a = dequant8(w, s2, z2, o2, ZC, HAS_Z, HAS_OFF, BLOCK_N, BLOCK_K, a_layout, xs.dtype)
    elif NG == 1 and not HAS_OFF:
        s = _row(ss, slot, r_layout, w_layout, BLOCK_N)
        s = gl.where(i < steps, s, gl.zeros_like(s))  # a pair's extra step adds nothing
        z = _row(zs, slot, r_layout, w_layout, BLOCK_N) if HAS_Z else s
        a = _dequant(w, s, z, ZC, HAS_Z, BLOCK_N, BLOCK_K, a_layout, xs.dtype)
    else:  # groups of 32 (x in fragment order, a group per 4 word rows: fragment.py), or one group with offsets
        s2, z2, o2 = rows_params(ss, zs, os, us, slot, i < steps, NG, RPG, HAS_Z, HAS_OFF, HAS_SUP, BLOCK_N,
                                 BLOCK_K // 8, r_layout, w_layout)
        a = dequant_rows(w, s2, z2, o2, ZC, HAS_Z, HAS_OFF, BLOCK_N, BLOCK_K, a_layout, xs.dtype)
    acc = warpgroup_mma(a, xs.index(slot).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
    mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)  # wgmma i - 1 is done with its slot
    return acc


@gluon.jit
def _consumer(xs, ws, ss, zs, os, us, full, empty, steps, steps2, ZC: gl.constexpr, NG: gl.constexpr,
              RPG: gl.constexpr, BITS: gl.constexpr, HAS_Z: gl.constexpr, HAS_OFF: gl.constexpr,
              HAS_SUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              STAGES: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    acc_layout: gl.constexpr = mma_layout(BLOCK_M, NW)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = code_layout(BLOCK_N, BLOCK_K * BITS // 32, NW)
    r_layout: gl.constexpr = row_layout(BLOCK_N, NW)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
    # the first pair outside the loop: no path reaches the final wait with only the zeros (see the docstring)
    acc = _consume(acc, 0, steps, xs, ws, ss, zs, os, us, full, empty, ZC, NG, RPG, BITS, HAS_Z, HAS_OFF,
                   HAS_SUP, BLOCK_N, BLOCK_K, STAGES, a_layout, w_layout, r_layout)
    acc = _consume(acc, 1, steps, xs, ws, ss, zs, os, us, full, empty, ZC, NG, RPG, BITS, HAS_Z, HAS_OFF,
                   HAS_SUP, BLOCK_N, BLOCK_K, STAGES, a_layout, w_layout, r_layout)
    for i in range(2, steps2, 2):
        acc = _consume(acc, i, steps, xs, ws, ss, zs, os, us, full, empty, ZC, NG, RPG, BITS, HAS_Z, HAS_OFF,
                       HAS_SUP, BLOCK_N, BLOCK_K, STAGES, a_layout, w_layout, r_layout)
        acc = _consume(acc, i + 1, steps, xs, ws, ss, zs, os, us, full, empty, ZC, NG, RPG, BITS, HAS_Z, HAS_OFF,
                       HAS_SUP, BLOCK_N, BLOCK_K, STAGES, a_layout, w_layout, r_layout)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)


@gluon.jit
def qmm5_kernel(x_desc, w_desc, s_desc, z_desc, o_desc, u_desc, BIAS, Y, PART, LOCK, M, N, KW, SPLIT_K, stride_ym,
                GS: gl.constexpr, BITS: gl.constexpr, ZC: gl.constexpr, HAS_Z: gl.constexpr,
                HAS_OFF: gl.constexpr, HAS_SUP: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr,
                LOADER_REGS: gl.constexpr):
    """Grid and split-K as ``qmm4_kernel``; ``BLOCK_N`` channels of ``num_warps`` consumer warps plus one loader.
    A step spans ``NG`` groups: 1, or ``BLOCK_K / 32`` over groups of 32 (``fragment.py``: x in fragment order,
    K-quant super pairs ``u_desc`` only there); additive offsets ``o_desc`` in either (MLX: groups of 64/128, and
    8-bit words)."""
    NW: gl.constexpr = gl.num_warps()
    BKW: gl.constexpr = BLOCK_K * BITS // 32
    NG: gl.constexpr = BLOCK_K // GS if BLOCK_K > GS else 1
    RPG: gl.constexpr = GS * BITS // 32 if NG > 1 else BKW  # word rows a group row covers inside a step
    tiles_m = gl.cdiv(M, BLOCK_M)
    pid = gl.program_id(0)
    m0 = (pid % tiles_m) * BLOCK_M
    n0 = (pid // tiles_m) * BLOCK_N
    nkb = gl.cdiv(KW, BKW)
    per = gl.cdiv(nkb, SPLIT_K)
    kb0 = gl.program_id(1) * per
    steps = gl.maximum(gl.minimum(kb0 + per, nkb) - kb0, 0)
    steps2 = gl.maximum(steps + steps % 2, 2)  # whole pairs, at least one (the peeled pair)

    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    ws = gl.allocate_shared_memory(gl.int32, [STAGES, BKW, BLOCK_N], w_desc.layout)
    ss = gl.allocate_shared_memory(s_desc.dtype, [STAGES, slot_rows(s_desc.block_type.nbytes, NG), BLOCK_N],
                                   s_desc.layout)
    zs = gl.allocate_shared_memory(z_desc.dtype, [STAGES if HAS_Z else 1, slot_rows(z_desc.block_type.nbytes, NG),
                                                  BLOCK_N], z_desc.layout)
    os = gl.allocate_shared_memory(o_desc.dtype, [STAGES if HAS_OFF else 1,
                                                  slot_rows(o_desc.block_type.nbytes, NG), BLOCK_N], o_desc.layout)
    us = gl.allocate_shared_memory(u_desc.dtype, [STAGES if HAS_SUP else 1,
                                                  slot_rows(u_desc.block_type.nbytes, 2), BLOCK_N], u_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    (acc,) = gl.warp_specialize(
        [(_consumer, (xs, ws, ss, zs, os, us, full, empty, steps, steps2, ZC, NG, RPG, BITS, HAS_Z, HAS_OFF,
                      HAS_SUP, BLOCK_M, BLOCK_N, BLOCK_K, STAGES)),
         (_loader, (x_desc, w_desc, s_desc, z_desc, o_desc, u_desc, xs, ws, ss, zs, os, us, full, empty, m0, n0,
                    kb0, steps2, GS, NG, HAS_Z, HAS_OFF, HAS_SUP, BLOCK_K, BKW, STAGES))], [1], [LOADER_REGS])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(full.index(i))
        mbarrier.invalidate(empty.index(i))

    _epilogue(acc, Y, BIAS, PART, LOCK, pid, m0, n0, M, N, SPLIT_K, stride_ym, HAS_BIAS, SPLIT, BLOCK_N, BLOCK_M,
              NW)


GL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32", torch.uint8: "uint8",
             torch.int32: "int32"}


def _descriptor(t: torch.Tensor, block: list[int]):
    """A TMA descriptor over a row-major 2-D tensor with the default (swizzled) shared layout for ``block``."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, GL_DTYPES[t.dtype]))
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block, layout)


def _weight_descriptors(p: Packed, bk: int, bn: int, c0: int = 0) -> tuple:
    """TMA descriptors of the words and group rows from output channel ``c0`` on: ``bk / 8`` word rows and
    ``NG`` group rows a step (``NG = bk / 32`` over groups of 32, else 1), the K-quant super pair; tensors a
    layout lacks are stood in for by the scales (never read)."""
    ng = bk // p.group if bk > p.group else 1
    s = _descriptor(p.scales[:, c0:], [ng, bn])
    return (_descriptor(p.qweight[:, c0:], [bk * p.bits // 32, bn]), s,
            _descriptor(p.zeros[:, c0:], [ng, bn]) if p.zeros is not None else s,
            _descriptor(p.offsets[:, c0:], [ng, bn]) if p.offsets is not None else s,
            _descriptor(p.supers[:, c0:], [2, bn]) if p.supers is not None else s)


def qmm5(x2: torch.Tensor, p: Packed, cfg: Config, bias: torch.Tensor | None, lock: torch.Tensor | None,
         y: torch.Tensor) -> torch.Tensor:
    """Launch ``qmm5_kernel`` (x gathered to sorted order first when the weight is act-order, to fragment order
    over groups of 32)."""
    bind_cuda_context(x2.device)
    m = x2.shape[0]
    x2, kx, bk = gluon_inputs(x2, p, cfg)
    bm, bn = cfg.block_m, cfg.block_n
    x_desc = _descriptor(x2[:, :kx] if x2.shape[1] != kx else x2, [bm, bk])
    tiles_m, tiles_n = triton.cdiv(m, bm), triton.cdiv(p.n, bn)
    split = cfg.split_k if lock is not None and tiles_m * tiles_n <= lock.numel() else 1
    tail = 0
    if split == 1 and lock is not None and cfg.tail_split > 1:
        slots = torch.cuda.get_device_properties(x2.device).multi_processor_count * resident(cfg, bk, p)
        tail = wave_tail(tiles_m, tiles_n, slots, cfg.tail_split)
    if not tail:
        _launch((x_desc, *_weight_descriptors(p, bk, bn)), p, cfg, m, p.n, split, bias, lock, y)
        return y
    c0 = (tiles_n - tail) * bn
    _launch((x_desc, *_weight_descriptors(p, bk, bn)), p, cfg, m, c0, 1, bias, lock, y)
    _launch((x_desc, *_weight_descriptors(p, bk, bn, c0)), p, cfg, m, p.n - c0, cfg.tail_split,
            bias[c0:] if bias is not None else None, lock, y[:, c0:])
    return y


def wave_tail(tiles_m: int, tiles_n: int, slots: int, split: int) -> int:
    """Column tiles to take out of the grid's last wave and run ``split`` ways along K in a second launch (0:
    none). Tiles go M-first, so whole columns of tiles leave; worth it only when the CTAs the split makes of
    them fit in one wave: 4096x14336 at M = 1024 makes 448 tiles of 256x128 for 132 SMs, three full waves and
    52 tiles that would hold up a fourth for a whole tile's time; split two ways they take half of it."""
    waves = tiles_m * tiles_n // slots
    if split < 2 or waves < 1:
        return 0
    tail = tiles_n - waves * slots // tiles_m
    return tail if 0 < tail * tiles_m * split <= slots else 0


#: shared memory an SM offers its CTAs on sm_90 (227 KiB, less 1 KiB each CTA keeps)
SM_SHARED = 227 * 1024


def resident(cfg: Config, block_k: int, p: Packed) -> int:
    """CTAs of a config an SM holds at once: two 4+4-warp CTAs under a 128-register cap, else one (168
    registers a thread, offline SASS); fewer when their shared-memory rings do not fit."""
    ng = block_k // p.group if block_k > p.group else 1
    row = 2 * max(128, ng * cfg.block_n * p.scales.element_size())  # ng group rows a slot, 128-byte aligned
    if p.offsets is not None:
        row += max(128, ng * cfg.block_n * p.offsets.element_size())
    if p.supers is not None:
        row += 2 * cfg.block_n * p.supers.element_size()
    ring = cfg.num_stages * (cfg.block_m * block_k * 2 + block_k * p.bits // 8 * cfg.block_n + row)
    return max(1, min(2 if cfg.max_registers else 1, SM_SHARED // (ring + 2048)))


def _launch(descs: tuple, p: Packed, cfg: Config, m: int, n: int, split: int, bias: torch.Tensor | None,
            lock: torch.Tensor | None, y: torch.Tensor) -> None:
    """One grid over the first ``n`` output channels of ``y`` (a view from the first channel the descriptors
    start at), split ``split`` ways along K."""
    bm, bn, bk = cfg.block_m, cfg.block_n, descs[0].block_shape[1]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    part = torch.empty((split, m, n), dtype=torch.float32, device=y.device) if split > 1 else y
    qmm5_kernel[(tiles, split)](
        *descs, bias if bias is not None else y, y, part, lock if lock is not None else p.qweight, m, n, p.kw,
        split, y.stride(0), GS=p.group, BITS=p.bits, ZC=p.zero_const, HAS_Z=p.zeros is not None,
        HAS_OFF=p.offsets is not None, HAS_SUP=p.supers is not None, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=cfg.num_stages, SPLIT=split > 1, LOADER_REGS=LOADER_REGISTERS,
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}), num_warps=cfg.num_warps)
