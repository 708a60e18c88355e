"""Where gemm5's time over groups of 32 goes: the x gather, the K step, the register cap, against g128.

    python3 benchmarks/gemm5_g32_parts.py [--ms 16,64,256] [--shape 4096x14336]
    ncu --nvtx --nvtx-include "parts/" --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/gemm5_g32_parts.py --profile   # one launch of each, M=64, inside an NVTX range

``gemm5_g32.py`` measured gemm5 on GPTQ g32 about 33 us slower than on g128 at every M from 16 to 256 on
4096x14336 (an H100, 2026-12-06): a cost per K step, not per row. This times the parts side by side (each
checked against float64 first, as ``gemm5_g32.py``): ``fragment_input`` alone, gemm5 at K steps of 64/128
codes (2/4 groups a step), with and without the 128-register cap, and gemm5 on the same weight in groups of
128 with the same configs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemm5_g32 import checked_us, config, g32_weight
from gpu_linear import DEV, timed
from qlinear.kernels.triton.fragment_order import fragment_input
from qlinear.kernels.triton.layout import build


def g128(k: int, n: int, gen: torch.Generator):
    codes = torch.randint(0, 16, (n, k), device=DEV, dtype=torch.uint8, generator=gen)
    scales = (torch.rand(n, k // 128, device=DEV, generator=gen) * 0.02 + 0.002).half().float()
    zeros = torch.full((n, k // 128), 8, device=DEV, dtype=torch.int32)
    g_idx = torch.arange(k, device=DEV) // 128
    w64 = scales.double()[:, g_idx] * (codes.double() - 8)
    return build(codes, scales, zeros, g_idx, 4), w64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", default="16,64,256")
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--profile", action="store_true", help="one launch of each at M=64 in NVTX ranges, no timing")
    a = ap.parse_args()
    k, n = (int(v) for v in a.shape.split("x"))
    gen = torch.Generator(device=DEV).manual_seed(0)
    p32, w32 = g32_weight(k, n, False, gen)
    p128, w128 = g128(k, n, gen)
    if a.profile:
        from qlinear.kernels.triton.qmm import lock_slots, qmm

        lock = torch.zeros(lock_slots(n), dtype=torch.int32, device=DEV)
        x = torch.randn(64, k, device=DEV, dtype=torch.bfloat16)
        for name, p in (("g32", p32), ("g128", p128)):
            cfg = config(p, 64, "gemm5")
            qmm(x, p, cfg, None, lock)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push(f"parts/{name}")
            qmm(x, p, cfg, None, lock)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; {k}x{n}, bfloat16, symmetric\n")
    print("| M | gather us | config | g32 us | g128 us (same config) |\n| --- | --- | --- | --- | --- |", flush=True)
    for m in (int(v) for v in a.ms.split(",")):
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        t_gather = timed([lambda x: fragment_input(x, p32)], x, 50)
        base = config(p32, m, "gemm5")
        tries = [("heuristic", base), ("bk64", replace(base, block_k=64)), ("bk128", replace(base, block_k=128)),
                 ("no cap", replace(base, max_registers=0)),
                 ("bn128 w4", replace(base, block_n=128, num_warps=4))]
        for name, cfg in tries:
            t32 = checked_us(p32, cfg, x, x.double() @ w32.t(), f"g32 M={m} {name}")
            t128 = checked_us(p128, cfg, x, x.double() @ w128.t(), f"g128 M={m} {name}")
            print(f"| {m} | {t_gather:.1f} | {name}: {cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.split_k} "
                  f"w{cfg.num_warps} st{cfg.num_stages} r{cfg.max_registers} | {t32:.1f} | {t128:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
