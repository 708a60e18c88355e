"""EXL3 decode straight into tensor-core fragments (Gluon, ``mma.sync`` m16n8k16): the EXL3 product for M up to 64.

exllamav3 orders a tile's 256 stream positions so that lane ``L = 4 cq + q`` holds positions ``8 L .. 8 L + 7``,
state ``s = 4 s2 + 2 s1 + s0`` being tile row (k) ``8 s1 + 2 q + s0``, column (n) ``8 s2 + cq``
(``layouts/exl3.tile_position``). Read with the weight transposed (``A = inner^T``, rows n, columns k), that is
exactly the m16n8k16 A fragment: lane group ``cq`` holds rows ``cq`` and ``cq + 8``, lane ``q`` columns ``2 q``,
``2 q + 1``, ``2 q + 8``, ``2 q + 9``. So each lane decodes its 8 consecutive states from 2-3 int32 words (as the
GEMV, ``exl3_gemv.py``), and the decoded block *is* the A operand: a reshape and a permute that move no data (the
conversion into the fragment layout is asserted trivial at compile time), no shared memory, no shuffles. x is the
B operand (``[16 KT, BM]``, loaded from global straight into its fragment), the float32 sums stay in the mma
accumulator, and one ``mma.sync`` covers 16 x 16 weights for 8 rows: M = 1..8 cost one decode, as the GEMV's one
row does.

The Triton block decode (``exl3_mv._stream_block``) places the same values with a permute that ``tl.dot`` turns
into a shared-memory round trip; Triton offers no way to name the fragment layout, Gluon does.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from ...layouts.exl3 import CODEBOOKS
from .exl3_codebook import codebook_pairs, codebook_value
from .exl3_gemv import lane_first_bit, two_words


@gluon.jit
def decode_layout(WARPS: gl.constexpr):
    """``[NT, KT, 32 lanes, 8 states]``: states in a thread's registers, lanes across the warp, n tiles across the
    warps (tile ``i`` on warp ``i % WARPS``, as the mma A fragments put 16-row blocks)."""
    return gl.BlockedLayout(size_per_thread=[1, 1, 1, 8], threads_per_warp=[1, 1, 32, 1],
                            warps_per_cta=[WARPS, 1, 1, 1], order=[3, 2, 1, 0])


@gluon.jit
def lane_words(n_tiles, nt0, BITS: gl.constexpr, NT: gl.constexpr, KT: gl.constexpr, dec: gl.constexpr):
    """Per lane of n tiles ``nt0 ..`` and ``KT`` k tiles from 0: the offsets of its 2-3 int32 words (add the step's
    ``k tile * n_tiles * 8 BITS``), and ``rel`` ``[1, 1, 32, 8]``, each state's first bit counted from the first
    word's most significant."""
    WORDS: gl.constexpr = 8 * BITS
    words_l: gl.constexpr = gl.SliceLayout(3, dec)  # [NT, KT, 32]
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, words_l)))
    first = gl.expand_dims(gl.expand_dims(lane_first_bit(lane, BITS) // 32, 0), 1)  # [1, 1, 32]
    lane_state: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, dec))  # [32, 8]
    lane2 = gl.arange(0, 32, layout=gl.SliceLayout(1, lane_state))
    state = gl.arange(0, 8, layout=gl.SliceLayout(0, lane_state))
    rel = gl.expand_dims(lane_first_bit(lane2, BITS) % 32, 1) + gl.expand_dims(state, 0) * BITS
    rel = gl.expand_dims(gl.expand_dims(rel, 0), 0)  # [1, 1, 32, 8]
    nt = nt0 + gl.arange(0, NT, layout=gl.SliceLayout(1, gl.SliceLayout(2, words_l)))
    kt = gl.arange(0, KT, layout=gl.SliceLayout(0, gl.SliceLayout(2, words_l)))
    tile = gl.expand_dims((gl.expand_dims(kt, 0) * n_tiles + gl.expand_dims(nt, 1)) * WORDS, 2)  # [NT, KT, 1]
    return tile + first, tile + (first + 1) % WORDS, tile + (first + 2) % WORDS, rel


@gluon.jit
def load_words(tp, o0, o1, o2, TWO_WORDS: gl.constexpr):
    """A step's 2-3 words a lane (``tp``: the trellis pointer at the step's first k tile); the third is the second
    again where two hold every state."""
    w0 = gl.load(tp + o0)
    w1 = gl.load(tp + o1)
    return w0, w1, w1 if TWO_WORDS else gl.load(tp + o2)


