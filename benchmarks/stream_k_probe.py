"""Where gemm5's stream-K grid loses time: the same tiles on four schedules, side by side in one run.

    python3 benchmarks/stream_k_probe.py [--reps 20] [--cases all|first]

Schedules: ``plain`` (one CTA a tile, the shipped grid), ``persistent`` (the stream-K kernel given one CTA a tile:
its loop, epilogue-in-partition and ring carried across pieces, but no cut tiles), ``stream-k`` (every tile's K
steps shared evenly by as many CTAs as fit at once) and ``hybrid`` (whole-tile waves first, stream-K over the last
one to two waves of tiles: ``qmm5_sk.data_parallel_waves``). ``plain`` against ``persistent`` isolates the cost of
the kernel's structure, ``persistent`` against the other two the cost of the schedule. Each output is checked
against a float reference (and two calls bit-identical) before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, copies, our_weight
from mid_m_sweep import checked
from qlinear.kernels.triton import qmm5_sk
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.dequant import dense_t

#: (K, N, M, (block_m, block_n, block_k, warps, stages, register cap)) where the plain grid's last wave is part-full
CASES = (
    (4096, 14336, 128, (64, 64, 64, 4, 6, 128)),
    (14336, 4096, 128, (64, 64, 64, 4, 6, 128)),
    (8192, 28672, 128, (128, 128, 64, 8, 6, 0)),
    (8192, 28672, 256, (128, 128, 64, 8, 6, 0)),
    (4096, 14336, 1024, (128, 128, 64, 8, 6, 0)),
    (4096, 14336, 1024, (256, 128, 64, 8, 4, 0)),
    (8192, 28672, 1024, (256, 128, 64, 8, 4, 0)),
)


def schedules(tiles: int, sms: int, cfg: Config) -> dict[str, tuple[Config, int | None, int | None]]:
    """Schedule name -> (config, grid, data-parallel waves) for ``launch_sk`` (None: its own choice)."""
    sk = replace(cfg, stream_k=True)
    return {"plain": (cfg, None, None), "persistent": (sk, tiles, 1), "stream-k": (sk, None, 0),
            "hybrid": (sk, None, None)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cases", choices=("all", "first"), default="all")
    ap.add_argument("--once", action="store_true", help="run each schedule once per case, untimed (under ncu)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels")
        return 2
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}; "
          f"us, median of {args.reps} graph replays; {sms} SMs\n")
    print("| K x N | M | tile | tiles | plain | persistent | stream-k | hybrid |")
    print("| --- " * 8 + "|")
    gen = torch.Generator(device=DEV).manual_seed(5)
    original = qmm5_sk.launch_sk
    weights: dict[tuple[int, int], tuple] = {}
    for k, n, m, (bm, bn, bk, wp, st, cap) in CASES[: 1 if args.cases == "first" else None]:
        if (k, n) not in weights:
            p = our_weight(k, n, 4, gen)
            weights[(k, n)] = (p, copies(p.qweight.numel() * 4), dense_t(p, torch.float32))
        p, r, w = weights[(k, n)]
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        ref = x.float() @ w
        cfg = Config("gemm5", bm, bn, bk, 1, wp, st, max_registers=cap)
        tiles = -(-m // bm) * -(-n // bn)
        row = []
        for _name, (c, grid, waves) in schedules(tiles, sms, cfg).items():
            def launch(*a, grid=grid, waves=waves, **kw):
                return original(*a, **kw, grid=grid, waves=waves)
            qmm5_sk.launch_sk = launch
            try:
                if args.once:
                    from gpu_linear import our_fns

                    our_fns(p, 1, c)[0](x)
                    torch.cuda.synchronize()
                    continue
                us = checked(p, r, c, x, ref, args.reps)
            finally:
                qmm5_sk.launch_sk = original
            row.append("-" if us is None else f"{us:.1f}")
        cap_s = f" r{cap}" if cap else ""
        print(f"| {k}x{n} | {m} | {bm}x{bn}x{bk} w{wp} st{st}{cap_s} | {tiles} | " + " | ".join(row) + " |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
