"""A Llama-3-8B-shaped decoder end to end on one GPU: time per output token and prefill tokens/s, per weight format.

    python benchmarks/e2e_decoder.py                          # the table on the H200 (32 layers, real shapes)
    python benchmarks/e2e_decoder.py --small --device cpu     # smoke test of the model code (tiny, no graphs)

The model: 32 decoder layers of Llama-3-8B's shapes (hidden 4096, 32 query heads and 8 KV heads of 128, MLP 14336,
separate q/k/v/o/gate/up/down projections as Hugging Face's LlamaForCausalLM has them), RMSNorm, rotary
embeddings, bf16 attention through torch's SDPA (grouped-query), a bf16 LM head of 128256 rows. Decode: one new
token per sequence against a KV cache of ``--ctx`` positions, the whole step (32 layers and the head) captured
in one CUDA graph and replayed; the median replay is the time per step (each sequence of the batch gets one output
token per step, so at batch 1 it is the time per output token). Prefill: ``--prefill`` tokens of
one sequence with causal attention, also a graph; tokens/s = tokens / median time.

Each linear's weight is random and quantized with qlinear (``quantize_rtn``, 4-bit or 8-bit, group 128,
symmetric; GGUF Q4_K: random blocks with small finite scales, since the K-quant search would take minutes per
layer), built through ``create_layer`` with backend AUTO (or the named one) like a user's layer, and checked
against a float64 product of its own dequantized weight before timing. Every layer holds its own copy of the
weights, so the step streams the whole model from HBM as a real one does. Contenders: bf16 ``nn.Linear``, GPTQ
4-bit, 8-bit, GGUF Q4_K, and GPTQ 4-bit on vLLM's Marlin ops (``.peers/``, see gpu_peers.py; skipped with the
reason when absent).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import qlinear
from gpu_report import say
from qlinear.build import create_layer

BF16 = torch.bfloat16


@dataclass(frozen=True)
class Shape:
    """A Llama-style decoder's sizes."""

    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    mlp: int = 14336
    vocab: int = 128256

    def projections(self, fused: bool = False) -> dict[str, tuple[int, int]]:
        """name -> (in_features, out_features); ``fused``: q/k/v and gate/up as one projection each (vLLM's
        ``qkv_proj`` and ``gate_up_proj``: the same weights concatenated along N, quantized row by row alike)."""
        h, q, kv, m = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.mlp
        if fused:
            return {"qkv": (h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * m), "down": (m, h)}
        return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, m), "up": (h, m), "down": (m, h)}


SMALL = Shape(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, mlp=512, vocab=1000)
Factory = Callable[[int, int, torch.device], nn.Module]


def dense(k: int, n: int, dev: torch.device) -> nn.Module:
    lin = nn.Linear(k, n, bias=False, device=dev, dtype=BF16)
    nn.init.normal_(lin.weight, std=0.02)
    return lin


def affine(bits: int, backend: str) -> Factory:
    def make(k: int, n: int, dev: torch.device) -> nn.Module:
        w = torch.randn(n, k, device=dev) * 0.02
        q = qlinear.quantize_rtn(w, bits=bits, group_size=128, sym=True)
        q = qlinear.AffineWeight(q.codes.cpu(), q.scales.cpu(), q.zeros.cpu(), q.g_idx.cpu(), bits, 128, True)
        return create_layer(q, format="gptq_v2", backend=backend, device=dev, dtype=BF16)
    return make


def gguf(qtype: str) -> Factory:
    def make(k: int, n: int, dev: torch.device) -> nn.Module:
        from gguf_linear import random_blocks
        from qlinear.caps import Problem
        from qlinear.layouts import gguf as G
        from qlinear.target import Target

        scheme = G.scheme_for(qtype, k, n)
        choice = qlinear.select(Problem(scheme, BF16), Target.here(str(dev)))
        lay = choice.kernel(scheme, dtype=BF16).to(dev)
        lay.load_blocks(random_blocks(qtype, n, k, str(dev)), share=True)
        lay.prepare()
        lay.choice = choice
        return lay
    return make


@torch.no_grad()
def reference_error(lay: nn.Module, k: int, dev: torch.device) -> float:
    """Relative error of the layer's product against float64 of its own dequantized weight (M = 3)."""
    x = torch.randn(3, k, device=dev, dtype=BF16)
    w = lay.weight.double() if isinstance(lay, nn.Linear) else lay.dequantize(torch.float64).to(dev)
    want = x.double() @ w.t()
    got = lay(x).double()
    return float((got - want).norm() / want.norm())


