"""W4AFP8Linear on the GPU: numerics against float64, and side-by-side timing against bf16 cuBLAS, qlinear's own
GPTQ 4-bit W4A16 kernels (``TritonV2Linear``, AUTO's choice) and ``torch._scaled_mm`` (W8A8 FP8, rowwise).

    python3 benchmarks/gpu_w4afp8.py --out benchmarks/results/h200-gpu_w4afp8-<date>.md

Same method as ``gpu_linear.py`` (CUDA graph over weight copies > 4x L2, median of replays, us). The check:
``|y - ref| / |ref|`` with ``ref`` = the float64 product of the returned per-token E4M3 activations and the
dequantized GPTQ weight (plus bias), held to the output dtype's rounding.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = ((4096, 14336), (8192, 28672))
MS = (1, 16, 256, 1024, 4096)


def layers(k: int, n: int, gen: torch.Generator):
    """A random symmetric 4-bit g128 weight (codes and scales drawn directly: fast at 8192x28672) as W4AFP8Linear
    and as the layer AUTO builds for bfloat16 (the W4A16 Triton kernels)."""
    from qlinear import AffineWeight, create_layer

    q = AffineWeight(codes=torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8),
                     scales=torch.rand(n, k // 128, generator=gen) * 0.01 + 0.001,
                     zeros=torch.full((n, k // 128), 8, dtype=torch.int32),
                     g_idx=torch.arange(k, dtype=torch.int32) // 128, bits=4, group_size=128, sym=True)
    fp8 = create_layer(q, backend="gptq_w4afp8", device="cuda", dtype=torch.bfloat16)
    w16 = create_layer(q, backend="auto", device="cuda", dtype=torch.bfloat16)
    return q, fp8, w16


def check(lines: list[str]) -> int:
    from qlinear.kernels.triton.fp8_w8a8 import quantize_fp8_per_token

    failed = 0
    gen = torch.Generator().manual_seed(0)
    for k, n in ((1024, 992), (4096, 512)):  # the declared limits: K % 128, N % 32
        q, fp8, _ = layers(k, n, gen)
        w = q.dequantize(torch.float64).cuda()
        for m in (1, 5, 40, 300, 1100):
            x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
            xq, sx = quantize_fp8_per_token(x)
            ref = (xq.double() * sx.double()[:, None]) @ w.t()
            err = float((fp8(x).double() - ref).norm() / ref.norm())
            ok = err < 1e-2
            failed += not ok
            lines.append(f"| check {k}x{n} M={m} | {err:.1e} | {'pass' if ok else 'FAIL'} |")
    return failed


def main() -> int:
    from gpu_linear import copies, timed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    lines = [f"# W4AFP8 on {torch.cuda.get_device_name()} (torch {torch.__version__})", "",
             "| case | rel err | |", "|---|---|---|"]
    failed = check(lines)
    lines += ["", "| K x N | M | bf16 | _scaled_mm (W8A8) | ours W4A16 (AUTO) | ours W4AFP8 | W4AFP8/bf16 | "
              "W4AFP8/W4A16 | W4AFP8/_scaled_mm |", "|---|---|---|---|---|---|---|---|---|"]
    gen = torch.Generator().manual_seed(1)
    for k, n in SHAPES:
        c = copies(n * k // 2)
        made = [layers(k, n, gen) for _ in range(c)]
        dense = [m[0].dequantize(torch.bfloat16).cuda() for m in made[:copies(n * k * 2)]]
        w8 = [d.to(torch.float8_e4m3fn).t() for d in dense[:copies(n * k)]]
        for m in MS:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            xq = x.to(torch.float8_e4m3fn)
            sa = torch.ones(m, 1, device="cuda")
            sb = torch.ones(1, n, device="cuda")
            t = {"bf16": timed([lambda a, d=d: F.linear(a, d) for d in dense], x, args.reps),
                 "w16": timed([lambda a, lay=lay[2]: lay(a) for lay in made], x, args.reps),
                 "fp8": timed([lambda a, lay=lay[1]: lay(a) for lay in made], x, args.reps)}
            try:
                t["mm"] = timed([lambda a, w=w, xq=xq, sa=sa, sb=sb: torch._scaled_mm(xq, w, sa, sb,
                                                                                      out_dtype=torch.bfloat16)
                                 for w in w8], x, args.reps)
            except RuntimeError:
                t["mm"] = float("nan")
            lines.append(f"| {k}x{n} | {m} | {t['bf16']:.1f} | {t['mm']:.1f} | {t['w16']:.1f} | {t['fp8']:.1f} | "
                         f"{t['fp8'] / t['bf16']:.2f} | {t['fp8'] / t['w16']:.2f} | {t['fp8'] / t['mm']:.2f} |")
            print(lines[-1], flush=True)
    lines.append(f"\n{failed} failed")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
