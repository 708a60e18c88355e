"""``skinny3``: 4-bit weights dequantized two codes per instruction into a swap-AB tensor-core product.

For M up to 16 the weight tile is the MMA's A operand (``W [BN, BK] @ x^T [BK, 16]``: wgmma's 64-row
tiles run over output channels, the few activation rows are its N). Dequantization works on packed
halves, as dense code would: for two consecutive word rows ``(w, w+1)`` of a column (``pack=2``), one PRMT
gathers a byte of each, and per field ``LOP3 ((t >> 4i) & 0x000F000F) | magic`` makes the pair
``(m + q_w, m + q_w+1)`` as bf16x2 (``m = 128``) or f16x2 (``m = 1024``), exact; ``sub`` of ``m + z`` is
exact and one ``mul`` by the scale rounds once, in the activation dtype. Field ``j`` of word rows
``w, w+1`` are sorted rows ``k, k+1`` (field-blocked words, ``layout.py``), so each register is a K pair.
About 3.7 instructions per weight in the loop (offline SASS, triton 3.6) against 5.9 for ``skinny2``, yet
on the H200 it only matches skinny2 (76.5 vs 80.9 us at M=16 on 8192x28672): Triton waits on every
wgmma whose A comes from registers (benchmarks/triton_notes.md). So it is an explicit variant, outside
the crossovers, until that is solved.

The scale is rounded to the activation dtype before the multiply (bf16: relative 2^-9; the other variants
round only the product). Under ``TRITON_INTERPRET`` (CI) the same tile values are built with plain Triton
ops (``_field``), since inline PTX cannot run there; the tile assembly, tiling and reduction are shared.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import load_words, store_split
from .configs import Config
from .gather import sorted_input
from .layout import Packed


def _pairs_asm(magic: str, ty: str, offsets: bool = False) -> str:
    """PTX for two words ``$8, $9`` (word rows w, w+1 of one column): per byte X one PRMT puts byte X of each
    word at bytes 0 and 2; the low nibbles are fields 2X, the high nibbles (after a shift) fields 2X+1. Then
    ``(q - z) s`` with ``$10`` the scale pair and ``$11`` the ``magic + z`` pair; ``offsets``: ``q s + o`` by one
    FMA with ``$12`` the offset pair (``$11`` then the bare magic)."""
    lines = ["{", ".reg .b32 t, u;"]
    for x in range(4):
        sel = x | x << 4 | (4 + x) << 8 | (4 + x) << 12
        lines += [f"prmt.b32 t, $8, $9, {sel:#06x};",
                  f"lop3.b32 ${2 * x}, t, 0x000F000F, {magic}, 0xEA;",
                  "shr.u32 u, t, 4;",
                  f"lop3.b32 ${2 * x + 1}, u, 0x000F000F, {magic}, 0xEA;"]
    lines += [f"sub.{ty} ${i}, ${i}, $11;" for i in range(8)]
    if offsets:
        lines += [f"fma.rn.{ty} ${i}, ${i}, $10, $12;" for i in range(8)]
    else:
        lines += [f"mul.rn.{ty} ${i}, ${i}, $10;" for i in range(8)]
    return "\n".join([*lines, "}"])


#: per activation dtype: the asm (fields of two words -> eight bf16x2 / f16x2 pairs) and its magic value m
ASM_BF16 = tl.constexpr(_pairs_asm("0x43004300", "bf16x2"))
ASM_F16 = tl.constexpr(_pairs_asm("0x64006400", "f16x2"))


@triton.jit
def _fields_bf16(w, s, zc):
    """Eight ``[BN, BKW]`` bf16 tensors: field ``j`` of every word, dequantized, rows paired in registers."""
    return tl.inline_asm_elementwise(ASM_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [w, s, zc],
                                     dtype=(tl.bfloat16,) * 8, is_pure=True, pack=2)


@triton.jit
def _fields_f16(w, s, zc):
    """``_fields_bf16`` for float16 activations (magic 1024)."""
    return tl.inline_asm_elementwise(ASM_F16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [w, s, zc],
                                     dtype=(tl.float16,) * 8, is_pure=True, pack=2)


@triton.jit
def _settled(acc):
    """``acc`` through an opaque copy (ptxas drops it): a use outside a dot, so Triton waits for every wgmma of
    the step before the next one starts.

    Left alone, Triton 3.6 pipelines the loop's wgmma with ``pendings = dots - 1`` (triton-lang/triton#9433):
    up to three of a step's four may still be reading their A registers when the next step's dequantization
    writes them, which on the H200 gave NaN outputs now and then (gemm3 128x128x64, 8 warps, 4 stages). With
    the copy the step's wgmma issue back to back as one group and are waited once (offline SASS, sm_90)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _field(w, s, z, j: tl.constexpr):
    """Plain-Triton twin of one asm output (the interpreter path): ``(q_j - z) * s`` in the activation dtype."""
    q = ((w >> (4 * j)) & 0xF).to(tl.float32)
    return ((q - z.to(tl.float32)) * s.to(tl.float32)).to(s.dtype)


