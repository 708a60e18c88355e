"""gemv_tc's B operands (``qmv_tc.py``): which activation pairs each lane holds, and two ways to load them.

Lane ``(g, t)`` of a chunk needs, for each of its ``NF`` local fields ``f``, the pair of sorted K positions
``kbase + (t // HR) NF R + 2 (t % HR) + f R`` (+1) of activation row ``g`` (the field ``f`` of its word rows
``2 (t % HR)``, ``+1``; ``HR = R / 2``). ``lane_x`` loads them per lane (4-byte loads); ``staged_x`` loads the
chunk's whole ``[8, 4 NF]`` tile coalesced and deals it out through shared memory: at M = 8 the per-lane loads
touch 8 cache lines each and saturate L1 (``benchmarks/triton_notes.md``, sixth session).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def x_pairs(X32, xbase, koff, xmask, kbase, i: tl.constexpr, R: tl.constexpr, KX, EVEN_K: tl.constexpr):
    """x pairs (int32: two activations) of the lane's local fields ``4i .. 4i+3``: sorted rows
    ``kbase + koff + f R (+1)``, ``koff = (t // HR) NF R + rp`` the lane's offset; ``xbase`` is its row plus
    ``koff / 2`` in int32 units, so field ``f`` adds the constant ``f R / 2``."""
    f = 4 * i + tl.arange(0, 4)[None, :]
    ptr = X32 + xbase + (kbase // 2 + f * (R // 2))
    if EVEN_K:
        return tl.load(ptr, mask=xmask, other=0)
    return tl.load(ptr, mask=xmask & (kbase + koff + f * R < KX), other=0)


@triton.jit
def lane_x(X32, xbase, koff, xmask, kbase, NF: tl.constexpr, R: tl.constexpr, KX, EVEN_K: tl.constexpr):
    """The lane's ``NF`` x pairs of one chunk as four ``[L, 4]`` tensors, each lane loading its own (4-byte
    loads: 8 rows x 4 lanes touch 8 lines, so 8 L1 wavefronts per load at M = 8); unused ones repeat the first."""
    x0 = x_pairs(X32, xbase, koff, xmask, kbase, 0, R, KX, EVEN_K)
    x1, x2, x3 = x0, x0, x0
    if NF >= 8:
        x1 = x_pairs(X32, xbase, koff, xmask, kbase, 1, R, KX, EVEN_K)
    if NF >= 16:
        x2 = x_pairs(X32, xbase, koff, xmask, kbase, 2, R, KX, EVEN_K)
        x3 = x_pairs(X32, xbase, koff, xmask, kbase, 3, R, KX, EVEN_K)
    return x0, x1, x2, x3


@triton.jit
def staged_x(X32, srow, M, stride32, ok, kbase, NF: tl.constexpr, R: tl.constexpr, WN: tl.constexpr, KX,
             EVEN_K: tl.constexpr):
    """The same four ``[L, 4]`` tensors from one coalesced ``[8, 4 NF]`` load of the chunk's x pairs (rows
    ``srow ..``, 16 bytes a thread), dealt to the lanes by a layout conversion through shared memory.

    Pair ``p`` of the chunk is ``(t // HR, f, t % HR)`` in mixed radix ``(4 / HR, NF, HR)`` (``x_pairs``):
    a reshape and a permute put lane ``4 g + t``'s ``NF`` pairs in its row; every warp along N gets a copy.
    The mapping holds for any R (tested); the kernel stages only R = 8, where Triton keeps the asm's operand
    layout (``tests/test_qmv_tc_layout.py``)."""
    HR: tl.constexpr = R // 2
    P: tl.constexpr = 4 * NF
    L: tl.constexpr = 32 * WN
    rows = srow + tl.arange(0, 8)[:, None]
    pp = tl.arange(0, P)[None, :]
    mask = (rows < M) & ok
    if not EVEN_K:
        mask = mask & (kbase + 2 * pp < KX)
    tile = tl.load(X32 + rows * stride32 + kbase // 2 + pp, mask=mask, other=0)
    lanes = tl.reshape(tl.permute(tl.reshape(tile, (8, 4 // HR, NF, HR)), (0, 1, 3, 2)), (1, 32, NF))
    lanes = tl.reshape(tl.broadcast_to(lanes, (WN, 32, NF)), (L, NF))
    if NF == 4:
        x0, x1, x2, x3 = lanes, lanes, lanes, lanes
    elif NF == 8:
        x0, x1 = tl.split(tl.permute(tl.reshape(lanes, (L, 2, 4)), (0, 2, 1)))
        x2, x3 = x0, x0
    else:  # (i1, i0): field group 2 i1 + i0
        lo, hi = tl.split(tl.permute(tl.reshape(lanes, (L, 2, 2, 4)), (0, 3, 1, 2)))
        x0, x2 = tl.split(lo)
        x1, x3 = tl.split(hi)
    return x0, x1, x2, x3


@triton.jit
def chunk_x(X32, xbase, koff, xmask, srow, M, stride32, ok, kbase, kbs, NF: tl.constexpr, R: tl.constexpr,
            WN: tl.constexpr, KX, EVEN_K: tl.constexpr, STAGE: tl.constexpr):
    """A chunk's x pairs per lane: staged through shared memory (``STAGE``: one warp along K only; ``ok`` the
    step's liveness and ``kbs`` its first sorted row, as scalars) or loaded per lane (``kbase`` per lane,
    ``xmask`` holds the liveness)."""
    if STAGE:
        x0, x1, x2, x3 = staged_x(X32, srow, M, stride32, ok, kbs, NF, R, WN, KX, EVEN_K)
    else:
        x0, x1, x2, x3 = lane_x(X32, xbase, koff, xmask, kbase, NF, R, KX, EVEN_K)
    return x0, x1, x2, x3


@triton.jit
def unit_x(X32, xbase, koff, xmask, srow, M, stride32, ok, u, us, UNIT: tl.constexpr, CK: tl.constexpr,
           NF: tl.constexpr, R: tl.constexpr, WN: tl.constexpr, KX, EVEN_K: tl.constexpr, STAGE: tl.constexpr):
    """x pairs of the first two chunks of step ``u`` (``us``: the same as a scalar, for the staged x; the
    prefetched part; eight ``[L, 4]`` tensors)."""
    a0, a1, a2, a3 = chunk_x(X32, xbase, koff, xmask, srow, M, stride32, ok, u * UNIT * CK, us * UNIT * CK, NF, R,
                             WN, KX, EVEN_K, STAGE)
    b0, b1, b2, b3 = a0, a1, a2, a3
    if UNIT >= 2:
        b0, b1, b2, b3 = chunk_x(X32, xbase, koff, xmask, srow, M, stride32, ok, (u * UNIT + 1) * CK,
                                 (us * UNIT + 1) * CK, NF, R, WN, KX, EVEN_K, STAGE)
    return a0, a1, a2, a3, b0, b1, b2, b3
