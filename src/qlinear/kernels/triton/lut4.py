"""4-bit look-up-table weights (bitsandbytes NF4 / FP4) times float16/bfloat16 activations, weight-only.

Checkpoint: ``codes [N, K/2]`` uint8, byte ``j`` of row ``n`` = ``c(n, 2j) << 4 | c(n, 2j + 1)``; ``absmax
[N, K/block]`` float32; a 16-entry float32 ``table``. ``y = x @ (table[c] * absmax)^T (+ bias)``, float32 sums.

Runtime layout (``prepare_lut4``): the bytes themselves viewed as int32 words of 8 codes along K (no copy); in a
word, nibble ``i`` is column ``8w + (i ^ 1)``. The table travels as 16 float16 values ``table / p2`` (``p2`` the
power of two >= max |table|, folded into absmax in float32: exact; NF4 / FP4 have ``p2 = 1``), so every variant
and both decodes use the weights ``f16(table[c] / p2) * (absmax * p2)``: entries to 2^-12, where a bf16 table
would keep 2^-9. The GEMV multiplies them in float32; the tensor-core variants round them once to x's dtype.

Decodes (a constexpr of every body; the same values, bit for bit): ``gather`` loads ``table16[code]`` (what the
interpreter runs; on the GPU about 2x slower than ``prmt``: 64-bit addresses per code), and ``prmt`` (CUDA)
looks codes up four at a time in the table held as bytes in eight registers: per byte plane two ``prmt.b32``
pick from entries 0-7 and 8-15 (selector = code & 7), a LOP3 keeps the half that bit 3 names (its byte mask is
one ``prmt`` in sign-replicate mode), a ``prmt`` pairs low and high bytes into float16x2, ``cvt.f32.f16``
widens: ~20 integer-pipe instructions per word of 8 codes, the GEMV's bound.

Variants (``choose_lut4_variant``): ``gemv`` (M = 1: CUDA cores, split-K; 2 or 4 rows a program exist but
lose to ``skinny`` on the H200), ``skinny`` / ``mma`` (swap-AB ``tl.dot``, small / large activation tiles),
``dense`` (a transient dense chunk and cuBLAS). H200 numbers: ``benchmarks/gpu_bnb.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import triton

from .fp8mv import MAX_DENSE
from .fp_common import (
    FConfig,
    check_bias,
    check_tensor,
    check_x,
    fail,
    sm_count,
    split_for,
)
from .lut4_bodies import lut4_dense_kernel, lut4_dot_kernel, lut4_gemv_kernel, prmt_asm
from .runtime import interpreting

VARIANTS = ("gemv", "skinny", "mma", "dense")
DECODES = ("gather", "prmt")


@dataclass
class Lut4Runtime:
    """Kernel-private tensors of one layer: ``words [N, K/8]`` int32 (the codes' bytes), ``absmax [N, K/block]``
    float32; ``lock`` the split-K counters (left at zero by every launch); ``tables`` the prepared forms of each
    table seen, keyed by its address and version (a table changed in place is prepared again; the first call
    with a table syncs once to build them, so warm up before CUDA-graph capture)."""

    words: torch.Tensor
    absmax: torch.Tensor
    n: int
    k: int
    block: int
    lock: torch.Tensor
    tables: dict = field(default_factory=dict)


def unsupported(k: int, n: int, block: int) -> str:
    """Why the kernels cannot take this shape ('' when they can)."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 32 or block & (block - 1):
        return f"block: expected a power of two >= 32 (whole int32 words per scale), found {block!r}"
    if k <= 0 or k % block:
        return f"K = {k}: expected a positive multiple of block {block}"
    if n <= 0:
        return f"N = {n}: expected at least one output feature"
    return ""


def prepare_lut4(codes: torch.Tensor, absmax: torch.Tensor, block: int) -> Lut4Runtime:
    """Validate the checkpoint tensors and derive the runtime layout (the bytes viewed as int32 words)."""
    op = "prepare_lut4"
    check_tensor(op, "codes", codes, (torch.uint8,), contiguous=False)
    if codes.dim() != 2:
        raise fail(op, "codes", "a 2-D [N, K/2] tensor", f"shape {list(codes.shape)}")
    n, k = codes.shape[0], 2 * codes.shape[1]
    why = unsupported(k, n, block)
    if why:
        raise ValueError(f"{op}: {why}")
    check_tensor(op, "absmax", absmax, (torch.float32,), (n, k // block), codes.device, contiguous=False)
    w = codes.contiguous()
    if w.data_ptr() % 16:
        w = w.clone()
    lock = torch.zeros(1024, dtype=torch.int32, device=codes.device)
    return Lut4Runtime(w.view(torch.int32), absmax.contiguous(), n, k, block, lock)


def _table_forms(rt: Lut4Runtime, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(table16 [16] float16, bytes [8] int32, p2)`` of ``table`` (cached; built once on the host)."""
    key = (table.data_ptr(), table._version, table.device)
    hit = rt.tables.get(key)
    if hit is not None:
        return hit[0]
    if table.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("lut4_linear: table: first seen during CUDA graph capture; call the layer once before "
                           "capturing (its float16 and byte forms are built on the host, once per table)")
    t = table.detach().double().cpu()
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"lut4_linear: table: expected 16 finite values, found {t.tolist()}")
    mant, e = math.frexp(float(t.abs().max()))  # max = mant 2^e, 0.5 <= mant < 1 (0 for an all-zero table)
    p2 = 2.0 ** min(100, max(-100, e - 1 if mant == 0.5 else e)) if mant else 1.0
    t16 = (t / p2).to(torch.float16)
    bits = [int(b) & 0xFFFF for b in t16.view(torch.int16).tolist()]
    words = [sum(((bits[4 * r + j] >> (8 * hi)) & 0xFF) << (8 * j) for j in range(4)) for hi in (0, 1)
             for r in range(4)]
    tb = torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)
    forms = (t16.to(table.device), tb.to(table.device), p2)
    if len(rt.tables) > 8:
        rt.tables.clear()
    rt.tables[key] = (forms, table)  # the table held: its address cannot be reused while the entry lives
    return forms


# ---- launchers ----------------------------------------------------------------------------------------------

def choose_lut4_variant(m: int, n: int, k: int) -> str:
    """The variant for an ``[M, K]`` call. H200 (``benchmarks/gpu_bnb.py``, NF4 block 64, 4096x14336): the GEMV
    wins at M = 1 (23-27 us against skinny's ~32); at M = 4 the 4-row GEMV spills (58-77 us against skinny's
    31.8); mma from M = 64 (48.1 against skinny's 61.7); dense at M = 256 (93.0 against mma's 134.5)."""
    del n, k
    if m == 1:
        return "gemv"
    if m <= 32:
        return "skinny"
    return "mma" if m <= 128 else "dense"


def lut4_config(variant: str, m: int, n: int, k: int, sms: int = 132) -> FConfig:
    """Tiles by M bucket (``block_k`` counts codes: half as many bytes). GEMV at M = 1: 64 rows x 256 codes a
    step (a 128-byte line a row), ~12 CTAs per SM (H200 sweep, 4096x14336: 23.3 us; 256 x 64 steps, one scale
    block a step: 26.9)."""
    if variant == "gemv":
        rows = 1 if m == 1 else (2 if m == 2 else 4)
        bn, bk = {1: (64, 256), 2: (128, 64), 4: (64, 64)}[rows]
        return FConfig("gemv", rows, bn, bk, split_for(-(-n // bn) * -(-m // rows), k, bk, sms, 12), 4, 3)
    if variant == "skinny":
        bm = 16 if m <= 16 else 32
        return FConfig("skinny", bm, 64, 128, split_for(-(-n // 64) * -(-m // bm), k, 128, sms, 6), 4, 3)
    if variant == "mma":
        return FConfig("mma", 64, 128, 64, split_for(-(-n // 128) * -(-m // 64), k, 64, sms, 2, 4), 4, 3)
    if variant == "dense":
        return FConfig("dense", 1, 32, 256, 1, 4, 1)
    raise ValueError(f"lut4_linear: variant: expected one of {', '.join(VARIANTS)}, found {variant!r}")


def _split_scratch(rt: Lut4Runtime, m: int, n: int, tiles: int, split: int, y: torch.Tensor):
    """Float32 partials ``[split, M, N]`` (``y`` as a dummy without split-K) and ``rt.lock`` with >= ``tiles``
    counters (grown once, outside any graph capture in practice: the first call of a shape)."""
    if rt.lock.numel() < tiles:
        rt.lock = torch.zeros(max(tiles, 2 * rt.lock.numel()), dtype=torch.int32, device=rt.lock.device)
    part = torch.empty((split, m, n), dtype=torch.float32, device=y.device) if split > 1 else y
    return part, rt.lock


def lut4_linear(x: torch.Tensor, rt: Lut4Runtime, table: torch.Tensor, bias: torch.Tensor | None = None,
                variant: str | None = None, config: FConfig | None = None,
                decode: str | None = None) -> torch.Tensor:
    """``x [M, K] @ (table[c] * absmax)^T (+ bias)`` -> ``[M, N]`` in x's dtype (module docstring). ``decode``:
    ``prmt`` (CUDA default) or ``gather`` (the interpreter's, and a reference on the GPU)."""
    op = "lut4_linear"
    x = check_x(op, x)
    if not isinstance(rt, Lut4Runtime):
        raise fail(op, "rt", "a Lut4Runtime (prepare_lut4)", type(rt).__name__)
    if x.shape[1] != rt.k:
        raise fail(op, "x", f"shape [M, {rt.k}] (K of the weights)", list(x.shape))
    if rt.words.device != x.device:
        raise fail(op, "rt", f"tensors on {x.device} (the activations' device)", rt.words.device)
    check_tensor(op, "table", table, (torch.float32,), (16,), x.device)
    check_bias(op, bias, rt.n, x.device)
    decode = decode or ("gather" if interpreting() else "prmt")
    if decode not in DECODES:
        raise fail(op, "decode", "'gather' or 'prmt'", repr(decode))
    if decode == "prmt" and x.device.type != "cuda":
        raise fail(op, "decode", "'gather' off CUDA (prmt is inline PTX; the interpreter cannot run it)", "'prmt'")
    m, k, n = x.shape[0], rt.k, rt.n
    if config is None:
        v = variant or choose_lut4_variant(m, n, k)
        if v not in VARIANTS:
            raise fail(op, "variant", "one of " + ", ".join(VARIANTS), repr(v))
        config = lut4_config(v, m, n, k, sm_count(x.device))
    elif config.variant not in VARIANTS:
        raise fail(op, "config.variant", "one of " + ", ".join(VARIANTS), repr(config.variant))
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    t16, tb, p2 = _table_forms(rt, table)
    bk = max(32, 1 << (max(1, config.block_k).bit_length() - 1))  # a power of two: whole blocks or inside one
    kw, kb = k // 8, k // rt.block
    common = dict(BLOCK=rt.block, PRMT=decode == "prmt", ASM=prmt_asm())
    if config.variant == "dense":
        chunk = max(64, MAX_DENSE // k // 64 * 64)
        b = bias.to(x.dtype) if bias is not None else None
        for n0 in range(0, n, chunk):
            n1 = min(n, n0 + chunk)
            wd = torch.empty((n1 - n0, k), dtype=x.dtype, device=x.device)
            grid = (triton.cdiv(n1 - n0, config.block_n), triton.cdiv(k, bk))
            lut4_dense_kernel[grid](rt.words[n0:n1], rt.absmax[n0:n1], t16, tb, wd, n1 - n0, kw, kb, p2,
                                    BLOCK_N=config.block_n, BLOCK_K=bk, num_warps=config.num_warps, **common)
            yc = x @ wd.t()
            del wd
            y[:, n0:n1] = yc + b[n0:n1] if b is not None else yc
        return y
    common.update(HAS_BIAS=bias is not None, EVEN_K=k % bk == 0, num_warps=config.num_warps,
                  num_stages=config.num_stages)
    split = max(1, min(config.split_k, triton.cdiv(k, bk)))
    bias_arg = bias if bias is not None else y
    if config.variant == "gemv":
        rows = config.block_m if config.block_m in (1, 2, 4) else 4
        grid = (triton.cdiv(n, config.block_n), split, triton.cdiv(m, rows))
        part, lck = _split_scratch(rt, m, n, grid[0] * grid[2], split, y)
        lut4_gemv_kernel[grid](x, rt.words, rt.absmax, t16, tb, bias_arg, y, part, lck, m, n, k, kw, kb,
                               x.stride(0), y.stride(0), split, p2, ROWS=rows, BLOCK_N=config.block_n,
                               BLOCK_K=bk, SPLIT=split > 1, **common)
        return y
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    part, lck = _split_scratch(rt, m, n, tiles, split, y)
    lut4_dot_kernel[(tiles, split)](x, rt.words, rt.absmax, t16, tb, bias_arg, y, part, lck, m, n, k, kw, kb,
                                    x.stride(0), y.stride(0), split, p2, BLOCK_M=config.block_m,
                                    BLOCK_N=config.block_n, BLOCK_K=bk, GROUP_M=config.group_m,
                                    SPLIT=split > 1, SETTLE=x.device.type == "cuda", **common)
    return y