@triton.jit
def _weight_tile(W, S, Z, kb, offs_n, nmask, KW, NP, GS: tl.constexpr, R: tl.constexpr, ZC: tl.constexpr,
                 HAS_Z: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 EVEN_N: tl.constexpr, USE_ASM: tl.constexpr, dt: tl.constexpr):
    """K step ``kb``'s dequantized weights ``[BN, BK]`` in the activation dtype, rows in sorted order."""
    BKW: tl.constexpr = BLOCK_K // 8
    NB: tl.constexpr = BKW // R
    MAGIC: tl.constexpr = 128.0 if dt == tl.bfloat16 else 1024.0
    g = kb * BLOCK_K // GS  # BLOCK_K divides the group length: one scale row per step
    s1 = tl.load(S + g * NP + offs_n, mask=nmask, other=0.0).to(dt)
    if HAS_Z:
        z1 = tl.load(Z + g * NP + offs_n, mask=nmask, other=0).to(tl.float32)
    else:
        z1 = tl.full([BLOCK_N], ZC, tl.float32)
    rows = kb * BKW + tl.arange(0, BKW)
    w = tl.trans(load_words(W, rows, offs_n, KW, NP, EVEN_K, EVEN_N))  # [BN, BKW]: word rows last
    s = tl.broadcast_to(s1[:, None], (BLOCK_N, BKW))
    if USE_ASM:
        zc = tl.broadcast_to((z1 + MAGIC).to(dt)[:, None], (BLOCK_N, BKW))
        if dt == tl.bfloat16:
            o0, o1, o2, o3, o4, o5, o6, o7 = _fields_bf16(w, s, zc)
        else:
            o0, o1, o2, o3, o4, o5, o6, o7 = _fields_f16(w, s, zc)
    else:
        z = tl.broadcast_to(z1[:, None], (BLOCK_N, BKW))
        o0, o1, o2, o3 = _field(w, s, z, 0), _field(w, s, z, 1), _field(w, s, z, 2), _field(w, s, z, 3)
        o4, o5, o6, o7 = _field(w, s, z, 4), _field(w, s, z, 5), _field(w, s, z, 6), _field(w, s, z, 7)
    # [BN, BKW, 8] with fields in join order 0..7, then tile row a*8R + j*R + r = field j of word row a*R + r
    q = tl.join(tl.join(tl.join(o0, o4), tl.join(o2, o6)), tl.join(tl.join(o1, o5), tl.join(o3, o7)))
    return tl.reshape(tl.permute(tl.reshape(q, (BLOCK_N, NB, R, 8)), (0, 1, 3, 2)), (BLOCK_N, BLOCK_K))


@triton.jit
def qmm3_kernel(X, W, S, Z, BIAS, Y, PART, LOCK,
                M, N, K, KW, NP, SPLIT_K, stride_xm, stride_ym, GS: tl.constexpr,
                R: tl.constexpr, ZC: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, USE_ASM: tl.constexpr):
    """Grid ``(M tiles x N tiles, SPLIT_K)``, M tiles fastest (CTAs sharing a weight tile run together); x is
    in sorted order (gathered once when act-order)."""
    BKW: tl.constexpr = BLOCK_K // 8
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    pid_m = pid % tiles_m
    pid_n = pid // tiles_m
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    nmask = (offs_n < NP) | EVEN_N
    nkb = tl.cdiv(KW, BKW)
    per = tl.cdiv(nkb, SPLIT_K)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    mcol = (offs_m < M)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(kb0, kb1):
        k0 = kb * BLOCK_K
        a = _weight_tile(W, S, Z, kb, offs_n, nmask, KW, NP, GS, R, ZC, HAS_Z, BLOCK_N, BLOCK_K, EVEN_K, EVEN_N,
                         USE_ASM, X.dtype.element_ty)
        xk = k0 + offs_k
        xt_ptr = X + offs_m[None, :] * stride_xm + xk[:, None]
        if EVEN_K:
            xt = tl.load(xt_ptr, mask=mcol, other=0.0)
        else:
            xt = tl.load(xt_ptr, mask=mcol & (xk < K)[:, None], other=0.0)
        acc = tl.dot(a, xt, acc)
        if USE_ASM:
            acc = _settled(acc)
    store_split(Y, BIAS, PART, LOCK, tl.trans(acc), offs_m, offs_n, M, N, stride_ym, pid, pid_k, SPLIT_K,
                HAS_BIAS, SPLIT, BLOCK_M, BLOCK_N, BLOCK_M)


