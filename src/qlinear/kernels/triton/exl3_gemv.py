"""EXL3 decode GEMV for a few rows (the decode step, M up to 8): each lane decodes 8 consecutive trellis positions
once and multiplies them with every row of its block of ``MB`` rows.

exllamav3 orders a tile's 256 stream positions so that positions ``8 L .. 8 L + 7`` are exactly what lane ``L``
holds of the tensor-core fragments (``layouts/exl3.tile_position``): tile row ``r = 8 (s >> 1 & 1) + 2 (L % 4) +
(s & 1)``, column ``c = 8 (s >> 2) + L // 4`` for ``t = 8 L + s``. So a lane's eight states lie in one short run of the
bitstream: two (``bits`` <= 4) or three consecutive 32-bit words, loaded once per tile and shifted out eight times,
instead of two 16-bit loads per weight as the block decode (``exl3_mv.py``) does. The eight products are summed in
float32 in the lane (no tensor cores, no layout change) and the four lanes sharing a column are added at the end.

Read as int32 (little endian), a tile's int16 words give the producer's bitstream directly: 32-bit word ``i`` is
the stream's bits ``32 i .. 32 i + 31``, most significant first (the int16 pair swap of the layout undone by the
byte order). ``xh`` is read the same way: int32 word ``8 kt + q`` holds rows ``2 q, 2 q + 1`` of k tile ``kt``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ...layouts.exl3 import CODEBOOKS
from .exl3_codebook import codebook_value


@triton.jit
def _x_words(x_ptr, x_rows, live, off, q, MB: tl.constexpr):
    """The int32 words ``off + q`` of each row (``[32]`` for one row, ``[MB, 32]`` for a block) as uint32. One row
    keeps the exact program of the one-row kernel this grew from: the same source compiled through the block path
    scheduled differently and ran 25-45 % slower on an H100 (``results/h100-exl3-gemv-rows-2026-12-05.md``)."""
    words = tl.load(x_ptr + off + q) if MB == 1 else tl.load(x_rows + off, mask=live, other=0)
    return words.to(tl.uint32, bitcast=True)


@triton.jit
def _mac(acc, xv, w, MB: tl.constexpr):
    """``acc += x * w`` for every row: ``acc [NTN, 32]`` or ``[MB, NTN, 32]``, ``xv [32]`` or ``[MB, 32]``."""
    return acc + xv.to(tl.float32)[None, :] * w if MB == 1 else acc + xv.to(tl.float32)[:, None, :] * w[None, :, :]


@triton.jit
def _put(y_ptr, acc_lo, acc_hi, rows, nt, M, n_tiles, NTN: tl.constexpr, MB: tl.constexpr, ATOMIC: tl.constexpr):
    """Sum the four lanes of each column (lane ``L = 4 (c % 8) + q``) and store or add the ``[rows, 16 NTN]``
    outputs."""
    if MB == 1:
        y_lo = tl.sum(tl.reshape(acc_lo, (NTN, 8, 4)), axis=2)
        y_hi = tl.sum(tl.reshape(acc_hi, (NTN, 8, 4)), axis=2)
        cols = y_ptr + nt[:, None] * 16 + tl.arange(0, 8)[None, :]
        if ATOMIC:
            tl.atomic_add(cols, y_lo)
            tl.atomic_add(cols + 8, y_hi)
        else:
            tl.store(cols, y_lo)
            tl.store(cols + 8, y_hi)
    else:
        y_lo = tl.sum(tl.reshape(acc_lo, (MB, NTN, 8, 4)), axis=3)
        y_hi = tl.sum(tl.reshape(acc_hi, (MB, NTN, 8, 4)), axis=3)
        cols = y_ptr + rows[:, None, None] * (n_tiles * 16) + nt[None, :, None] * 16 + tl.arange(0, 8)[None, None, :]
        out = (rows < M)[:, None, None]
        if ATOMIC:
            tl.atomic_add(cols, y_lo, mask=out)
            tl.atomic_add(cols + 8, y_hi, mask=out)
        else:
            tl.store(cols, y_lo, mask=out)
            tl.store(cols + 8, y_hi, mask=out)


@triton.jit
def lane_first_bit(lane, BITS: tl.constexpr):
    """The first bit of lane ``lane``'s first state (stream position ``8 L``) within its tile's ``256 BITS`` bits;
    elementwise, so the block decode (``exl3_mv._stream_block``) and the Gluon kernels (``exl3_tc.py``, lanes in
    their own layouts) share it."""
    return ((8 * lane + 1) * BITS + (256 * BITS - 16)) % (256 * BITS)


@triton.jit
def exl3_gemv_kernel(x_ptr, u_ptr, y_ptr, M, stride_xw, n_tiles, kt_split, BITS: tl.constexpr, CB: tl.constexpr,
                     NTN: tl.constexpr, TWO_WORDS: tl.constexpr, ATOMIC: tl.constexpr, PREFETCH: tl.constexpr,
                     MB: tl.constexpr, ASM: tl.constexpr):
    """``y[M, N] (+)= xh[M, K] @ inner[K, N]`` over k tiles ``pid_k * kt_split ..`` for n tiles ``pid_n * NTN ..``
    and rows ``pid_m * MB ..``; ``x_ptr`` int32 view of float16 ``xh`` (``stride_xw`` words a row), ``u_ptr``
    int32 view of the trellis, ``y_ptr`` float32 (contiguous). ``PREFETCH``: load the next k tile's words before
    decoding this one (hides the load latency when few warps are resident)."""
    WORDS: tl.constexpr = 8 * BITS  # int32 words per tile
    lane = tl.arange(0, 32)
    start = lane_first_bit(lane, BITS)
    first = start // 32
    rel0 = start % 32
    nt = tl.program_id(0) * NTN + tl.arange(0, NTN)
    tile = nt[:, None] * WORDS
    o0 = tile + first[None, :]
    o1 = tile + ((first + 1) % WORDS)[None, :]
    o2 = tile + ((first + 2) % WORDS)[None, :]
    q = lane % 4
    rows = tl.program_id(2) * MB + tl.arange(0, MB)
    x_rows = x_ptr + rows[:, None] * stride_xw + q[None, :]
    live = (rows < M)[:, None]
    shape: tl.constexpr = (NTN, 32) if MB == 1 else (MB, NTN, 32)
    acc_lo = tl.zeros(shape, dtype=tl.float32)  # columns c < 8 of each tile
    acc_hi = tl.zeros(shape, dtype=tl.float32)
    kt0 = tl.program_id(1) * kt_split
    kt_last = kt0 + kt_split - 1
    tp = u_ptr + kt0 * n_tiles * WORDS
    n0 = tl.load(tp + o0)
    n1 = tl.load(tp + o1)
    n2 = tl.load(tp + o2) if not TWO_WORDS else n1
    for kt in range(kt0, kt0 + kt_split):
        if PREFETCH:  # this tile's words were loaded last trip; start the next tile's now
            c0, c1, c2 = n0, n1, n2
            tp = u_ptr + tl.minimum(kt + 1, kt_last) * n_tiles * WORDS
            n0 = tl.load(tp + o0)
            n1 = tl.load(tp + o1)
            n2 = tl.load(tp + o2) if not TWO_WORDS else n1
        else:
            tp = u_ptr + kt * n_tiles * WORDS
            c0 = tl.load(tp + o0)
            c1 = tl.load(tp + o1)
            c2 = tl.load(tp + o2) if not TWO_WORDS else c1
        w1 = c1.to(tl.uint32, bitcast=True).to(tl.uint64)
        win01 = (c0.to(tl.uint32, bitcast=True).to(tl.uint64) << 32) | w1
        if not TWO_WORDS:
            win12 = (w1 << 32) | c2.to(tl.uint32, bitcast=True).to(tl.uint64)
        x_rows_lo = _x_words(x_ptr, x_rows, live, kt * 8, q, MB)  # k 2q, 2q + 1
        x_rows_hi = _x_words(x_ptr, x_rows, live, kt * 8 + 4, q, MB)  # k 8 + 2q, 9 + 2q
        for s in tl.static_range(8):
            rel = rel0 + s * BITS  # the state's first bit, counted from the window's most significant
            if TWO_WORDS:
                state = win01 >> (48 - rel).to(tl.uint64)[None, :]
            else:
                state = tl.where((rel <= 48)[None, :], win01 >> (48 - rel).to(tl.uint64)[None, :],
                                 win12 >> (80 - rel).to(tl.uint64)[None, :])
            w = codebook_value(state.to(tl.uint32) & 0xFFFF, CB, ASM).to(tl.float32)
            xw = x_rows_hi if (s >> 1) & 1 else x_rows_lo
            xv = ((xw >> 16) if s & 1 else (xw & 0xFFFF)).to(tl.uint16).to(tl.float16, bitcast=True)
            if s >= 4:
                acc_hi = _mac(acc_hi, xv, w, MB)
            else:
                acc_lo = _mac(acc_lo, xv, w, MB)
    _put(y_ptr, acc_lo, acc_hi, rows, nt, M, n_tiles, NTN, MB, ATOMIC)


@functools.cache
def two_words(bits: int) -> bool:
    """Whether every lane's eight states fit in two 32-bit words (``bits`` 1..4), else three are loaded."""
    return all(((8 * lane + 1) * bits - 16) % (256 * bits) % 32 + 7 * bits + 16 <= 64 for lane in range(32))


