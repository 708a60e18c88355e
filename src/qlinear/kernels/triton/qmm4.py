"""``gemm4``: gemm3's swap-AB product written in Gluon, so the next step's dequantization overlaps this step's wgmma.

gemm3 (``qmm3.py``) dequantizes a 4-bit tile into registers and hands it to wgmma as the A operand; Triton 3.6
then waits for every wgmma of the step before the next dequantization starts (it must: it would otherwise
overwrite A registers still being read, triton-lang/triton#9433), so the tensor cores idle while the ALUs
work. Gluon states the pipeline explicitly: each step's wgmma is issued asynchronously and only the previous
step's is waited for (``warpgroup_mma_wait(1)``), so the next dequantization runs beside it. The loop body holds
two steps, so the two A operands are distinct register sets, each kept by ptxas until the wait that retires its
wgmma (one step per body raced on the H200: its single register set was rewritten in flight; the wait's ``deps``
do not prevent that). Activations arrive by TMA into a ring of ``STAGES`` shared-memory tiles; packed codes and
scales are loaded straight into the registers that need them, two steps ahead.

The register layout of the codes is the wgmma A fragment itself: thread ``(warp w, lane l)`` holds output
channels ``16 w + l / 4`` and ``+ 8`` and word rows ``2 (l % 4)``, ``+ 1`` of each 8-row field block, which
(``layout.py``, ``R = 8``) are exactly the K pairs ``8 j + 2 (l % 4)`` of field ``j`` the fragment wants. So
the dequantized fields reach wgmma without a shuffle (``convert_layout(..., assert_trivial=True)``).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from .configs import Config
from .fragment import to_fragment
from .fragment_order import block_k_bytes, block_k_groups, fragment_input
from .gather import sorted_input
from .gemm4_limits import gemm4_reasons
from .layout import Packed
from .qmm3 import ASM_BF16, ASM_F16, block_k3
from .runtime import bind_cuda_context

#: the TMA load builtin: ``async_copy_global_to_shared`` in Triton 3.6 (the H200's), ``async_load`` in 3.9 (CI's)
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
#: the CTA-wide barrier: ``thread_barrier`` in Triton 3.6, ``barrier`` in 3.9
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.constexpr_function
def code_layout(block_n: int, bkw: int, num_warps: int) -> gl.DistributedLinearLayout:
    """Words ``[BN, BKW]`` as the wgmma A fragment holds their fields (see the module docstring)."""
    regs = [[0, 1], [8, 0]] + [[0, 8 * i] for i in (1, 2, 4) if 8 * i < bkw]
    regs += [[16 * num_warps * i, 0] for i in (1, 2, 4) if 16 * num_warps * i < block_n]
    warps = [[16 * i, 0] for i in (1, 2, 4, 8) if i < num_warps]
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=warps, block_bases=[], shape=[block_n, bkw])


@gluon.constexpr_function
def mma_layout(block_m: int, num_warps: int) -> gl.NVMMADistributedLayout:
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_m, 16])


@gluon.jit
def _load_step(W, S, Z, kb, kb_end, offs_n, offs_w, nmask, KW, NP, GS: gl.constexpr, HAS_Z: gl.constexpr,
               BLOCK_K: gl.constexpr):
    """Step ``kb``'s words ``[BN, BKW]`` and its scale/zero row; nothing is read for ``kb >= kb_end``."""
    BKW: gl.constexpr = BLOCK_K // 8
    rows = kb * BKW + offs_w
    ok = nmask & (kb < kb_end)
    w = gl.load(W + rows[None, :] * NP + offs_n[:, None], mask=ok[:, None] & (rows < KW)[None, :], other=0)
    g = kb * BLOCK_K // GS
    s = gl.load(S + g * NP + offs_n, mask=ok, other=0.0)
    z = gl.load(Z + g * NP + offs_n, mask=ok, other=0) if HAS_Z else s
    return w, s, z


@gluon.jit
def _dequant(w, s, z, ZC: gl.constexpr, HAS_Z: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
             a_layout: gl.constexpr, dt: gl.constexpr):
    """Words -> the A fragment ``[BN, BK]`` in the activation dtype, rows in sorted K order."""
    MAGIC: gl.constexpr = 128.0 if dt == gl.bfloat16 else 1024.0
    zf = z.to(gl.float32) if HAS_Z else gl.full(s.shape, ZC, gl.float32, s.type.layout)
    sb = gl.broadcast(s.to(dt)[:, None], w)[0]
    zc = gl.broadcast((zf + MAGIC).to(dt)[:, None], w)[0]
    if dt == gl.bfloat16:
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            ASM_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [w, sb, zc], dtype=(gl.bfloat16,) * 8, is_pure=True,
            pack=2)
    else:
        o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
            ASM_F16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [w, sb, zc], dtype=(gl.float16,) * 8, is_pure=True,
            pack=2)
    return to_fragment(o0, o1, o2, o3, o4, o5, o6, o7, BLOCK_N, BLOCK_K, a_layout)


