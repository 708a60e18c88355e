"""``benchmarks/e2e_ops.py`` (the fused elementwise launches of ``e2e_decoder.py --fused``) in Triton's interpreter:
each op against the torch expression it replaces, and a ``FusedLayer`` against the unfused ``Layer`` with the same
weights (q/k/v and gate/up concatenated), prefill and a decode step with a KV cache."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.test_benchmarks_smoke import BENCHMARKS, load


@pytest.fixture(scope="module")
def ops():
    pytest.importorskip("triton", reason="triton is not installed: pip install -r requirements/triton-interpret.txt")
    import sys

    sys.path.insert(0, str(BENCHMARKS))  # e2e_decoder imports e2e_ops by name, as the script does
    return load("e2e_ops")


def close(got: torch.Tensor, want: torch.Tensor, tol: float = 1.6e-2) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    err = float((got.double() - want.double()).abs().max() / want.double().abs().max())
    assert err < tol, err


def test_add_rms_norm(ops) -> None:
    gen = torch.Generator().manual_seed(0)
    x, r = (torch.randn(3, 5, 96, generator=gen).bfloat16() for _ in range(2))
    s, h = ops.add_rms_norm(x, r)
    assert torch.equal(s, x + r)  # the residual stream rounded once, as torch's add
    close(h, F.rms_norm(x + r, (96,), eps=1e-5))
    s0, h0 = ops.add_rms_norm(x)
    assert s0.data_ptr() == x.data_ptr()
    close(h0, F.rms_norm(x, (96,), eps=1e-5))


def test_rope_and_silu_mul(ops) -> None:
    gen = torch.Generator().manual_seed(1)
    b, t, hq, hkv, d = 2, 3, 4, 2, 16
    qkv = torch.randn(b, t, (hq + 2 * hkv) * d, generator=gen).bfloat16()
    ang = torch.randn(t, d // 2, generator=gen)
    cos, sin = torch.cat((ang, ang), -1).cos().bfloat16(), torch.cat((ang, ang), -1).sin().bfloat16()
    e2e = load("e2e_decoder")
    want = qkv.clone()
    heads = want[..., :(hq + hkv) * d].view(b, t, hq + hkv, d)
    heads.copy_(e2e.rotate(heads.transpose(1, 2), cos, sin).transpose(1, 2))
    got = ops.rope_qk_(qkv.clone(), cos, sin, hq, hkv, d)
    close(got, want)
    assert torch.equal(got[..., (hq + hkv) * d:], qkv[..., (hq + hkv) * d:])  # v untouched
    gu = torch.randn(5, 2 * 300, generator=gen).bfloat16()
    close(ops.silu_mul(gu), F.silu(gu[:, :300]) * gu[:, 300:])
    with pytest.raises(ValueError, match=r"qkv: expected a contiguous \[B, T, 128\] tensor"):
        ops.rope_qk_(qkv[..., :100], cos, sin, hq, hkv, d)


def test_fused_layer_matches_the_unfused_one(ops) -> None:
    e2e = load("e2e_decoder")
    s = e2e.SMALL
    gen = torch.Generator().manual_seed(2)

    def lin(k: int, n: int) -> nn.Linear:
        layer = nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        return layer

    plain = {name: lin(k, n) for name, (k, n) in s.projections().items()}
    fused = {name: lin(k, n) for name, (k, n) in s.projections(fused=True).items()}
    with torch.no_grad():
        fused["qkv"].weight.copy_(torch.cat([plain[p].weight for p in ("q", "k", "v")]))
        fused["gate_up"].weight.copy_(torch.cat([plain["gate"].weight, plain["up"].weight]))
        for name in ("o", "down"):
            fused[name].weight.copy_(plain[name].weight)
    a, b = e2e.Layer(s, plain), e2e.FusedLayer(s, fused)
    t, ctx = 6, 8
    x = torch.randn(1, t, s.hidden, generator=gen).bfloat16()
    cos, sin = e2e.rope(s, torch.arange(t))
    with torch.inference_mode():
        want = a(x, cos, sin, None, None)
        got, h = b(x, ops.add_rms_norm(x)[1], cos, sin, None, None)
        close(got, want, 3e-2)
        close(h, F.rms_norm(want, (s.hidden,), eps=1e-5), 3e-2)
        kv = tuple(torch.randn(1, s.kv_heads, ctx, s.head_dim, generator=gen).bfloat16() for _ in range(2))
        caches = [tuple(c.clone() for c in kv) for _ in range(2)]  # the same cache for both layers
        pos = torch.tensor([ctx - 1])
        cos1, sin1 = e2e.rope(s, pos)
        x1 = x[:, :1]
        want = a(x1, cos1, sin1, caches[0], pos)
        got, _ = b(x1, ops.add_rms_norm(x1)[1], cos1, sin1, caches[1], pos)
        close(got, want, 3e-2)
        assert torch.allclose(caches[0][0].float(), caches[1][0].float(), atol=3e-2, rtol=3e-2)  # the same keys
