"""Where a decode step of ``e2e_decoder.py``'s model spends its GPU time: every kernel of one step, summed by name.

    python benchmarks/e2e_profile.py --variants bf16,gptq4 --batch 1

The step runs eagerly under ``torch.profiler`` (CUDA activity), after a warm-up step, so each kernel's duration is
the one the CUDA graph of ``e2e_decoder.py`` replays; launch gaps, which the graph removes, are not counted. The
report lists the kernels by total time per step and groups them: qlinear's quantized products, cuBLAS (bf16 linears
and the LM head), attention, and everything else (norms, rotary, SiLU, adds, cache writes). ``$OUT``, when set,
receives it as ``e2e_profile.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_decoder import BF16, VARIANTS, Decoder, Shape, rope
from gpu_report import run, say

#: kernel-name fragments -> group (first match wins)
GROUPS = (("attention", ("flash", "fmha", "attention", "sdpa")), ("cuBLAS", ("gemm", "nvjet", "xmma", "cutlass")),
          ("qlinear", ("qmm", "qmv", "gemv", "gguf", "dot_kernel", "dequant_kernel", "dense_kernel", "lut4",
                       "quant_row", "w8_", "w4afp8", "qqq")))


def group_of(name: str) -> str:
    low = name.lower()
    return next((g for g, keys in GROUPS if any(k in low for k in keys)), "other")


def kernel_times(model: Decoder, batch: int, ctx: int) -> dict[str, tuple[float, int]]:
    """kernel name -> (us per step, launches per step) for one eager decode step."""
    from torch.profiler import ProfilerActivity, profile

    s, dev = model.s, torch.device("cuda")
    caches = [(torch.randn(batch, s.kv_heads, ctx, s.head_dim, device=dev, dtype=BF16),
               torch.randn(batch, s.kv_heads, ctx, s.head_dim, device=dev, dtype=BF16)) for _ in range(s.layers)]
    pos = torch.tensor([ctx - 1], device=dev)
    cos, sin = rope(s, pos)
    x = torch.randn(batch, 1, s.hidden, device=dev, dtype=BF16)
    with torch.inference_mode():
        model(x, cos, sin, caches, pos)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(x, cos, sin, caches, pos)
            torch.cuda.synchronize()
    out: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name][0] += e.time_range.elapsed_us()
            out[e.name][1] += 1
    return {k: (v[0], int(v[1])) for k, v in out.items()}


def report(label: str, times: dict[str, tuple[float, int]], top: int) -> None:
    total = sum(t for t, _ in times.values())
    groups: dict[str, float] = defaultdict(float)
    for name, (t, _) in times.items():
        groups[group_of(name)] += t
    say(f"## {label}: {total / 1e3:.2f} ms of kernels per step")
    say()
    say("| group | ms | share |")
    say("|---|---|---|")
    for g, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        say(f"| {g} | {t / 1e3:.3f} | {t / total:.1%} |")
    say()
    say("| kernel | launches | ms | share |")
    say("|---|---|---|---|")
    for name, (t, n) in sorted(times.items(), key=lambda kv: -kv[1][0])[:top]:
        say(f"| `{name[:90]}` | {n} | {t / 1e3:.3f} | {t / total:.1%} |")
    say()


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="bf16,gptq4")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--fused", action="store_true", help="e2e_decoder.FusedLayer: fused projections and elementwise")
    p.add_argument("--out")
    args = p.parse_args(argv)

    def body() -> None:
        s = Shape(layers=args.layers)
        say(f"batch {args.batch}, ctx {args.ctx}, {s.layers} layers of Llama-3-8B's shapes")
        for name in args.variants.split(","):
            label, make = VARIANTS[name]
            model = Decoder(s, make, torch.device("cuda"), fused=args.fused)
            report(f"{label} (kernels {sorted(set(model.kernels.values()))})", kernel_times(model, args.batch,
                                                                                           args.ctx), args.top)
            del model
            torch.cuda.empty_cache()

    return run("e2e_profile", "decode step, kernel by kernel", argv, args.out, body)


if __name__ == "__main__":
    main()
