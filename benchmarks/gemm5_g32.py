"""gemm5 on layouts it newly takes, against what those layers ran before, and bf16.

    python3 benchmarks/gemm5_g32.py [--shapes 4096x14336,14336x4096] [--ms 16,32,64,128,256,1024,4096]
    python3 benchmarks/gemm5_g32.py --bits 8 --group 128    # 8-bit words (fragment8.py); --group 32: Q8_0's form

GPTQ 4-bit g32 by default (x in fragment order, ``triton/fragment.py``; symmetric, and asymmetric with a zeros
tensor), bfloat16. Per M: bf16 cuBLAS, gemm5 forced, the
variant the shipped table and crossovers pick with gemm5 left out (the route before gemm5 took groups of 32) and
the default config (what a layer runs now). Every kernel's output is checked against float64 first (relative
error 1e-2, bfloat16); a failure prints FAIL and the cell reads nan. Method as ``gpu_linear.py``: weight copies past
4x L2, one CUDA graph per point, median of replays (``--bits``/``--group``: other layouts).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, copies, our_fns, timed
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.fragment_order import MAX_M
from qlinear.kernels.triton.layout import Packed, build
from qlinear.kernels.triton_gptq import fitted_config

TOL = 1e-2


def g32_weight(k: int, n: int, asym: bool, gen: torch.Generator, bits: int = 4,
               group: int = 32) -> tuple[Packed, torch.Tensor]:
    """A random layer and its float64 weight ``[N, K]`` (scales as float16 checkpoints hold them)."""
    g = k // group
    codes = torch.randint(0, 1 << bits, (n, k), device=DEV, dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, g, device=DEV, generator=gen) * 0.02 + 0.002).half().float()
    zeros = (torch.randint(0, 1 << bits, (n, g), device=DEV, generator=gen) if asym
             else torch.full((n, g), 1 << (bits - 1), device=DEV))
    g_idx = torch.arange(k, device=DEV) // group
    w64 = scales.double()[:, g_idx] * (codes.double() - zeros.double()[:, g_idx])
    return build(codes, scales, zeros.int(), g_idx, bits), w64


def config(p: Packed, m: int, variant: str | None = None, exclude: tuple[str, ...] = ()) -> Config:
    """What a bfloat16 layer on this layout runs (``triton_gptq.fitted_config``: unfit variants left out)."""
    return fitted_config(p, m, torch.bfloat16, DEV, variant, exclude)


def checked_us(p: Packed, cfg: Config, x: torch.Tensor, want: torch.Tensor, what: str) -> float:
    fns = our_fns(p, copies(p.qweight.numel() * 4 + p.scales.numel() * 2), cfg)
    err = float((fns[0](x).double() - want).norm() / want.norm())
    if err > TOL:
        print(f"FAIL {what} {cfg}: relative error {err:.2e}", flush=True)
        return float("nan")
    return timed(fns, x, 20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--ms", default="16,32,64,128,256,1024,4096")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group", type=int, default=32)
    a = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; {a.bits}-bit g{a.group}\n")
    print("| K x N | zeros | M | bf16 us | gemm5 us (vs bf16) | before: variant us (vs bf16) | default: variant us |\n"
          "| --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for shape in a.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        dense = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16) for _ in range(copies(2 * n * k))]
        for asym in (False, True):
            p, w64 = g32_weight(k, n, asym, gen, a.bits, a.group)
            for m in (int(v) for v in a.ms.split(",")):
                x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
                want = x.double() @ w64.t()
                t_bf16 = timed([lambda x, w=w: torch.nn.functional.linear(x, w) for w in dense], x, 20)
                c5, old, now = config(p, m, "gemm5"), config(p, m, exclude=("gemm5",)), config(p, m)
                fits = m <= MAX_M or p.xorder is None  # above it gemm5 refuses 4-bit groups of 32
                t5 = checked_us(p, c5, x, want, f"{shape} M={m} gemm5") if fits else float("nan")
                t_old = checked_us(p, old, x, want, f"{shape} M={m} {old.variant}")
                what = f"{shape} M={m} default {now.variant}"
                t_now = t5 if fits and now == c5 else checked_us(p, now, x, want, what)
                print(f"| {shape} | {'asym' if asym else 'sym'} | {m} | {t_bf16:.1f} | {t5:.1f} ({t_bf16 / t5:.2f}x) | "
                      f"{old.variant} {t_old:.1f} ({t_bf16 / t_old:.2f}x) | {now.variant} {t_now:.1f} |", flush=True)
        del dense
    return 0


if __name__ == "__main__":
    sys.exit(main())
