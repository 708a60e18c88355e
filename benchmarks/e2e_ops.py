"""The decoder's elementwise steps as one Triton launch each, for ``e2e_decoder.py --fused``: the model as a serving
engine lays it out (vLLM fuses the same steps), so the end-to-end ratio measures the linears rather than ~20 small
torch launches per layer.

* ``add_rms_norm(x, r)``: ``s = x + r`` and ``rms_norm(s)`` (no weight, as the benchmark's model) in one pass;
* ``rope_qk_(qkv, cos, sin, q_heads, kv_heads, head_dim)``: the rotary embedding applied in place to the q and k heads
  of the fused ``qkv`` projection's output (v untouched);
* ``silu_mul(gu)``: ``silu(g) * u`` of the fused ``gate_up`` output ``[.., 2 m]``.

Each is checked against the torch expression it replaces (``tests/test_e2e_ops_interpret.py``, Triton's interpreter).
Arithmetic in float32, one rounding to the activation dtype per output, as torch's own ops on bfloat16 do.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qlinear.kernels.triton.common import to_dtype
from qlinear.kernels.triton.runtime import interpreting


def _rne(t: torch.Tensor) -> bool:
    """Round float32 -> bfloat16 by integer arithmetic (the interpreter truncates; a GPU rounds to nearest even)."""
    return t.dtype == torch.bfloat16 and interpreting()


@triton.jit
def _add_rms_kernel(X, R, S, H, N, eps, HAS_R: tl.constexpr, BLOCK: tl.constexpr, RNE: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    v = tl.load(X + row * N + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_R:
        v = v + tl.load(R + row * N + offs, mask=mask, other=0.0).to(tl.float32)
        v = to_dtype(v, S.dtype.element_ty, RNE)  # the residual stream is stored in the activation dtype
        tl.store(S + row * N + offs, v, mask=mask)
        v = v.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / N + eps)
    tl.store(H + row * N + offs, to_dtype(v * inv, H.dtype.element_ty, RNE), mask=mask)


def add_rms_norm(x: torch.Tensor, r: torch.Tensor | None = None, eps: float = 1e-5
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + r, rms_norm(x + r))`` (``r`` None: ``(x, rms_norm(x))``) over the last dimension."""
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    s = torch.empty_like(x2) if r is not None else x2
    h = torch.empty_like(x2)
    _add_rms_kernel[(x2.shape[0],)](x2, r.reshape(-1, n) if r is not None else x2, s, h, n, eps,
                                    HAS_R=r is not None, BLOCK=triton.next_power_of_2(n), RNE=_rne(x))
    return s.view(x.shape), h.view(x.shape)


@triton.jit
def _rope_kernel(QKV, COS, SIN, ROW, T, HEADS, HALF: tl.constexpr, RNE: tl.constexpr):
    """Program (token, head) over the q and k heads: ``x cos + rotate_half(x) sin`` in place."""
    tok = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, HALF)
    base = QKV + tok * ROW + head * (2 * HALF)
    a = tl.load(base + d).to(tl.float32)
    b = tl.load(base + HALF + d).to(tl.float32)
    pos = tok % T
    c1 = tl.load(COS + pos * (2 * HALF) + d).to(tl.float32)
    c2 = tl.load(COS + pos * (2 * HALF) + HALF + d).to(tl.float32)
    s1 = tl.load(SIN + pos * (2 * HALF) + d).to(tl.float32)
    s2 = tl.load(SIN + pos * (2 * HALF) + HALF + d).to(tl.float32)
    tl.store(base + d, to_dtype(a * c1 - b * s1, QKV.dtype.element_ty, RNE))
    tl.store(base + HALF + d, to_dtype(b * c2 + a * s2, QKV.dtype.element_ty, RNE))


def rope_qk_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_heads: int, kv_heads: int,
             head_dim: int) -> torch.Tensor:
    """Rotate the q and k heads of ``qkv [B, T, (Hq + 2 Hkv) D]`` in place (``cos``/``sin`` ``[T, D]``)."""
    b, t, width = qkv.shape
    if width != (q_heads + 2 * kv_heads) * head_dim or not qkv.is_contiguous():
        raise ValueError(f"qkv: expected a contiguous [B, T, {(q_heads + 2 * kv_heads) * head_dim}] tensor, got "
                         f"{list(qkv.shape)}")
    _rope_kernel[(b * t, q_heads + kv_heads)](qkv, cos.contiguous(), sin.contiguous(), width, t, q_heads + kv_heads,
                                              HALF=head_dim // 2, RNE=_rne(qkv))
    return qkv


@triton.jit
def _silu_mul_kernel(GU, OUT, M, BLOCK: tl.constexpr, RNE: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M
    g = tl.load(GU + row * 2 * M + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + row * 2 * M + M + offs, mask=mask, other=0.0).to(tl.float32)
    silu = to_dtype(g / (1.0 + tl.exp(-g)), OUT.dtype.element_ty, RNE).to(tl.float32)  # torch rounds silu(g) first
    tl.store(OUT + row * M + offs, to_dtype(silu * u, OUT.dtype.element_ty, RNE), mask=mask)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """``silu(gu[..., :m]) * gu[..., m:]`` for ``gu [.., 2 m]``."""
    m = gu.shape[-1] // 2
    g2 = gu.reshape(-1, 2 * m)
    out = torch.empty(g2.shape[0], m, dtype=gu.dtype, device=gu.device)
    block = 1024
    _silu_mul_kernel[(g2.shape[0], triton.cdiv(m, block))](g2, out, m, BLOCK=block, RNE=_rne(gu))
    return out.view(*gu.shape[:-1], m)
