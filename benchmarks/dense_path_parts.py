"""Where the large-M dense path (dequantize + cuBLAS, ``triton/dequant.py``) spends its time beyond bf16's GEMM.

    PYTHONPATH=src:benchmarks python benchmarks/dense_path_parts.py [--ms 1024,2048,4096] [--reps 20]

At M = 4096 an MLX 4-bit g64 layer on the dense path took 731-756 us against bf16 ``F.linear``'s 605-623 on an
H100 (``results/h100-gpu_mlx-2026-12-07-gemm5.md``), more than its dequantization alone should cost. Timed apart,
each as ``gpu_linear.timed`` (a CUDA graph over weight copies exceeding 4x L2, median per call), bf16 activations:

* ``F.linear(x, W)`` with ``W [N, K]`` (what the bf16 model runs; cuBLAS "TN");
* ``x @ Wt`` with ``Wt [K, N]`` contiguous, the transient's layout (cuBLAS "NN");
* ``dense_t``, the dequantization alone, for a GPTQ g128 layout and an MLX g64 one (offsets);
* ``dense_mm``, the whole path, for both.

The result decides whether the transient should be written ``[N, K]`` (if "NN" is the slower GEMM) or the
dequantization made faster (H100, ``results/h100-dense_path_parts-2026-12-07.md``: the two GEMMs tie and the
dequantization runs near the HBM rate, so neither). ``$OUT`` receives ``dense_path_parts.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, copies, our_weight, timed
from gpu_report import bf16_baseline, parse, parser, run, say

SHAPES = ((4096, 14336), (14336, 4096))
MS = (2048, 4096)


def mlx_packed(k: int, n: int, gen: torch.Generator):
    """A random MLX 4-bit g64 layer's runtime layout (bfloat16 scales and biases as offsets), on the GPU."""
    from gpu_mlx import make, random_weight
    from qlinear.kernels.mlx_triton import MlxTritonLinear

    layer = make(MlxTritonLinear, random_weight(n, k, 4, 64, torch.bfloat16, gen), torch.bfloat16).to(DEV)
    layer.ensure_prepared()
    return layer.packed()


def table(args: argparse.Namespace) -> None:
    from qlinear.kernels.triton.dequant import dense_mm, dense_t

    say("| K x N | M | F.linear W[N,K] | x @ Wt[K,N] | dense_t GPTQ g128 | dense_mm GPTQ | dense_t MLX g64 | "
        "dense_mm MLX |")
    say("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    dgen = torch.Generator(device=DEV).manual_seed(0)
    for k, n in args.shapes:
        linear = bf16_baseline(k, n, dgen)
        wts = [torch.randn(k, n, device=DEV, dtype=torch.bfloat16, generator=dgen) for _ in range(len(linear))]
        transposed = [lambda x, w=w: x @ w for w in wts]
        cq = copies(k * n // 2)
        gptq = [our_weight(k, n, 4, dgen) for _ in range(cq)]
        mlx = [mlx_packed(k, n, gen) for _ in range(cq)]
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=dgen)
            row = [timed(linear, x, args.reps), timed(transposed, x, args.reps)]
            for packs in (gptq, mlx):
                row.append(timed([lambda x, p=p: dense_t(p, x.dtype) for p in packs], x, args.reps))
                row.append(timed([lambda x, p=p: dense_mm(x, p) for p in packs], x, args.reps))
            say(f"| {k}x{n} | {m} | " + " | ".join(f"{t:.1f}" for t in row) + " |")
        del linear, wts, transposed, gptq, mlx
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    args = parse(parser(__doc__, SHAPES, MS, reps=20), argv)
    run("dense_path_parts", "Dense path parts", argv, args.out, lambda: table(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
