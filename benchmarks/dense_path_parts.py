"""Where the large-M dense path (dequantize + cuBLAS, ``triton/dequant.py``) spends its time beyond bf16's GEMM.

    PYTHONPATH=src:benchmarks python benchmarks/dense_path_parts.py [--ms 2048,4096] [--reps 20]

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
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import copies, our_weight, timed

DEV = torch.device("cuda")
LINES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def mlx_packed(k: int, n: int, gen: torch.Generator):
    """A random MLX 4-bit g64 layer's runtime layout (bfloat16 scales and biases as offsets), on the GPU."""
    from gpu_mlx import make, random_weight
    from qlinear.kernels.mlx_triton import MlxTritonLinear

    layer = make(MlxTritonLinear, random_weight(n, k, 4, 64, torch.bfloat16, gen), torch.bfloat16).to(DEV)
    layer.ensure_prepared()
    return layer.packed()


def main() -> None:
    from qlinear.kernels.triton.dequant import dense_mm, dense_t

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--ms", default="2048,4096")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    say(f"# Dense path parts on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    say()
    say("command: python benchmarks/dense_path_parts.py " + " ".join(sys.argv[1:]))
    say()
    say("| K x N | M | F.linear W[N,K] | x @ Wt[K,N] | dense_t GPTQ g128 | dense_mm GPTQ | dense_t MLX g64 | "
        "dense_mm MLX |")
    say("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    dgen = torch.Generator(device=DEV).manual_seed(0)
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        c = copies(k * n * 2)
        ws = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=dgen) * 0.02 for _ in range(c)]
        wts = [w.t().contiguous() for w in ws]
        cq = copies(k * n // 2)
        gptq = [our_weight(k, n, 4, dgen) for _ in range(cq)]
        mlx = [mlx_packed(k, n, gen) for _ in range(cq)]
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=dgen)
            row = [timed([lambda x, w=w: torch.nn.functional.linear(x, w) for w in ws], x, args.reps),
                   timed([lambda x, w=w: x @ w for w in wts], x, args.reps)]
            for packs in (gptq, mlx):
                row.append(timed([lambda x, p=p: dense_t(p, x.dtype) for p in packs], x, args.reps))
                row.append(timed([lambda x, p=p: dense_mm(x, p) for p in packs], x, args.reps))
            say(f"| {k}x{n} | {m} | " + " | ".join(f"{t:.1f}" for t in row) + " |")
        del ws, wts, gptq, mlx
        torch.cuda.empty_cache()
    out = os.environ.get("OUT")
    if out:
        Path(out, "dense_path_parts.md").write_text("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