#: Launch shape by trellis width, measured on an H100 at M = 1 (``benchmarks/gpu_exl3_parts.py --splits 1,2``,
#: ``results/h100-gpu-exl3-splits-2026-12-07.md``, us, 4096x14336 / 14336x4096): 8 n tiles per program with 2 warps
#: and the K split of ``PROGRAMS_PER_SM`` for every width (2-bit 32.8 / 33.1, 4-bit 30.7 / 29.6; 4 warps 33.3 /
#: 33.4 and 32.0 / 31.4; 16 tiles 36-56). The launch before (16 tiles x 4 warps for up to 3 bits, 8 x 8 wider, two
#: programs per SM) took 41.1 and 39.3 on 4096x14336: the GEMV is bound by latency (ncu: 20 % achieved occupancy,
#: issue slots 47 % busy, DRAM 11 %), so more, smaller programs hide more of it. exllamav3's own GEMV took 34.2 (2-bit
#: mcg) and 32.9 (4-bit) on 4096x14336 in the same session (``results/h100-gpu_producer_kernels-2026-12-07.md``).
#: The sm_90 SASS (``benchmarks/exl3_sass.py --gemv``) counts about 9 instructions per weight.
LAUNCH = {"narrow": (8, 2), "wide": (8, 2)}  # (n tiles per program, warps)
#: Programs per SM the K split aims for (``k_split``): 16, the best of 2 / 8 / 16 / 32 in that sweep.
PROGRAMS_PER_SM = 16
#: Load the next k tile's words while decoding this one.
PREFETCH = True
#: Fewest k tiles a program sums before the launcher stops splitting K further.
MIN_K_TILES = 8
#: Most rows one program multiplies with its decoded weights; more rows take more programs (each decodes again).
MAX_ROWS = 8
#: Most (rows x n tiles) per program: its float32 sums live in registers, so more rows take fewer n tiles.
MAX_ROW_TILES = 64


