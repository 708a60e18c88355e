"""EXL3 trellis decode in Triton, and the route ``inner_product`` takes: up to 32 rows decoded straight into mma
fragments (``exl3_tc.py``, Gluon), a fused decode GEMM up to 64 (from 5 rows where Gluon cannot run, the lane-wise
GEMV of ``exl3_gemv.py`` below), a decode-to-float16 pass and one matmul above.

Both decode a ``[BK, BN]`` block of the inner weight straight from the int16 trellis (``layouts/exl3.py``) in
stream order (``_stream_block``): each lane's 8 consecutive states come from 2-3 int32 words loaded once, as in
the GEMV, and the block is placed by a reshape and a permute that the layout change into ``tl.dot`` absorbs. It
replaced a per-element decode (for each weight its stream position, two int16 loads, a shift; removed after
f54c3c1): offline sm_90 SASS at 16 x 32 x 128, 4 warps: 2-bit 18.9 -> 11.5 instructions and 2.1 -> 0.44 global
loads per weight, 229 -> 80 registers; 4-bit 12.5 -> 11.6 and 0.88 -> 0.44; on an H100 the fused kernel 1.5-1.8x
faster at M <= 16 and the decode pass 1.2x (``results/h100-gpu_exl3_block-2026-12-07.md``). The codebook
turns a state into the float16 value exllamav3's ``decode_3inst<cb>`` gives (one rounding of the exact float32
result). The input and output transforms around the product are butterflies of their own (``hadamard.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...layouts.exl3 import CODEBOOKS
from .exl3_codebook import codebook_value
from .exl3_gemv import gemv_product, lane_first_bit, two_words


@triton.jit
def _stream_block(u_ptr, kt0, nt0, n_tiles, BITS: tl.constexpr, CB: tl.constexpr, KT: tl.constexpr,
                  NTN: tl.constexpr, TWO_WORDS: tl.constexpr, ASM: tl.constexpr):
    """float16 ``[16 KT, 16 NTN]`` block of the inner weight at k tile ``kt0``, n tile ``nt0`` (``u_ptr``: int32 view
    of the trellis), decoded in stream order as the GEMV does (``exl3_gemv.py``: each lane's 8 consecutive states
    from 2-3 words loaded once), then placed: lane ``L = 4 cq + q``, state ``s = 4 s2 + 2 s1 + s0`` is tile row
    ``8 s1 + 2 q + s0``, column ``8 s2 + cq``, a reshape and one permute (the layout change ``tl.dot`` makes anyway)."""
    WORDS: tl.constexpr = 8 * BITS  # int32 words per tile
    start = lane_first_bit(tl.arange(0, 32), BITS)
    first = start // 32
    rel = ((start % 32)[:, None] + tl.arange(0, 8)[None, :] * BITS)[None, None, :, :]  # [1, 1, 32, 8]
    kt = kt0 + tl.arange(0, KT)
    nt = nt0 + tl.arange(0, NTN)
    tile = ((kt[:, None] * n_tiles + nt[None, :]) * WORDS)[:, :, None]  # [KT, NTN, 1]
    w0 = tl.load(u_ptr + tile + first[None, None, :]).to(tl.uint32, bitcast=True).to(tl.uint64)
    w1 = tl.load(u_ptr + tile + ((first + 1) % WORDS)[None, None, :]).to(tl.uint32, bitcast=True).to(tl.uint64)
    win01 = ((w0 << 32) | w1)[:, :, :, None]
    if TWO_WORDS:
        state = win01 >> (48 - rel).to(tl.uint64)
    else:
        w2 = tl.load(u_ptr + tile + ((first + 2) % WORDS)[None, None, :]).to(tl.uint32, bitcast=True)
        win12 = (w1[:, :, :, None] << 32) | w2.to(tl.uint64)[:, :, :, None]
        state = tl.where(rel <= 48, win01 >> (48 - rel).to(tl.uint64), win12 >> (80 - rel).to(tl.uint64))
    v = codebook_value(state.to(tl.uint32) & 0xFFFF, CB, ASM)  # [KT, NTN, 32 lanes, 8 states]
    v = tl.permute(tl.reshape(v, (KT, NTN, 8, 4, 2, 2, 2)), (0, 5, 3, 6, 1, 4, 2))  # kt s1 q s0 | nt s2 cq
    return tl.reshape(v, (16 * KT, 16 * NTN))


@triton.jit
def exl3_mv_kernel(x_ptr, tr_ptr, y_ptr, M, K, n_tiles, k_split, stride_xm, stride_ym,
                   BITS: tl.constexpr, CB: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
                   ATOMIC: tl.constexpr, ASM: tl.constexpr, TWO_WORDS: tl.constexpr):
    """``y[M, N] (+)= xh[M, K] @ inner[K, N]``: float16 operands, float32 sums; program (n block, K split, M block);
    ``tr_ptr`` the int32 view of the trellis."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    m = pid_m * BM + tl.arange(0, BM)
    n0 = pid_n * BN
    kk = tl.arange(0, BK)
    x_rows = x_ptr + m[:, None] * stride_xm + kk[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(pid_k * k_split, tl.minimum(K, (pid_k + 1) * k_split), BK):
        wt = _stream_block(tr_ptr, k0 // 16, n0 // 16, n_tiles, BITS, CB, BK // 16, BN // 16, TWO_WORDS, ASM)
        xt = tl.load(x_rows + k0, mask=m[:, None] < M, other=0.0)
        acc += tl.dot(xt, wt)
    n = n0 + tl.arange(0, BN)
    ptr = y_ptr + m[:, None] * stride_ym + n[None, :]
    if ATOMIC:
        tl.atomic_add(ptr, acc, mask=m[:, None] < M)
    else:
        tl.store(ptr, acc, mask=m[:, None] < M)


@triton.jit
def exl3_decode_kernel(tr_ptr, w_ptr, n_tiles, BITS: tl.constexpr, CB: tl.constexpr, BK: tl.constexpr,
                       BN: tl.constexpr, ASM: tl.constexpr, TWO_WORDS: tl.constexpr):
    """The float16 inner weight ``[K, N]`` (row-major), one ``[BK, BN]`` block per program (``tr_ptr``: as in
    ``exl3_mv_kernel``)."""
    k0 = tl.program_id(1) * BK
    n0 = tl.program_id(0) * BN
    wt = _stream_block(tr_ptr, k0 // 16, n0 // 16, n_tiles, BITS, CB, BK // 16, BN // 16, TWO_WORDS, ASM)
    k = k0 + tl.arange(0, BK)
    n = n0 + tl.arange(0, BN)
    tl.store(w_ptr + k[:, None] * (n_tiles * 16) + n[None, :], wt)


#: Largest M the mma-fragment kernel serves on CUDA (``exl3_tc.py``, Gluon: Triton 3.6+); on the H100
#: (``benchmarks/gpu_exl3_tc.py``, ``results/h100-gpu_exl3_tc-2026-12-08.md``, 4096x14336 / 14336x4096, 2-bit and
#: 4-bit 3inst, 2-bit mul1, us) it beats the GEMV at M = 1 (23-30 against 29-34) and costs about the same up to 8 rows
#: (23-31 against the GEMV's 44-48 at M = 4), then 29-35 at 16 and 43-54 at 32 against the fused kernel's 57-71 and
#: 65-77; at 64 it takes 74-99 against the fused kernel's 74-87.
TC_MAX_M = 32
#: Largest M the lane-wise GEMV serves where the mma-fragment kernel cannot run (no Gluon; Triton's interpreter).
#: From the H100 side by side with the stream decode (``benchmarks/gpu_exl3_block.py``,
#: ``results/h100-gpu_exl3_block-2026-12-07.md``, 4096x14336, us, GEMV / best fused): M = 4 47-48 / 57-67; the fused
#: kernel's 16-row block costs the same at any M up to 16 (59-70 at M = 16), under the GEMV's 79-88 at M = 8
#: (``results/h100-gpu_exl3-2026-12-07-dp4a.md``).
GEMV_MAX_M = 4
#: Largest M the fused kernel serves; above it the weight is decoded once per call and multiplied by cuBLAS. Same
#: run: M = 64 fused 74-87 against decode + matmul 95-102; M = 256 236-280 against 101-106.
FUSED_MAX_M = 64
#: Fused kernel block (k x n, 4 warps; rows: ``fused_rows``), the best or within 2 % of it of 5 blocks x 2 warp
#: counts at M = 1, 4, 16, 64 in that run (16 x 32 x 128, the block before, took 67-75 at M = 1..16).
BLOCK_K, BLOCK_N = 32, 64


def fused_rows(m: int) -> int:
    """Rows of the fused kernel's block: the power of two holding M, 16 to 64 (16 is the tensor-core minimum)."""
    return min(64, max(16, 1 << max(0, m - 1).bit_length()))


def _block(total: int, want: int) -> int:
    b = want
    while total % b:
        b //= 2
    return b


def check_trellis(trellis: torch.Tensor, bits: int, codebook: str) -> None:
    """Raise ``ValueError`` naming the argument unless the trellis is int16 ``[K/16, N/16, 16 bits]``, contiguous."""
    if trellis.dtype != torch.int16 or trellis.dim() != 3 or trellis.shape[2] != 16 * bits \
            or not trellis.is_contiguous():
        raise ValueError(f"exl3_mv: trellis: expected a contiguous int16 [K/16, N/16, {16 * bits}] tensor, found "
                         f"{trellis.dtype} {list(trellis.shape)}")
    if codebook not in CODEBOOKS:
        raise ValueError(f"exl3_mv: codebook: expected one of {', '.join(CODEBOOKS)}, found {codebook!r}")


def decode_inner(trellis: torch.Tensor, bits: int, codebook: str) -> torch.Tensor:
    """float16 ``[K, N]`` inner weight of an int16 trellis ``[K/16, N/16, 16 bits]`` (transient)."""
    check_trellis(trellis, bits, codebook)
    kt, nt = trellis.shape[:2]
    k, n = 16 * kt, 16 * nt
    bk, bn = _block(k, 64), _block(n, 64)
    w = torch.empty(k, n, dtype=torch.float16, device=trellis.device)
    exl3_decode_kernel[(n // bn, k // bk)](trellis.view(torch.int32), w, nt, BITS=bits,
                                           CB=CODEBOOKS.index(codebook), BK=bk, BN=bn, ASM=trellis.is_cuda,
                                           TWO_WORDS=two_words(bits))
    return w


def tc_available(xh: torch.Tensor) -> bool:
    """Whether the mma-fragment kernel (``exl3_tc.py``) can run on ``xh``'s device: NVIDIA CUDA (not ROCm, which
    torch also calls cuda: the kernel is NVIDIA PTX) and a Triton with Gluon."""
    from .gemm4_limits import gluon_missing

    return xh.is_cuda and torch.version.hip is None and not gluon_missing()


def inner_product(xh: torch.Tensor, trellis: torch.Tensor, bits: int, codebook: str,
                  sms: int | None = None) -> torch.Tensor:
    """float32 ``xh [M, K] @ inner [K, N]`` with ``xh`` float16 contiguous (``sms``: SM count for the split): up to
    ``TC_MAX_M`` rows decoded straight into mma fragments (``exl3_tc.py``) where Gluon runs, else up to
    ``GEMV_MAX_M`` through the lane-wise GEMV (``exl3_gemv.py``); up to ``FUSED_MAX_M`` through the block decode and
    ``tl.dot``; more by decoding the weight once and one float16 matmul."""
    check_trellis(trellis, bits, codebook)
    if xh.dtype != torch.float16 or xh.dim() != 2 or xh.shape[1] != 16 * trellis.shape[0] or xh.stride(1) != 1:
        raise ValueError(f"exl3_mv: xh: expected float16 [M, {16 * trellis.shape[0]}] with unit column stride, "
                         f"found {xh.dtype} {list(xh.shape)}")
    m = xh.shape[0]
    if m > FUSED_MAX_M:
        return (xh @ decode_inner(trellis, bits, codebook)).float()
    if sms is None:
        sms = torch.cuda.get_device_properties(xh.device).multi_processor_count if xh.is_cuda else 4
    if m <= TC_MAX_M and tc_available(xh):
        from .exl3_tc import tc_product

        return tc_product(xh, trellis, bits, codebook, sms)
    if m <= GEMV_MAX_M:
        return gemv_product(xh, trellis, bits, codebook, sms)
    return fused_product(xh, trellis, bits, codebook, sms)


def fused_product(xh: torch.Tensor, trellis: torch.Tensor, bits: int, codebook: str, sms: int,
                  block: tuple[int, int, int] | None = None, warps: int = 4) -> torch.Tensor:
    """``inner_product`` through the block decode and ``tl.dot`` (any M; served up to ``FUSED_MAX_M``). ``block``
    (rows, k, n; powers of two, k and n multiples of 16) and ``warps`` override ``fused_rows``, ``BLOCK_K``,
    ``BLOCK_N``."""
    m, k = xh.shape
    nt = trellis.shape[1]
    n = 16 * nt
    cb = CODEBOOKS.index(codebook)
    bm, bk, bn = block or (fused_rows(m), BLOCK_K, BLOCK_N)
    bk, bn = _block(k, bk), _block(n, bn)
    blocks = (n // bn) * -(-m // bm)
    split = 1
    while blocks * split < 4 * sms and k // (bk * split * 2) >= 2 and (k // bk) % (split * 2) == 0:
        split *= 2
    k_split = k // split
    y = (torch.zeros if split > 1 else torch.empty)(m, n, dtype=torch.float32, device=xh.device)
    exl3_mv_kernel[(n // bn, split, -(-m // bm))](xh, trellis.view(torch.int32), y, m, k, nt, k_split,
                                                  xh.stride(0), y.stride(0), BITS=bits, CB=cb, BM=bm, BK=bk, BN=bn,
                                                  ATOMIC=split > 1, ASM=xh.is_cuda, TWO_WORDS=two_words(bits),
                                                  num_warps=warps)
    return y
