"""EXL3 for batched decode (M of 33 to a few hundred): the trellis decoded straight into the wgmma A fragment (Gluon,
sm_90), x by TMA from shared memory, the next step decoded while this step's wgmma runs.

``exl3_tc.py`` decodes each lane's 8 states into the mma.sync A fragment: a warp's fragment of a 16-row block is
the same for wgmma (a warpgroup's four warps hold rows 16 w .. 16 w + 15 of its 64), so the same decode
(``exl3_tc.fragment``) feeds ``warpgroup_mma`` without moving. What changes with M: mma.sync takes x as a register
operand every warp loads for itself, and its float32 sums for 32-64 rows crowd the registers; wgmma reads x once per
CTA from shared memory and its issue is asynchronous, so a step's decode overlaps the previous step's product, as in
gemm4 (``qmm4.py``: two steps a loop body, so the in-flight wgmma's A registers are never rewritten). Split K adds
float32 partials atomically, as ``exl3_tc`` does.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from ...layouts.exl3 import CODEBOOKS
from .exl3_gemv import two_words
from .exl3_tc import PAIRS, decode_layout, fragment, lane_words, load_words, put
from .qmm4 import tma_load


@gluon.jit
def _step(acc, p0, p1, p2, q0, q1, q2, i, steps, kt0, u_ptr, o0, o1, o2, rel, n_tiles, m0, x_desc, xs, bars,
          BITS: gl.constexpr, CB: gl.constexpr, NT: gl.constexpr, KT: gl.constexpr, STAGES: gl.constexpr,
          TWO_WORDS: gl.constexpr, PAIRS: gl.constexpr, a_l: gl.constexpr):
    """Step ``i``: decode its words (while wgmma ``i - 1`` runs), load step ``i + 2``'s, issue wgmma ``i``, wait for
    ``i - 1`` and refill the x slot it read."""
    a = fragment(p0, p1, p2, rel, CB, NT, KT, TWO_WORDS, PAIRS, a_l)
    p0, p1, p2 = q0, q1, q2
    tp = u_ptr + (kt0 + gl.minimum(i + 2, steps - 1) * KT) * n_tiles * (8 * BITS)
    q0, q1, q2 = load_words(tp, o0, o1, o2, TWO_WORDS)
    slot = i % STAGES
    mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
    acc = warpgroup_mma(a, xs.index(slot).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])  # wgmma i - 1 done: its x slot is free
    nxt = i + STAGES - 1
    mbarrier.expect(bars.index(nxt % STAGES), x_desc.block_type.nbytes, pred=nxt < steps)
    tma_load(x_desc, [m0, (kt0 + nxt * KT) * 16], bars.index(nxt % STAGES), xs.index(nxt % STAGES),
             pred=nxt < steps)
    return acc, p0, p1, p2, q0, q1, q2


@gluon.jit
def exl3_wg_kernel(x_desc, u_ptr, y_ptr, M, n_tiles, kt_split, stride_ym, BITS: gl.constexpr, CB: gl.constexpr,
                   NT: gl.constexpr, KT: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                   TWO_WORDS: gl.constexpr, ATOMIC: gl.constexpr, PAIRS: gl.constexpr):
    """Grid ``(M tiles x N blocks, K splits)``, M tiles fastest: ``y[M, N] (+)= xh[M, K] @ inner[K, N]`` for n tiles
    ``NT`` a program, rows ``BM``, k tiles ``kt_split`` (an even number of ``KT``-tile steps) a split; x through
    ``x_desc`` in ``[BM, 16 KT]`` boxes (zero past M)."""
    NW: gl.constexpr = gl.num_warps()
    dec: gl.constexpr = decode_layout(NW)
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    tiles_m = gl.cdiv(M, BM)
    pid_m = gl.program_id(0) % tiles_m
    pid_n = gl.program_id(0) // tiles_m
    m0 = pid_m * BM
    o0, o1, o2, rel = lane_words(n_tiles, pid_n * NT, BITS, NT, KT, dec)
    kt0 = gl.program_id(1) * kt_split
    steps = kt_split // KT

    xs = gl.allocate_shared_memory(gl.float16, [STAGES, BM, 16 * KT], x_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    for s in gl.static_range(STAGES - 1):
        mbarrier.expect(bars.index(s), x_desc.block_type.nbytes, pred=s < steps)
        tma_load(x_desc, [m0, (kt0 + s * KT) * 16], bars.index(s), xs.index(s), pred=s < steps)

    stride: gl.constexpr = 8 * BITS
    p0, p1, p2 = load_words(u_ptr + kt0 * n_tiles * stride, o0, o1, o2, TWO_WORDS)
    q0, q1, q2 = load_words(u_ptr + (kt0 + KT) * n_tiles * stride, o0, o1, o2, TWO_WORDS)
    acc = gl.zeros([16 * NT, BM], gl.float32, acc_l)
    for i in range(0, steps, 2):  # two steps a body: each wgmma reads its own A registers (see qmm4.py)
        acc, p0, p1, p2, q0, q1, q2 = _step(acc, p0, p1, p2, q0, q1, q2, i, steps, kt0, u_ptr, o0, o1, o2, rel,
                                            n_tiles, m0, x_desc, xs, bars, BITS, CB, NT, KT, STAGES, TWO_WORDS,
                                            PAIRS, a_l)
        acc, p0, p1, p2, q0, q1, q2 = _step(acc, p0, p1, p2, q0, q1, q2, i + 1, steps, kt0, u_ptr, o0, o1, o2,
                                            rel, n_tiles, m0, x_desc, xs, bars, BITS, CB, NT, KT, STAGES,
                                            TWO_WORDS, PAIRS, a_l)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))

    out_l: gl.constexpr = gl.BlockedLayout([16 * NT // 32, 1], [32, 1], [1, NW], [0, 1])  # lanes along n
    put(y_ptr, gl.convert_layout(acc, out_l), pid_n * NT * 16, m0, M, stride_ym, NT, BM, ATOMIC)


#: Launch (n tiles a program, k tiles a step, warps, x stages); a first guess from gemm4's shapes, to be set by
#: ``benchmarks/gpu_exl3_wg.py``'s sweep.
LAUNCH = (8, 2, 4, 4)
#: Programs per SM the K split aims for.
PROGRAMS_PER_SM = 4


def wg_rows(m: int) -> int:
    """Rows a program multiplies: the power of two holding ``m``, 64 (wgmma's tile with one warpgroup) to 128 (the
    float32 sums of 128 n x 128 rows take 128 registers a thread with 4 warps; more rows take more programs)."""
    return min(128, max(64, 1 << max(0, m - 1).bit_length()))


def wg_product(xh: torch.Tensor, trellis: torch.Tensor, bits: int, codebook: str, sms: int,
               tiles_n: int | None = None, tiles_k: int | None = None, warps: int | None = None,
               stages: int | None = None, rows: int | None = None, split: int | None = None,
               per_sm: int = PROGRAMS_PER_SM, pairs: bool = PAIRS) -> torch.Tensor:
    """float32 ``xh [M, K] @ inner [K, N]`` through wgmma (sm_90; ``xh`` float16, the trellis checked by
    ``exl3_mv.check_trellis``; a shape the launch cannot tile raises ``ValueError``). The keywords override
    ``LAUNCH``, ``wg_rows``, the split rule and ``PAIRS``, for sweeps."""
    from .qmm5 import _descriptor

    kt, nt = trellis.shape[:2]
    m = xh.shape[0]
    bm = rows or wg_rows(m)
    ntn, ktn, warps, stages = (tiles_n or LAUNCH[0], tiles_k or LAUNCH[1], warps or LAUNCH[2],
                               stages or LAUNCH[3])
    while nt % ntn:
        ntn //= 2
    if ntn < warps or kt % (2 * ktn):
        raise ValueError(f"exl3_wg: {nt} n tiles / {kt} k tiles do not fit {ntn} n tiles x {warps} warps, steps of "
                         f"{ktn} k tiles in pairs")
    xh = xh.contiguous()
    if xh.data_ptr() % 16:
        xh = xh.clone()
    programs = nt // ntn * -(-m // bm)
    if split is None:
        split = 1
        while programs * split < per_sm * sms and kt % (4 * split * ktn) == 0 and kt // (2 * split) >= 8 * ktn:
            split *= 2
    elif split < 1 or kt % (2 * split * ktn):
        raise ValueError(f"exl3_wg: split: expected a divisor of the {kt} k tiles in pairs of {ktn}-tile steps, "
                         f"found {split}")
    y = (torch.zeros if split > 1 else torch.empty)(m, 16 * nt, dtype=torch.float32, device=xh.device)
    x_desc = _descriptor(xh, [bm, 16 * ktn])
    exl3_wg_kernel[(programs, split)](x_desc, trellis.view(torch.int32), y, m, nt, kt // split, y.stride(0),
                                      BITS=bits, CB=CODEBOOKS.index(codebook), NT=ntn, KT=ktn, BM=bm,
                                      STAGES=stages, TWO_WORDS=two_words(bits), ATOMIC=split > 1, PAIRS=pairs,
                                      num_warps=warps)
    return y
