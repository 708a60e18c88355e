"""gemm5's split last wave (``Config.tail_split``) against the same config without it, and bf16 cuBLAS, side by
side in one run; only the calls where ``qmm5.wave_tail`` cuts anything.

    python3 benchmarks/wave_tail.py [--shapes 4096x14336,...] [--m 512,1024,2048,4096] [--json out]

For each shape and M: the shipped gemm5 config without a tail split, with the last wave's columns split 2 and 3
ways, and bf16 ``F.linear``. Every output is checked against a float reference first (two calls bit-identical);
weights rotate over copies totalling > 4x L2; CUDA-graph replay; median. ``--json`` writes the faster of each
key's configs as a table entry for ``merge_table.py``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, config, copies, gptq_qweight, our_weight, timed
from gpu_peers import PEERS
from mid_m_sweep import checked, entry, write_entries
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.dequant import dense_t
from qlinear.kernels.triton.qmm5 import resident, wave_tail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,8192x28672,14336x4096,4096x4096")
    ap.add_argument("--m", default="512,1024,2048,4096")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", help="write each timed key's fastest config (table entries, with us)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels")
        return 2
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}; "
          f"us, median of {args.reps} graph replays; {sms} SMs\n")
    print("| K x N | M | config | tiles (SM slots) | tail columns 2 / 3 ways | bf16 | no tail | tail 2 | tail 3 | "
          "best vs no tail | best vs bf16 |")
    print("| --- " * 11 + "|")
    gen = torch.Generator(device=DEV).manual_seed(11)
    found: dict[str, dict[str, object]] = {}
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        p = our_weight(k, n, 4, gen)
        r = copies(p.qweight.numel() * 4)
        w = dense_t(p, torch.float32)
        bf16 = [PEERS["bf16"](gptq_qweight(p), p.scales[:, :n].clone()) for _ in range(copies(k * n * 2))]
        for m in [int(v) for v in args.m.split(",")]:
            base = replace(config(p, m, "gemm5"), tail_split=1)
            if base.split_k > 1:
                continue
            tm, tn = -(-m // base.block_m), -(-n // base.block_n)
            slots = sms * resident(base, base.block_k, p)
            cuts = {s: wave_tail(tm, tn, slots, s) for s in (2, 3)}
            if not any(cuts.values()):
                continue
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            ref = x.float() @ w
            t_bf16 = timed(bf16, x, args.reps)
            times = {1: checked(p, r, base, x, ref, args.reps)}
            for s, cut in cuts.items():
                times[s] = checked(p, r, replace(base, tail_split=s), x, ref, args.reps) if cut else None
            ran = {s: t for s, t in times.items() if t is not None}
            if 1 not in ran:
                continue
            best = min(ran, key=ran.__getitem__)
            f = lambda t: "-" if t is None else f"{t:.1f}"  # noqa: E731
            tile = f"{base.block_m}x{base.block_n}x{base.block_k} w{base.num_warps} st{base.num_stages}"
            print(f"| {k}x{n} | {m} | {tile} | {tm * tn} ({slots}) | {cuts[2]} / {cuts[3]} | {t_bf16:.1f} | "
                  f"{f(times[1])} | {f(times[2])} | {f(times[3])} | {times[1] / ran[best]:.2f}x | "
                  f"{t_bf16 / ran[best]:.2f}x |", flush=True)
            found[configs.table_key("gemm5", m, n, k, 4, p.group)] = entry(replace(base, tail_split=best), ran[best])
        del p, w, bf16
        torch.cuda.empty_cache()
    write_entries(args.json, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