def launch_shape(bits: int) -> tuple[int, int]:
    """(n tiles per program, warps) for a trellis width (see ``LAUNCH``)."""
    return LAUNCH["narrow" if bits <= 3 else "wide"]


def rows_per_program(m: int) -> int:
    """Rows a program multiplies with each decoded weight: the power of two holding ``m``, at most ``MAX_ROWS``."""
    return min(MAX_ROWS, 1 << max(0, m - 1).bit_length())


def k_split(programs: int, kt: int, sms: int) -> int:
    """K slices per program column: doubled until the grid has ``PROGRAMS_PER_SM`` programs per SM, while each slice
    keeps at least ``MIN_K_TILES`` of the ``kt`` k tiles."""
    split = 1
    while (programs * split < PROGRAMS_PER_SM * sms and kt % (2 * split) == 0
           and kt // (2 * split) >= MIN_K_TILES):
        split *= 2
    return split


def gemv_product(xh: torch.Tensor, trellis: torch.Tensor, bits: int, codebook: str, sms: int,
                 tiles_n: int | None = None, split: int | None = None, warps: int | None = None,
                 prefetch: bool = PREFETCH, rows: int | None = None, maxnreg: int | None = None) -> torch.Tensor:
    """float32 ``[M, N]`` = float16 ``xh [M, K]`` @ inner weight, for a trellis ``[K/16, N/16, 16 bits]`` already
    checked by ``exl3_mv.check_trellis`` (``sms``: SM count for the K split). ``tiles_n`` (a power of two),
    ``warps``, ``rows`` (rows per program, a power of two), ``split`` (a divisor of the k tiles) and ``maxnreg`` (a
    register cap) override ``launch_shape``, ``rows_per_program``, the split rule and the compiler's register
    choice, for sweeps."""
    kt, nt = trellis.shape[:2]
    m = xh.shape[0]
    mb = rows or rows_per_program(m)
    shape_n, shape_warps = launch_shape(bits)
    ntn = tiles_n or shape_n
    warps = warps or shape_warps
    while nt % ntn or (tiles_n is None and mb * ntn > MAX_ROW_TILES):
        ntn //= 2
    xh = xh.contiguous()
    if xh.data_ptr() % 4:  # the int32 view needs 4-byte alignment
        xh = xh.clone()
    if split is None:
        split = k_split(nt // ntn * -(-m // mb), kt, sms)
    elif split < 1 or kt % split:
        raise ValueError(f"exl3_gemv: split: expected a divisor of the {kt} k tiles, found {split}")
    y = (torch.zeros if split > 1 else torch.empty)(m, 16 * nt, dtype=torch.float32, device=xh.device)
    exl3_gemv_kernel[(nt // ntn, split, -(-m // mb))](xh.view(torch.int32), trellis.view(torch.int32), y, m,
                                                      xh.shape[1] // 2, nt, kt // split, BITS=bits,
                                                      CB=CODEBOOKS.index(codebook), NTN=ntn,
                                                      TWO_WORDS=two_words(bits), ATOMIC=split > 1,
                                                      PREFETCH=prefetch, MB=mb, ASM=xh.is_cuda, num_warps=warps,
                                                      **({"maxnreg": maxnreg} if maxnreg else {}))
    return y