@gluon.jit
def fragment(c0, c1, c2, rel, CB: gl.constexpr, NT: gl.constexpr, KT: gl.constexpr, TWO_WORDS: gl.constexpr,
             PAIRS: gl.constexpr, a_l: gl.constexpr):
    """The float16 A operand ``[16 NT, 16 KT]`` (``inner^T``: rows n, columns k) of a step's words, in ``a_l``
    without moving (see the module docstring)."""
    w1 = c1.to(gl.uint32, bitcast=True).to(gl.uint64)
    win01 = gl.expand_dims((c0.to(gl.uint32, bitcast=True).to(gl.uint64) << 32) | w1, 3)
    if TWO_WORDS:
        st = win01 >> (48 - rel).to(gl.uint64)
    else:
        win12 = gl.expand_dims((w1 << 32) | c2.to(gl.uint32, bitcast=True).to(gl.uint64), 3)
        st = gl.where(rel <= 48, win01 >> (48 - rel).to(gl.uint64), win12 >> (80 - rel).to(gl.uint64))
    st = st.to(gl.uint32)
    v = codebook_pairs(st, CB) if PAIRS else codebook_value(st & 0xFFFF, CB, True)  # [NT, KT, 32, 8] float16
    v = gl.permute(gl.reshape(v, (NT, KT, 8, 4, 2, 2, 2)), (0, 4, 2, 1, 5, 3, 6))  # nt s2 cq | kt s1 q s0
    return gl.convert_layout(gl.reshape(v, (16 * NT, 16 * KT)), a_l, assert_trivial=True)


@gluon.jit
def exl3_tc_kernel(x_ptr, u_ptr, y_ptr, M, n_tiles, kt_split, stride_xm, stride_ym,
                   BITS: gl.constexpr, CB: gl.constexpr, NT: gl.constexpr, KT: gl.constexpr, BM: gl.constexpr,
                   TWO_WORDS: gl.constexpr, ATOMIC: gl.constexpr, WARPS: gl.constexpr, PAIRS: gl.constexpr):
    """``y[M, N] (+)= xh[M, K] @ inner[K, N]`` for n tiles ``pid_n * NT ..``, k tiles ``pid_k * kt_split ..`` (``KT``
    a step), rows ``pid_m * BM ..``; ``u_ptr`` the int32 view of the trellis, ``y_ptr`` float32 contiguous."""
    WORDS: gl.constexpr = 8 * BITS  # int32 words per tile
    dec: gl.constexpr = decode_layout(WARPS)
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_l, k_width=2)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=acc_l, k_width=2)
    o0, o1, o2, rel = lane_words(n_tiles, gl.program_id(0) * NT, BITS, NT, KT, dec)

    rows = gl.program_id(2) * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, b_l))
    kk = gl.arange(0, 16 * KT, layout=gl.SliceLayout(1, b_l))
    x_at = x_ptr + gl.expand_dims(rows, 0) * stride_xm + gl.expand_dims(kk, 1)  # [16 KT, BM]
    x_live = gl.expand_dims(rows < M, 0)
    acc = gl.zeros([16 * NT, BM], gl.float32, layout=acc_l)

    kt0 = gl.program_id(1) * kt_split
    n0, n1, n2 = load_words(u_ptr + kt0 * n_tiles * WORDS, o0, o1, o2, TWO_WORDS)
    for k in range(kt0, kt0 + kt_split, KT):
        c0, c1, c2 = n0, n1, n2  # this step's words were loaded a step ago; start the next step's now
        tp = u_ptr + gl.minimum(k + KT, kt0 + kt_split - KT) * n_tiles * WORDS
        n0, n1, n2 = load_words(tp, o0, o1, o2, TWO_WORDS)
        a = fragment(c0, c1, c2, rel, CB, NT, KT, TWO_WORDS, PAIRS, a_l)
        xb = gl.load(x_at + k * 16, mask=x_live, other=0.0)
        acc = mma_v2(a, xb, acc)

    put(y_ptr, acc, gl.program_id(0) * NT * 16, gl.program_id(2) * BM, M, stride_ym, NT, BM, ATOMIC)