class Layer(nn.Module):
    """One decoder layer; the linears are whatever the factory built."""

    def __init__(self, s: Shape, linears: dict[str, nn.Module]) -> None:
        super().__init__()
        self.s = s
        self.proj = nn.ModuleDict(linears)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: tuple[torch.Tensor, ...] | None,
                pos: torch.Tensor | None) -> torch.Tensor:
        s, p = self.s, self.proj
        b, t, _ = x.shape
        h = F.rms_norm(x, (s.hidden,), eps=1e-5)
        q = p["q"](h).view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = p["k"](h).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = p["v"](h).view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if cache is None:  # prefill: causal attention over the new tokens
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:  # decode: write this step's key and value at ``pos``, attend over the whole cache
            kc, vc = cache
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        x = x + p["o"](a.transpose(1, 2).reshape(b, t, -1))
        h = F.rms_norm(x, (s.hidden,), eps=1e-5)
        return x + p["down"](F.silu(p["gate"](h)) * p["up"](h))


class FusedLayer(nn.Module):
    """One decoder layer as a serving engine runs it: fused qkv and gate_up projections, the residual add fused with
    the next RMSNorm, rotary in place and SiLU-times-up as one launch each (``e2e_ops.py``). Takes the residual
    stream and its normalised form; returns both for the next layer."""

    def __init__(self, s: Shape, linears: dict[str, nn.Module]) -> None:
        super().__init__()
        self.s = s
        self.proj = nn.ModuleDict(linears)

    def forward(self, x: torch.Tensor, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: tuple[torch.Tensor, ...] | None, pos: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        from e2e_ops import add_rms_norm, rope_qk_, silu_mul

        s, p = self.s, self.proj
        b, t, _ = x.shape
        qkv = rope_qk_(p["qkv"](h), cos, sin, s.heads, s.kv_heads, s.head_dim)
        nq, nkv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        q = qkv[..., :nq].view(b, t, s.heads, s.head_dim).transpose(1, 2)
        k = qkv[..., nq:nq + nkv].view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        v = qkv[..., nq + nkv:].view(b, t, s.kv_heads, s.head_dim).transpose(1, 2)
        if cache is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            kc, vc = cache
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        x, h = add_rms_norm(x, p["o"](a.transpose(1, 2).reshape(b, t, -1)))
        return add_rms_norm(x, p["down"](silu_mul(p["gate_up"](h))))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos + rot * sin


class Decoder(nn.Module):
    def __init__(self, s: Shape, make: Factory, dev: torch.device, fused: bool = False) -> None:
        super().__init__()
        self.s, self.fused = s, fused
        shapes = s.projections(fused)
        protos = {name: make(k, n, dev) for name, (k, n) in shapes.items()}
        self.errors = {name: reference_error(lay, shapes[name][0], dev) for name, lay in protos.items()}
        self.kernels = {name: type(lay).__name__ for name, lay in protos.items()}
        kind = FusedLayer if fused else Layer
        self.layers = nn.ModuleList(kind(s, {n: copy.deepcopy(lay) for n, lay in protos.items()})
                                    for _ in range(s.layers))
        self.head = dense(s.hidden, s.vocab, dev)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                caches: list[tuple[torch.Tensor, torch.Tensor]] | None, pos: torch.Tensor | None) -> torch.Tensor:
        if self.fused:
            from e2e_ops import add_rms_norm

            x, h = add_rms_norm(x)
            for i, layer in enumerate(self.layers):
                x, h = layer(x, h, cos, sin, None if caches is None else caches[i], pos)
            return self.head(h[:, -1])
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if caches is None else caches[i], pos)
        return self.head(F.rms_norm(x[:, -1], (self.s.hidden,), eps=1e-5))


