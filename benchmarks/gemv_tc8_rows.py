"""8-bit decode rows side by side: gemv_tc (its heuristic config, and that config with a 64-register cap) against
the variant and config the device's table ships, on one weight, each checked against float32 before timing.

    python3 benchmarks/gemv_tc8_rows.py [--shapes 4096x14336] [--m 1,2,4,8,16] [--reps 20]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, config, copies, our_fns, our_weight, timed
from qlinear.kernels.triton.dequant import dense_t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336")
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| K x N | M | bf16 us | shipped | shipped us | gemv_tc us | gemv_tc r64 us | bf16 / best tc "
          "| shipped / best tc |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape in a.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        p = our_weight(k, n, 8, gen)
        r = copies(p.qweight.numel() * 4)
        w = dense_t(p, torch.float32)
        wb = [w.t().contiguous().to(torch.bfloat16) for _ in range(copies(k * n * 2))]
        for m in (int(v) for v in a.m.split(",")):
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            ref = x.float() @ w
            cfgs = {"shipped": config(p, m), "tc": config(p, m, "gemv_tc")}
            cfgs["tc64"] = replace(cfgs["tc"], max_registers=64)
            t = {}
            for name, cfg in cfgs.items():
                fns = our_fns(p, r, cfg)
                err = float((fns[0](x).float() - ref).norm() / ref.norm())
                t[name] = timed(fns, x, a.reps) if err < 1e-2 else float("nan")
                if not err < 1e-2:
                    print(f"<!-- WRONG {name} {cfg}: {err:.2e} -->")
            bf = timed([lambda x, q=q: torch.nn.functional.linear(x, q) for q in wb], x, a.reps)
            best = min(t["tc"], t["tc64"])
            s = cfgs["shipped"]
            print(f"| {k}x{n} | {m} | {bf:.1f} | {s.variant} s{s.split_k} | {t['shipped']:.1f} | {t['tc']:.1f} | "
                  f"{t['tc64']:.1f} | {bf / best:.2f}x | {t['shipped'] / best:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