@gluon.jit
def _step(acc, w0, s0, z0, w1, s1, z1, i, W, S, Z, kb0, kb1, offs_n, offs_w, nmask, KW, NP, m0, steps2, x_desc, xs,
          bars, GS: gl.constexpr, ZC: gl.constexpr, HAS_Z: gl.constexpr, BLOCK_N: gl.constexpr,
          BLOCK_K: gl.constexpr, STAGES: gl.constexpr, a_layout: gl.constexpr):
    """Step ``i``: dequantize (while wgmma ``i - 1`` runs), issue wgmma ``i``, wait for ``i - 1``, refill the
    x slot it read, and load the words of step ``i + 2``.

    The loop runs two of these an iteration, so the two steps' A operands are different PTX registers: ptxas
    keeps a wgmma's A registers until the ``wait_group`` that retires it, but one register set per loop body
    would be rewritten by the next iteration while its wgmma is still in flight."""
    a = _dequant(w0, s0, z0, ZC, HAS_Z, BLOCK_N, BLOCK_K, a_layout, x_desc.dtype)
    w0, s0, z0 = w1, s1, z1
    w1, s1, z1 = _load_step(W, S, Z, kb0 + i + 2, kb1, offs_n, offs_w, nmask, KW, NP, GS, HAS_Z, BLOCK_K)
    slot = i % STAGES
    mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
    acc = warpgroup_mma(a, xs.index(slot).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])  # wgmma i - 1 done: its x slot is free
    nxt = i + STAGES - 1
    mbarrier.expect(bars.index(nxt % STAGES), x_desc.block_type.nbytes, pred=nxt < steps2)
    tma_load(x_desc, [m0, (kb0 + nxt) * BLOCK_K], bars.index(nxt % STAGES), xs.index(nxt % STAGES),
             pred=nxt < steps2)
    return acc, w0, s0, z0, w1, s1, z1


@gluon.jit
def qmm4_kernel(x_desc, W, S, Z, BIAS, Y, PART, LOCK, M, N, KW, NP, SPLIT_K, stride_ym, GS: gl.constexpr,
                ZC: gl.constexpr, HAS_Z: gl.constexpr, HAS_BIAS: gl.constexpr, BLOCK_M: gl.constexpr,
                BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr, SPLIT: gl.constexpr):
    """Grid ``(M tiles x N tiles, SPLIT_K)``, M tiles fastest; x (sorted order) comes through ``x_desc`` in
    ``[BM, BK]`` tiles, zero past its edges. With ``SPLIT`` each K range writes its float32 partial to
    ``PART [SPLIT_K, M, N]`` and the last to finish (counter ``LOCK[tile]``, reset by it) sums them in split
    order (deterministic), as ``common.store_split`` does for the Triton variants."""
    NW: gl.constexpr = gl.num_warps()
    BKW: gl.constexpr = BLOCK_K // 8
    dt: gl.constexpr = x_desc.dtype
    acc_layout: gl.constexpr = mma_layout(BLOCK_M, NW)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = code_layout(BLOCK_N, BKW, NW)

    tiles_m = gl.cdiv(M, BLOCK_M)
    pid = gl.program_id(0)
    pid_m = pid % tiles_m
    pid_n = pid // tiles_m
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, w_layout))
    offs_w = gl.arange(0, BKW, layout=gl.SliceLayout(0, w_layout))
    nmask = offs_n < NP
    nkb = gl.cdiv(KW, BKW)
    per = gl.cdiv(nkb, SPLIT_K)
    kb0 = gl.program_id(1) * per
    kb1 = gl.minimum(kb0 + per, nkb)
    steps = kb1 - kb0
    m0 = pid_m * BLOCK_M

    steps2 = steps + steps % 2  # whole pairs: an extra step has zero weights (masked) and finite x
    xs = gl.allocate_shared_memory(dt, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES - 1):  # past K the TMA box reads zeros
        mbarrier.expect(bars.index(i), x_desc.block_type.nbytes, pred=i < steps2)
        tma_load(x_desc, [m0, (kb0 + i) * BLOCK_K], bars.index(i), xs.index(i), pred=i < steps2)

    w0, s0, z0 = _load_step(W, S, Z, kb0, kb1, offs_n, offs_w, nmask, KW, NP, GS, HAS_Z, BLOCK_K)
    w1, s1, z1 = _load_step(W, S, Z, kb0 + 1, kb1, offs_n, offs_w, nmask, KW, NP, GS, HAS_Z, BLOCK_K)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
    for i in range(0, steps2, 2):  # two steps an iteration: each reads its own A registers (see _step)
        acc, w0, s0, z0, w1, s1, z1 = _step(acc, w0, s0, z0, w1, s1, z1, i, W, S, Z, kb0, kb1, offs_n, offs_w,
                                            nmask, KW, NP, m0, steps2, x_desc, xs, bars, GS, ZC, HAS_Z, BLOCK_N,
                                            BLOCK_K, STAGES, a_layout)
        acc, w0, s0, z0, w1, s1, z1 = _step(acc, w0, s0, z0, w1, s1, z1, i + 1, W, S, Z, kb0, kb1, offs_n,
                                            offs_w, nmask, KW, NP, m0, steps2, x_desc, xs, bars, GS, ZC, HAS_Z,
                                            BLOCK_N, BLOCK_K, STAGES, a_layout)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    _epilogue(acc, Y, BIAS, PART, LOCK, pid, m0, pid_n * BLOCK_N, M, N, SPLIT_K, stride_ym, HAS_BIAS, SPLIT,
              BLOCK_N, BLOCK_M, NW)


