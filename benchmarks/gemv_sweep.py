"""GEMV (M=1..2) config sweep on the GPU: tiles, split-K and the next-step word prefetch, side by side.

    python3 benchmarks/gemv_sweep.py [--shapes 4096x4096,...] [--bits 4,8,2] [--m 1] [--reps 20]

Every candidate's output on the first weight copy is compared with a float32 reference before it is
timed (CUDA-graph replay over weight copies totalling > 4x L2, as gpu_linear.py). Prints per shape the
heuristic config's time, the best config with and without prefetch, and JSON entries for tuned_h200.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, SHAPES, config, copies, our_weight, timed
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.dequant import dense_t
from qlinear.kernels.triton.qmm import lock_slots, qmm


def candidates(p, m: int) -> list[Config]:
    pf = 32 // p.bits
    nkb_of = {bk: -(-p.kp // bk) for bk in (4 * pf, 8 * pf, 16 * pf)}
    out = []
    for w in (2, 4, 8):
        for bk, nkb in nkb_of.items():
            if p.group % bk and p.group < p.k:
                continue
            tiles = -(-p.n // (128 * w))
            for split in (1, 2, 4, 8, 16, 32, 64):
                if split > max(1, nkb // 2) or tiles * split > 16 * 132:
                    continue
                out.append(Config("gemv", 1, 128 * w, bk, split, w, 2))
    return out


def setup(k: int, n: int, bits: int, m: int, gen: torch.Generator) -> tuple:
    """A random weight, copies of it totalling > 4x L2, split-K counters, an input and its float32 reference."""
    p = our_weight(k, n, bits, gen)
    r = copies(p.qweight.numel() * 4)
    ps = [p] + [p.with_tensors(qweight=p.qweight.clone(), scales=p.scales.clone()) for _ in range(r - 1)]
    lock = torch.zeros(lock_slots(p.n), dtype=torch.int32, device=DEV)
    x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
    return p, ps, lock, x, (x.float() @ dense_t(p, torch.float32)).float()


def register_caps(k: int, n: int, bits: int, m: int, caps: list[int], reps: int, gen: torch.Generator) -> str:
    """The shipped config (table or heuristic) with ptxas register caps: more resident warps vs spills."""
    p, ps, lock, x, ref = setup(k, n, bits, m, gen)
    cells = []
    for cap in [0, *caps]:
        c = replace(config(p, m, "gemv"), max_registers=cap)
        y = qmm(x, p, c, None, lock).float()
        err = float((y - ref).norm() / ref.norm())
        us = timed([lambda x, q=q, c=c: qmm(x, q, c, None, lock) for q in ps], x, reps)
        cells.append(f"{cap or 'none'}: {us:.1f}{'' if err < 1e-2 else ' WRONG'}")
    return f"| {k}x{n} | {bits} | {m} | " + " | ".join(cells) + " |"


def sweep(k: int, n: int, bits: int, m: int, reps: int, gen: torch.Generator) -> tuple[str, dict, list[str]]:
    p, ps, lock, x, ref = setup(k, n, bits, m, gen)
    base = config(p, m, "gemv")
    rows: list[str] = []
    base_us: dict[bool, float] = {}
    best: dict[bool, tuple[float, Config]] = {}
    for pre in (False, True):
        for i, c in enumerate([base, *candidates(p, m)]):
            c = configs.legal(c, m, p.kp, bits)
            try:
                c = replace(c, prefetch=pre)
                y = qmm(x, p, c, None, lock).float()
                err = float((y - ref).norm() / ref.norm())
                if not err < 1e-2:
                    rows.append(f"<!-- {c} prefetch={pre}: WRONG rel err {err:.2e} -->")
                    continue
                fns = [lambda x, q=q, c=c: qmm(x, q, c, None, lock) for q in ps]
                us = timed(fns, x, reps)
            except Exception as e:
                rows.append(f"<!-- {c} prefetch={pre}: {type(e).__name__}: {str(e)[:80]} -->")
                continue
            if i == 0:
                base_us[pre] = us
            if pre not in best or us < best[pre][0]:
                best[pre] = (us, c)
    head = (f"| {k}x{n} | {bits} | {m} | {base_us[False]:.1f} {fmt(base)} | {base_us[True]:.1f} | "
            f"{best[False][0]:.1f} {fmt(best[False][1])} | {best[True][0]:.1f} {fmt(best[True][1])} |")
    pre = best[True][0] < best[False][0]
    us, c = best[pre]
    key = configs.table_key("gemv", m, n, k, bits, p.group)
    entry = {f: v for f, v in c.as_dict().items() if f != "variant"}
    return head, {key: {**entry, "us": round(us, 2)}}, rows


def fmt(c: Config) -> str:
    return f"{c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--bits", default="4")
    ap.add_argument("--m", default="1")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-registers", default="", help="e.g. 64,80,96: time the table's config under each cap")
    a = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(3)
    if a.max_registers:
        caps = [int(v) for v in a.max_registers.split(",")]
        print(f"{torch.cuda.get_device_name()}; shipped gemv config under register caps (us)\n")
        for bits in (int(b) for b in a.bits.split(",")):
            for s in a.shapes.split(","):
                k, n = (int(v) for v in s.split("x"))
                print(register_caps(k, n, bits, 1, caps, a.reps, gen), flush=True)
        return 0
    print(f"{torch.cuda.get_device_name()}; us per call, median of {a.reps} graph replays; g128\n")
    print("| K x N | bits | M | heuristic | heuristic + prefetch | best | best + prefetch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    found, notes = {}, []
    for bits in (int(b) for b in a.bits.split(",")):
        for s in a.shapes.split(","):
            k, n = (int(v) for v in s.split("x"))
            for m in (int(v) for v in a.m.split(",")):
                head, entry, rows = sweep(k, n, bits, m, a.reps, gen)
                print(head, flush=True)
                found.update(entry)
                notes += rows
    print("\n" + "\n".join(notes[:40]))
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
