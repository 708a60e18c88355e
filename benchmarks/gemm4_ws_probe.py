"""Offline probe: gemm4 with a loader warp (``gl.warp_specialize``), compiled for sm_90, SASS counted.

    python3 benchmarks/gemm4_ws_probe.py [bm,bn,bk,stages ...]   # no GPU needed; any Triton with Gluon

Not a kernel qlinear runs: the question it answers is whether warp specialisation keeps gemm4's overlap. The
loader warp brings x, the packed codes and the scales into shared memory by TMA (full/empty mbarrier rings);
one consumer warpgroup loads the codes into the A-fragment layout, dequantizes, issues wgmma asynchronously and
releases the previous step's stage after ``warpgroup_mma_wait(1)``. 2026-12-03, Triton 3.6 and 3.9: it compiles
and its PTX is pipelined (``wgmma.wait_group 1`` after each step's four wgmma), but ptxas waits after every
HGMMA (``WARPGROUP.DEPBAR.LE gsb0, 0x0`` as many as HGMMA) and takes 255 registers for every tile, so it would
lose the overlap gemm4 has; why ptxas serializes it is the open question (`benchmarks/triton_notes.md`).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type
from triton.tools.disasm import get_sass

from qlinear.kernels.triton.qmm3 import ASM_BF16
from qlinear.kernels.triton.qmm4 import code_layout, mma_layout, tma_load
from sass_offline import registers


@gluon.constexpr_function
def scale_layout(block_n, num_warps):
    regs = [[0, 8]] + [[0, 16 * num_warps * i] for i in (1, 2, 4) if 16 * num_warps * i < block_n]
    warps = [[0, 16 * i] for i in (1, 2, 4, 8) if i < num_warps]
    return gl.DistributedLinearLayout(reg_bases=regs, lane_bases=[[0, 0], [0, 0], [0, 1], [0, 2], [0, 4]],
                                      warp_bases=warps, block_bases=[], shape=[1, block_n])


@gluon.jit
def _loader(x_desc, w_desc, s_desc, xs, ws, ss, full, empty, m0, n0, kb0, steps2, GS: gl.constexpr,
            BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    BKW: gl.constexpr = BLOCK_K // 8
    nbytes: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
    for i in range(steps2):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(full.index(slot), nbytes)
        kb = kb0 + i
        tma_load(x_desc, [m0, kb * BLOCK_K], full.index(slot), xs.index(slot))
        tma_load(w_desc, [kb * BKW, n0], full.index(slot), ws.index(slot))
        tma_load(s_desc, [kb * BLOCK_K // GS, n0], full.index(slot), ss.index(slot))


@gluon.jit
def _cstep(acc, i, steps, xs, ws, ss, full, empty, ZC: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
           STAGES: gl.constexpr, a_layout: gl.constexpr, w_layout: gl.constexpr, s_layout: gl.constexpr):
    BKW: gl.constexpr = BLOCK_K // 8
    dt: gl.constexpr = gl.bfloat16
    slot = i % STAGES
    mbarrier.wait(full.index(slot), (i // STAGES) & 1)
    w = ws.index(slot).permute((1, 0)).load(w_layout)  # [BN, BKW]
    s = gl.convert_layout(gl.reshape(ss.index(slot).load(s_layout), [BLOCK_N]), gl.SliceLayout(1, w_layout))
    s = gl.where(i < steps, s, gl.zeros_like(s))  # the pair's extra step adds nothing
    sb = gl.broadcast(s.to(dt)[:, None], w)[0]
    zc = gl.full(w.shape, ZC + 128.0, dt, w_layout)
    o0, o1, o2, o3, o4, o5, o6, o7 = gl.inline_asm_elementwise(
        ASM_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [w, sb, zc], dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)
    q = gl.join(gl.join(gl.join(o0, o4), gl.join(o2, o6)), gl.join(gl.join(o1, o5), gl.join(o3, o7)))
    q = gl.reshape(gl.permute(gl.reshape(q, (BLOCK_N, BKW // 8, 8, 8)), (0, 1, 3, 2)), (BLOCK_N, BLOCK_K))
    a = gl.convert_layout(q, a_layout, assert_trivial=True)
    acc = warpgroup_mma(a, xs.index(slot).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
    prev = (i + STAGES - 1) % STAGES
    mbarrier.arrive(empty.index(prev), pred=i > 0)  # wgmma i - 1 is done: its stage can be refilled
    return acc


@gluon.jit
def _consumer(xs, ws, ss, full, empty, steps, steps2, ZC: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    NW: gl.constexpr = 4
    acc_layout: gl.constexpr = mma_layout(BLOCK_M, NW)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    w_layout: gl.constexpr = code_layout(BLOCK_N, BLOCK_K // 8, NW)
    s_layout: gl.constexpr = scale_layout(BLOCK_N, NW)
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_layout)
    for i in range(0, steps2, 2):
        acc = _cstep(acc, i, steps, xs, ws, ss, full, empty, ZC, BLOCK_N, BLOCK_K, STAGES, a_layout, w_layout,
                     s_layout)
        acc = _cstep(acc, i + 1, steps, xs, ws, ss, full, empty, ZC, BLOCK_N, BLOCK_K, STAGES, a_layout,
                     w_layout, s_layout)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    return (acc,)


@gluon.jit
def ws_kernel(x_desc, w_desc, s_desc, Y, M, N, KW, stride_ym, GS: gl.constexpr, ZC: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr):
    BKW: gl.constexpr = BLOCK_K // 8
    tiles_m = gl.cdiv(M, BLOCK_M)
    pid = gl.program_id(0)
    m0 = (pid % tiles_m) * BLOCK_M
    n0 = (pid // tiles_m) * BLOCK_N
    steps = gl.cdiv(KW, BKW)
    steps2 = steps + steps % 2
    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], x_desc.layout)
    ws = gl.allocate_shared_memory(gl.int32, [STAGES, BKW, BLOCK_N], w_desc.layout)
    ss = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, BLOCK_N], s_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    (acc,) = gl.warp_specialize([(_consumer, (xs, ws, ss, full, empty, steps, steps2, ZC, BLOCK_M, BLOCK_N, BLOCK_K,
                                           STAGES)),
                              (_loader, (x_desc, w_desc, s_desc, xs, ws, ss, full, empty, m0, n0, 0, steps2, GS,
                                         BLOCK_K, STAGES))], [1], [40])
    out_layout: gl.constexpr = gl.BlockedLayout([BLOCK_N // 32, 1], [32, 1], [1, 4], [0, 1])
    out = gl.convert_layout(acc, out_layout)
    on = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, out_layout))
    om = m0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, out_layout))
    mask = (on < N)[:, None] & (om < M)[None, :]
    gl.store(Y + om[None, :] * stride_ym + on[:, None], out.to(Y.dtype.element_ty), mask=mask)


def main() -> int:
    print(f"triton {triton.__version__}, sm_90, one consumer warpgroup + one loader warp (40 registers)")
    for cfg in sys.argv[1:] or ["16,128,128,4", "64,64,64,4", "128,128,64,4"]:
        bm, bn, bk, st = map(int, cfg.split(","))
        x = torch.empty(256, 4096, dtype=torch.bfloat16)
        qw = torch.empty(512, 4096, dtype=torch.int32)
        sc = torch.empty(32, 4096, dtype=torch.bfloat16)
        shared = gl.NVMMASharedLayout.get_default_for
        descs = {"x_desc": TensorDescriptor.from_tensor(x, [bm, bk], shared([bm, bk], gl.bfloat16)),
                 "w_desc": TensorDescriptor.from_tensor(qw, [bk // 8, bn], shared([bk // 8, bn], gl.int32)),
                 "s_desc": TensorDescriptor.from_tensor(sc, [1, bn], shared([1, bn], gl.bfloat16))}
        consts = dict(GS=128, ZC=8, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=st)
        sig = {a: "constexpr" if a in consts else mangle_type(descs[a]) if a in descs else
               "*bf16" if a == "Y" else "i32" for a in ws_kernel.arg_names}
        kernel = triton.compile(GluonASTSource(ws_kernel, sig, constexprs=consts, attrs={}),
                                target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        sass = get_sass(kernel.asm["cubin"])
        hgmma, waits = len(re.findall(r"\bHGMMA\.", sass)), len(re.findall(r"WARPGROUP\.DEPBAR", sass))
        print(f"{cfg}: {registers(kernel.asm['cubin'])} registers, {hgmma} HGMMA, {waits} DEPBAR "
              f"({'serialized' if waits >= hgmma else 'pipelined'}), "
              f"PTX wait_group 1: {'wgmma.wait_group.sync.aligned 1' in kernel.asm['ptx']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