@gluon.jit
def _epilogue(acc, Y, BIAS, PART, LOCK, pid, m0, n0, M, N, SPLIT_K, stride_ym, HAS_BIAS: gl.constexpr,
              SPLIT: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, NW: gl.constexpr):
    """The tile's ``y`` (or, split, its float32 partial; the last split of the tile to finish sums them)."""
    out_layout: gl.constexpr = gl.BlockedLayout([BLOCK_N // 32, 1], [32, 1], [1, NW], [0, 1])
    out = gl.convert_layout(acc, out_layout)
    on = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    om = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
    mask = (on < N)[:, None] & (om < M)[None, :]
    if SPLIT:
        gl.store(PART + gl.program_id(1) * M * N + om[None, :] * N + on[:, None], out, mask=mask)
        cta_barrier()  # every thread's partial is written before the counter is released
        seen = gl.atomic_add(LOCK + pid, 1, sem="acq_rel", scope="gpu")
        if seen == SPLIT_K - 1:
            _sum_partials(Y, BIAS, PART, on, m0, M, N, SPLIT_K, stride_ym, HAS_BIAS, BLOCK_N, BLOCK_M, NW)
            gl.atomic_xchg(LOCK + pid, 0, sem="relaxed", scope="gpu")
    else:
        _store_out(Y, BIAS, out, on, om, N, mask, stride_ym, HAS_BIAS)


@gluon.jit
def _sum_partials(Y, BIAS, PART, on, m0, M, N, SPLIT_K, stride_ym, HAS_BIAS: gl.constexpr, BLOCK_N: gl.constexpr,
                  BLOCK_M: gl.constexpr, NW: gl.constexpr):
    """The tile's partials summed in split order, 32 rows of M at a time, four splits' loads in flight (the
    whole tile at once spills: 255 registers, offline SASS)."""
    CH: gl.constexpr = 32 if BLOCK_M >= 32 else BLOCK_M
    layout: gl.constexpr = gl.BlockedLayout([BLOCK_N // 32, 1], [32, 1], [1, NW], [0, 1])
    onc = gl.convert_layout(on, gl.SliceLayout(1, layout))
    for c0 in gl.static_range(0, BLOCK_M, CH):
        om = m0 + c0 + gl.arange(0, CH, layout=gl.SliceLayout(0, layout))
        mask = (onc < N)[:, None] & (om < M)[None, :]
        src = PART + om[None, :] * N + onc[:, None]
        total = gl.zeros([BLOCK_N, CH], gl.float32, layout)
        for sk in range(0, SPLIT_K, 4):
            for u in gl.static_range(4):
                total += gl.load(src + (sk + u) * M * N, mask=mask & (sk + u < SPLIT_K), other=0.0,
                                 cache_modifier=".cg")
        _store_out(Y, BIAS, total, onc, om, N, mask, stride_ym, HAS_BIAS)


@gluon.jit
def _store_out(Y, BIAS, out, on, om, N, mask, stride_ym, HAS_BIAS: gl.constexpr):
    """``y[m, n] = out[n, m] (+ bias[n])`` in y's dtype."""
    if HAS_BIAS:
        out += gl.load(BIAS + on, mask=on < N, other=0.0).to(gl.float32)[:, None]
    gl.store(Y + om[None, :] * stride_ym + on[:, None], out.to(Y.dtype.element_ty), mask=mask)


def tile_errors(cfg: Config, block_k: int) -> list[str]:
    """What the kernel's layouts cannot take in a config (a forced one; the table and heuristic stay inside)."""
    out = []
    if cfg.num_warps not in (4, 8):
        out.append(f"num_warps {cfg.num_warps} (expected 4 or 8: one or two warpgroups)")
    elif cfg.block_n not in (16 * cfg.num_warps * r for r in (1, 2, 4)):
        out.append(f"block_n {cfg.block_n} (expected 16, 32 or 64 channels a warp: "
                   f"{16 * cfg.num_warps}, {32 * cfg.num_warps} or {64 * cfg.num_warps})")
    if cfg.block_m not in (16, 32, 64, 128, 256):
        out.append(f"block_m {cfg.block_m} (expected 16..256, a power of two: wgmma's N)")
    if block_k % 64 or block_k > 512:
        out.append(f"block_k {block_k} (expected 64..512 codes, whole 8-row field blocks)")
    if cfg.num_stages < 2:
        out.append(f"num_stages {cfg.num_stages} (expected 2+: the x ring refills the slot of the step before)")
    acc = cfg.block_m * cfg.block_n // (32 * cfg.num_warps)  # float32 accumulator registers a thread
    if acc > 128:
        out.append(f"block_m x block_n {cfg.block_m}x{cfg.block_n} on {cfg.num_warps} warps (a {acc}-register "
                   "accumulator a thread; expected at most 128: 256x128 on 4 warps spilled, 930 us for 256 on 8)")
    elif cfg.max_registers and (acc >= cfg.max_registers or cfg.block_m // 2 + 32 > cfg.max_registers):
        out.append(f"max_registers {cfg.max_registers} for block_m {cfg.block_m} (one wgmma holds block_m / 2 "
                   f"accumulator registers, the tile {acc}: ptxas cannot fit them under the cap)")
    return out


def gluon_inputs(x2: torch.Tensor, p: Packed, cfg: Config) -> tuple[torch.Tensor, int, int]:
    """``(x in sorted order (fragment order over groups of 32) with TMA-aligned rows, its K, the K step)`` for
    gemm4/gemm5 (``cfg.variant``), or a named error for a call or a forced config the kernel cannot take."""
    from .qmv_tc import capability

    why = gemm4_reasons(p, x2.shape[0], x2.dtype, capability(x2.device), cfg.variant)
    if why:
        raise ValueError(f"{cfg.variant} cannot run this call: " + "; ".join(why))
    if p.bits == 8:  # fragment8.py: 8-row field blocks of 32 codes, x in sorted order
        x2, kx = sorted_input(x2, p)
        bk = block_k_bytes(p, cfg.block_k)
    elif p.rows_per_block == 8:
        x2, kx = sorted_input(x2, p)
        bk = block_k3(p, cfg.block_k)
    else:  # groups of 32 (fragment.py)
        x2, kx = fragment_input(x2, p)
        bk = block_k_groups(p, cfg.block_k)
    if x2.stride(1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16:  # TMA: 16-byte aligned rows
        x2 = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device).copy_(x2)
    bad = tile_errors(cfg, bk)
    if bad:
        raise ValueError(f"{cfg.variant} config: " + "; ".join(bad))
    return x2, kx, bk


def qmm4(x2: torch.Tensor, p: Packed, cfg: Config, bias: torch.Tensor | None, lock: torch.Tensor | None,
         y: torch.Tensor) -> torch.Tensor:
    """Launch ``qmm4_kernel`` (x gathered to sorted order first when the weight is act-order)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    bind_cuda_context(x2.device)
    m = x2.shape[0]
    x2, kx, bk = gluon_inputs(x2, p, cfg)
    bm, bn = cfg.block_m, cfg.block_n
    dt = gl.bfloat16 if x2.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([bm, bk], dt)
    desc = TensorDescriptor(x2, [m, kx], [x2.stride(0), 1], [bm, bk], layout)
    tiles = triton.cdiv(m, bm) * triton.cdiv(p.n, bn)
    split = cfg.split_k if lock is not None and tiles <= lock.numel() else 1
    part = torch.empty((split, m, p.n), dtype=torch.float32, device=x2.device) if split > 1 else y
    qmm4_kernel[(tiles, split)](
        desc, p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales,
        bias if bias is not None else y, y, part, lock if lock is not None else p.qweight,
        m, p.n, p.kw, p.np, split, y.stride(0),
        GS=p.group, ZC=p.zero_const, HAS_Z=p.zeros is not None, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=cfg.num_stages, SPLIT=split > 1, num_warps=cfg.num_warps)
    return y