def block_k3(p: Packed, block_k: int) -> int:
    """A K step that is whole field blocks (``8R`` codes), at least two word rows, and divides the group."""
    fb = p.rows_per_block * 8
    bk = max(block_k, fb) // fb * fb
    while bk > fb and p.group % bk:
        bk -= fb
    return bk


def skinny3_reasons(p: Packed, m: int, dtype: torch.dtype, variant: str = "skinny3",
                    capability: tuple[int, int] | None = None) -> list[str]:
    """Why ``skinny3`` (or ``gemm3``, the same kernel over M tiles) cannot run this call ([] when it can);
    ``capability`` is the CUDA device's (None: the interpreter, which runs the plain-Triton twin)."""
    out = []
    if p.bits != 4:
        out.append(f"{p.bits}-bit words ({variant} pairs 4-bit codes)")
    if m > 16 and variant == "skinny3":
        out.append(f"M={m} > 16 (one 16-row activation tile; gemm3 tiles M)")
    if dtype not in (torch.float16, torch.bfloat16):
        out.append(f"activation dtype {dtype} (float16 / bfloat16 only)")
    elif capability is not None and capability < ((9, 0) if dtype == torch.bfloat16 else (8, 0)):
        need = "9.0+ for bfloat16 (sub/mul.bf16x2)" if dtype == torch.bfloat16 else "8.0+"
        out.append(f"compute capability {capability[0]}.{capability[1]} (needs {need})")
    if p.offsets is not None:
        out.append("additive offsets (GGUF minimums, MLX biases): use skinny2")
    if p.rows_per_block < 2 or p.group % (p.rows_per_block * 8):
        out.append(f"field blocks of {p.rows_per_block} word rows (pairs need 2+ rows inside one group)")
    return out


def qmm3(x2: torch.Tensor, p: Packed, cfg: Config, bias: torch.Tensor | None, lock: torch.Tensor | None,
         y: torch.Tensor, use_asm: bool) -> torch.Tensor:
    """Launch ``qmm3_kernel`` (x gathered to sorted order first when the weight is act-order)."""
    from .qmv_tc import capability

    m = x2.shape[0]
    why = skinny3_reasons(p, m, x2.dtype, cfg.variant, capability(x2.device))
    if why:
        raise ValueError(f"{cfg.variant} cannot run this call: " + "; ".join(why))
    x2, kx = sorted_input(x2, p)
    bk = block_k3(p, cfg.block_k)
    bm = 16 if cfg.variant == "skinny3" else cfg.block_m
    tiles = triton.cdiv(m, bm) * triton.cdiv(p.n, cfg.block_n)
    split = cfg.split_k if lock is not None and tiles <= lock.numel() else 1
    part = torch.empty((split, m, p.n), dtype=torch.float32, device=x2.device) if split > 1 else y
    qmm3_kernel[(tiles, split)](
        x2, p.qweight, p.scales, p.zeros if p.zeros is not None else p.scales,
        bias if bias is not None else y, y, part, lock if lock is not None else p.qweight,
        m, p.n, kx, p.kw, p.np, split, x2.stride(0), y.stride(0),
        GS=p.group, R=p.rows_per_block, ZC=p.zero_const, HAS_Z=p.zeros is not None, HAS_BIAS=bias is not None,
        BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=bk, SPLIT=split > 1,
        EVEN_K=kx == p.kp and p.kp % bk == 0, EVEN_N=p.np % cfg.block_n == 0, USE_ASM=use_asm,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return y