@gluon.jit
def put(y_ptr, out, n0, m0, M, stride_ym, NT: gl.constexpr, BM: gl.constexpr, ATOMIC: gl.constexpr):
    """Store (``ATOMIC``: add, relaxed: split-K partials) ``out [16 NT, BM]`` (n, rows) as ``y[m0 + r, n0 + c]``, rows
    past ``M`` left out, in ``out``'s own layout."""
    layout: gl.constexpr = out.type.layout
    n = n0 + gl.arange(0, 16 * NT, layout=gl.SliceLayout(1, layout))
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    ptr = y_ptr + gl.expand_dims(rows, 0) * stride_ym + gl.expand_dims(n, 1)
    live = gl.expand_dims(rows < M, 0)
    if ATOMIC:
        gl.atomic_add(ptr, out, mask=live, sem="relaxed")
    else:
        gl.store(ptr, out, mask=live)


#: Launch (n tiles a program, k tiles a step, warps) by rows, from the H100 sweep over 7 launches, 2 shapes x 3
#: widths (``benchmarks/gpu_exl3_tc.py``, ``results/h100-gpu_exl3_tc-2026-12-08.md``): up to 8 rows 8 x 4 x 4 (within
#: 1.05 / 1.08 of each cell's best at M = 1 / 4..8, 1.02-1.03 on average); more rows 8 x 2 x 2 (within 1.05 at M = 16
#: and 32; 4 warps cost 1.08-1.12 at M = 32, the accumulators being twice as many a thread).
LAUNCH_FEW = (8, 4, 4)
LAUNCH = (8, 2, 2)
#: Decode two states an instruction sequence with the last step in f16x2 (``exl3_codebook.codebook_pairs``); off
#: until a GPU run has checked it bit for bit (``benchmarks/gpu_exl3_tc.py``) and timed it against the plain form.
PAIRS = False
#: Programs per SM the K split aims for, as the GEMV's (``exl3_gemv.PROGRAMS_PER_SM``).
PROGRAMS_PER_SM = 16
#: Fewest k tiles a program sums before the launcher stops splitting K.
MIN_K_TILES = 8


def tc_rows(m: int) -> int:
    """Rows a program multiplies: the power of two holding ``m``, 8 (the mma's n) to 64."""
    return min(64, max(8, 1 << max(0, m - 1).bit_length()))


def tc_product(xh: torch.Tensor, trellis: torch.Tensor, bits: int, codebook: str, sms: int,
               tiles_n: int | None = None, tiles_k: int | None = None, warps: int | None = None,
               rows: int | None = None, split: int | None = None, per_sm: int = PROGRAMS_PER_SM,
               pairs: bool = PAIRS) -> torch.Tensor:
    """float32 ``xh [M, K] @ inner [K, N]`` on the tensor cores, CUDA only (``xh`` float16 with unit column stride,
    the trellis checked by ``exl3_mv.check_trellis``; ``sms``: SM count for the K split). ``tiles_n``,
    ``tiles_k``, ``warps``, ``rows``, ``split``, ``per_sm`` and ``pairs`` override ``LAUNCH_FEW`` / ``LAUNCH``,
    ``tc_rows``, the split rule and ``PAIRS``, for sweeps."""
    kt, nt = trellis.shape[:2]
    m = xh.shape[0]
    bm = rows or tc_rows(m)
    launch = LAUNCH_FEW if bm <= 8 else LAUNCH
    ntn, ktn, warps = tiles_n or launch[0], tiles_k or launch[1], warps or launch[2]
    while nt % ntn:
        ntn //= 2
    while kt % ktn:
        ktn //= 2
    warps = min(warps, ntn)  # each warp owns whole n tiles: fewer tiles than warps would add them twice
    if split is None:
        split = 1
        programs = nt // ntn * -(-m // bm)
        while (programs * split < per_sm * sms and kt % (2 * split * ktn) == 0
               and kt // (2 * split) >= max(MIN_K_TILES, ktn)):
            split *= 2
    elif split < 1 or kt % (split * ktn):
        raise ValueError(f"exl3_tc: split: expected a divisor of the {kt} k tiles in steps of {ktn}, found {split}")
    y = (torch.zeros if split > 1 else torch.empty)(m, 16 * nt, dtype=torch.float32, device=xh.device)
    exl3_tc_kernel[(nt // ntn, split, -(-m // bm))](xh, trellis.view(torch.int32), y, m, nt, kt // split,
                                                    xh.stride(0), y.stride(0), BITS=bits,
                                                    CB=CODEBOOKS.index(codebook), NT=ntn, KT=ktn, BM=bm,
                                                    TWO_WORDS=two_words(bits), ATOMIC=split > 1, WARPS=warps,
                                                    PAIRS=pairs, num_warps=warps)
    return y
