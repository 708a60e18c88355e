"""gemm6 (the dequantization on a transform warpgroup, ``triton/qmm6.py``) against the layer's own choice (gemm5
up to M = 4096, dense above) and bf16 cuBLAS at large M, side by side in one run.

    PYTHONPATH=src python benchmarks/gemm6_bigm.py [--shapes 4096x14336,...] [--ms 1024,4096,16384] [--reps 10]

Every gemm6 config is checked before it is timed: relative error against the float32 product of the same weight
under 1e-2, two calls bit-identical, and its largest difference from the layer's own output reported (gemm5
dequantizes to the same bf16 values; wgmma from shared memory instead of registers). Times: median of CUDA-graph
replays, weights rotated over copies exceeding 4x L2. Ratios: bf16 time / ours (above 1: faster).
``$OUT`` (a directory), when set, receives the report as ``gemm6_bigm.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, config, copies, gptq_qweight, our_fns, our_weight, timed
from gpu_peers import PEERS
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.dequant import dense_t

#: (block_m, block_n, block_k, consumer warps, stages, dequantized tiles in flight)
TILES = ((256, 128, 64, 8, 4, 2), (256, 128, 64, 8, 4, 3), (128, 256, 64, 8, 4, 2), (128, 256, 64, 8, 3, 3),
         (128, 128, 64, 8, 4, 2), (128, 128, 64, 4, 4, 2))


def check(p, r: int, cfg: Config, x: torch.Tensor, ref: torch.Tensor, own: torch.Tensor) -> tuple[list, str]:
    """The config's per-copy functions and a note, or ([], why it failed)."""
    try:
        fns = our_fns(p, r, cfg)
        y = fns[0](x)
        torch.cuda.synchronize()
    except Exception as err:  # a tile the kernel cannot take (shared memory, registers): report, go on
        return [], f"{type(err).__name__}: {str(err)[:200]}"
    if not torch.equal(y, fns[0](x)):
        return [], "RACE: two calls differ"
    err = float((y.float() - ref).norm() / ref.norm())
    diff = float((y.float() - own.float()).abs().max())
    if not err < 1e-2:
        return [], f"MISMATCH rel {err:.1e}"
    return fns, f"rel {err:.1e}, max |ours - layer| {diff:.2e}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,14336x4096,8192x28672,4096x4096")
    ap.add_argument("--ms", default="1024,4096,16384")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget", type=float, default=400, help="seconds after which no new shape starts")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script times GPU kernels")
        return 2
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {__import__('triton').__version__}; "
             f"us, median of {args.reps} graph replays; GPTQ 4-bit g128 symmetric", "",
             "| K x N | M | bf16 | layer (variant) | gemm6 best | config | vs bf16 | vs layer | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    gen = torch.Generator(device=DEV).manual_seed(6)
    t0 = time.time()
    for shape in args.shapes.split(","):
        if time.time() - t0 > args.budget:
            lines.append(f"<!-- {shape} not run: over the budget -->")
            continue
        k, n = (int(v) for v in shape.split("x"))
        p = our_weight(k, n, 4, gen)
        r = copies(p.qweight.numel() * 4)
        w = dense_t(p, torch.float32)
        bf16 = [PEERS["bf16"](gptq_qweight(p), p.scales[:, :n].clone()) for _ in range(copies(k * n * 2))]
        for m in (int(v) for v in args.ms.split(",")):
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            ref = x.float() @ w
            t_bf16 = timed(bf16, x, args.reps)
            own_cfg = config(p, m)
            own_fns = our_fns(p, r, own_cfg)
            own = own_fns[0](x)
            t_own = timed(own_fns, x, args.reps)
            results = []
            for bm, bn, bk, wp, st, ws in TILES:
                cfg = Config("gemm6", bm, bn, bk, 1, wp, st, w_stages=ws)
                fns, note = check(p, r, cfg, x, ref, own)
                if not fns:
                    lines.append(f"<!-- {k}x{n} M={m} {bm}x{bn}x{bk} w{wp} st{st} ws{ws}: {note} -->")
                    print(lines[-1], flush=True)
                    continue
                results.append((timed(fns, x, args.reps), f"{bm}x{bn}x{bk} w{wp} st{st} ws{ws}", note))
                del fns
            results.sort()
            if not results:
                lines.append(f"| {k}x{n} | {m} | {t_bf16:.1f} | {t_own:.1f} ({own_cfg.variant}) | - | none ran |")
            else:
                us, name, note = results[0]
                others = "; ".join(f"{u:.1f} {c}" for u, c, _ in results[1:])
                lines.append(f"| {k}x{n} | {m} | {t_bf16:.1f} | {t_own:.1f} ({own_cfg.variant}) | {us:.1f} | {name} "
                             f"| {t_bf16 / us:.2f}x | {t_own / us:.2f}x | {note} |")
                lines.append(f"<!-- others: {others} -->")
            print("\n".join(lines[-2:]), flush=True)
            del x, ref, own, own_fns
            torch.cuda.empty_cache()
        del p, w, bf16
        torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gemm6_bigm.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