def rope(s: Shape, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (500000.0 ** (torch.arange(0, s.head_dim, 2, device=positions.device).float() / s.head_dim))
    ang = positions.float()[:, None] * inv[None]
    ang = torch.cat((ang, ang), -1)
    return ang.cos().to(BF16), ang.sin().to(BF16)


def timed(fn: Callable[[], object], dev: torch.device, reps: int) -> float:
    """Median ms of ``fn``: replays of one CUDA graph on a GPU, plain calls elsewhere."""
    fn()
    if dev.type != "cuda":
        import time

        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure(model: Decoder, dev: torch.device, batches: list[int], ctx: int, prefill: int, reps: int
            ) -> dict[str, float]:
    s = model.s
    out: dict[str, float] = {}
    with torch.inference_mode():
        for b in batches:
            caches = [(torch.randn(b, s.kv_heads, ctx, s.head_dim, device=dev, dtype=BF16),
                       torch.randn(b, s.kv_heads, ctx, s.head_dim, device=dev, dtype=BF16)) for _ in range(s.layers)]
            pos = torch.tensor([ctx - 1], device=dev)
            cos, sin = rope(s, pos)
            x = torch.randn(b, 1, s.hidden, device=dev, dtype=BF16)
            out[f"decode b={b}"] = timed(lambda x=x, c=caches, p=pos, cs=cos, sn=sin: model(x, cs, sn, c, p), dev, reps)
            del caches
        if prefill:
            cos, sin = rope(s, torch.arange(prefill, device=dev))
            x = torch.randn(1, prefill, s.hidden, device=dev, dtype=BF16)
            out["prefill"] = timed(lambda: model(x, cos, sin, None, None), dev, max(3, reps // 4))
    return out


VARIANTS: dict[str, tuple[str, Factory | None]] = {
    "bf16": ("bf16 nn.Linear", dense),
    "gptq4": ("GPTQ 4-bit g128 (AUTO)", affine(4, "auto")),
    "int8": ("GPTQ 8-bit g128 (AUTO)", affine(8, "auto")),
    "q4_k": ("GGUF Q4_K (AUTO)", gguf("Q4_K")),
    "q8_0": ("GGUF Q8_0 (AUTO)", gguf("Q8_0")),
    "marlin": ("GPTQ 4-bit g128 on vLLM Marlin", affine(4, "gptq_marlin")),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--ctx", type=int, default=1024, help="KV cache positions attended to at each decode step")
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--small", action="store_true", help="a 2-layer toy (smoke test)")
    p.add_argument("--fused", action="store_true", help="fused qkv / gate_up projections and elementwise launches "
                   "(FusedLayer, e2e_ops.py) for every variant")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    s = SMALL if args.small else Shape()
    batches = [int(v) for v in args.batches.split(",")]
    if "marlin" in args.variants:
        from gpu_peers import load_vllm

        why = load_vllm() if dev.type == "cuda" else "needs CUDA"
        if why:
            say(f"marlin: not run ({why})")
            args.variants = ",".join(v for v in args.variants.split(",") if v != "marlin")
    say(f"command: python benchmarks/e2e_decoder.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    say(f"device: {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}, torch {torch.__version__}; "
        f"{s.layers} layers, hidden {s.hidden}, MLP {s.mlp}, ctx {args.ctx}, prefill {args.prefill}"
        + ("; fused qkv / gate_up and elementwise launches" if args.fused else ""))
    results: dict[str, dict[str, float]] = {}
    failed = False
    for name in args.variants.split(","):
        label, make = VARIANTS[name]
        model = Decoder(s, make, dev, fused=args.fused)
        bad = {n: e for n, e in model.errors.items() if not e < 2e-2}
        say(f"{label}: kernels {model.kernels}; max rel err vs float64 {max(model.errors.values()):.1e}"
            + (f" FAIL {bad}" if bad else ""))
        failed |= bool(bad)
        results[label] = measure(model, dev, batches, args.ctx, args.prefill, args.reps)
        say(f"  {results[label]}")
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    table(results, batches, args.prefill)
    return 1 if failed else 0


def table(results: dict[str, dict[str, float]], batches: list[int], prefill: int) -> None:
    base = results.get("bf16 nn.Linear")
    cols = [f"decode b={b}" for b in batches] + (["prefill"] if prefill else [])
    say()
    say("| model | " + " | ".join(f"{c} ms/step" if c != "prefill" else f"prefill {prefill} tok/s" for c in cols)
        + " | " + " | ".join(f"{c} vs bf16" for c in cols) + " |")
    say("| --- " * (1 + 2 * len(cols)) + "|")
    for label, r in results.items():
        vals = [f"{r[c]:.2f}" if c != "prefill" else f"{prefill / r[c] * 1e3:.0f}" for c in cols]
        ratios = [f"{base[c] / r[c]:.2f}x" if base else "-" for c in cols]
        say(f"| {label} | " + " | ".join(vals) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
