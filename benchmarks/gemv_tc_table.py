"""The shipped ``gemv_tc`` configs re-timed with one knob changed at a time, peers side by side (one run).

    python3 benchmarks/gemv_tc_table.py [--shapes 4096x14336,...] [--bits 4,2] [--m 1,4,8,16] [--reps 20] [--peers]

Why: a sweep over every config takes most of a device call; a change to the kernel that keeps the config
space (the split-K epilogue's registers, the asm's instruction mix) only needs the shipped configs timed
against their neighbours. Per (shape, bits, M): the table's config, the same with the epilogue summing every
row per pass (``sum_values=16``, the old register count), with the other ``stage_x``, and at M > 8 a small
grid of one-program, two-row-set configs (``block_m=16``); each checked against float32 before timing.
Prints a markdown row per case and JSON entries (with ``us``) for the fastest gemv_tc config.
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

from gemv_sweep import setup
from gemv_tc_sweep import best_peer, checked_time, entry, fmt, peer_fns, shape_args
from gpu_linear import DEV, config, timed
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.dequant import dense_t
from qlinear.kernels.triton.qmm import qmm


def neighbours(c: Config, m: int, ck: int) -> list[Config]:
    """The shipped config's one-knob variants (register caps, the epilogue, staging, per-lane parameter vectors,
    half the chunks a step) and at M > 8 a grid of
    one-program, two-row-set configs (``block_m=16``) under register caps (more resident warps)."""
    out = [replace(c, sum_values=16 if c.sum_values != 16 else 4), replace(c, stage_x=not c.stage_x),
           replace(c, vector_params=not c.vector_params)]
    if c.block_k >= 2 * ck:  # half / twice the chunks a step (steps of whole groups vs inside one)
        out.append(replace(c, block_k=c.block_k // 2))
    if c.block_k <= 2 * ck:
        out.append(replace(c, block_k=c.block_k * 2))
    out += [replace(c, max_registers=r) for r in (56, 64, 80) if r != c.max_registers]
    if m > 8:  # (warps along N, chunks per step, register cap)
        for wn, unit, regs in ((4, 1, 56), (4, 1, 64), (4, 1, 72), (4, 1, 80), (2, 1, 64), (2, 1, 72),
                               (4, 2, 72), (4, 2, 80), (2, 2, 80), (2, 2, 0), (8, 1, 72), (8, 1, 64)):
            out.append(replace(c, block_m=16, block_n=32 * wn, num_warps=wn, block_k=unit * ck, prefetch=False,
                               stage_x=True, sub_zero=True, max_registers=regs))
    return [v for v in dict.fromkeys(out) if v != c]


def grid16(c: Config, ck: int, wns: tuple[int, ...] = (2, 4)) -> list[Config]:
    """``--grid16``: two-row-set configs over warps, chunks per step, prefetch, register cap and split."""
    out = []
    for wn in wns:
        for unit in (1, 2):
            for pre in (False, True):
                for regs in (64, 72, 80):
                    for split in sorted({max(1, c.split_k // 2), c.split_k, c.split_k * 2}):
                        out.append(replace(c, block_m=16, block_n=32 * wn, num_warps=wn, block_k=unit * ck,
                                           prefetch=pre, stage_x=True, sub_zero=True, max_registers=regs,
                                           split_k=split, sum_values=4))
    return [v for v in out if v != c]


def run(k: int, n: int, bits: int, ms: list[int], reps: int, gen: torch.Generator, with_peers: bool,
        wide: tuple[int, ...] = ()) -> dict:
    p, ps, lock, _, _ = setup(k, n, bits, 1, gen)
    peers = peer_fns(p, len(ps)) if with_peers and bits == 4 else {}
    ck = p.rows_per_block * (32 // p.bits)
    found = {}
    for m in ms:
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        ref = (x.float() @ dense_t(p, torch.float32)).float()
        ship = config(p, m, "gemv_tc")
        rows = []
        for c in [ship, *(grid16(ship, ck, wide) if wide and m > 8 else neighbours(ship, m, ck))]:
            us = checked_time(x, ref, ps, c, lock, reps)
            if us is not None:
                rows.append((us, c))
        t_ship = rows[0][0] if rows and rows[0][1] == ship else float("nan")
        rows.sort(key=lambda r: r[0])
        cells = ", ".join(f"{us:.1f} {fmt(c, p)}{' sv16' if c.sum_values == 16 else ''}" for us, c in rows[:8])
        print(f"| {k}x{n} | {bits} | {m} | {best_peer(peers, x, reps)} | {t_ship:.1f} | {rows[0][0]:.1f} | {cells} |",
              flush=True)
        found[configs.table_key("gemv_tc", m, n, k, bits, p.group)] = entry(rows[0][1], rows[0][0])
        if m > 8:  # skinny2's shipped config timed in the same run: the selector takes the faster of the two
            other = config(p, m, "skinny2")
            us = timed([lambda x, q=q, c=other: qmm(x, q, c, None, lock) for q in ps], x, reps)
            print(f"<!-- {k}x{n} {bits}-bit M={m}: {other.variant} {us:.1f} us -->", flush=True)
            found[configs.table_key(other.variant, m, n, k, bits, p.group)] = entry(other, us)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shape_args(ap)
    ap.add_argument("--grid16", default="", help="warps along N (e.g. 2,4): at M > 8 time a wider two-row-set "
                    "grid instead of the neighbours")
    a = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| K x N | bits | M | best peer us | shipped us | best us | configs (us) |")
    print("| --- " * 7 + "|")
    found = {}
    for bits in (int(b) for b in a.bits.split(",")):
        for shape in a.shapes.split(","):
            k, n = (int(v) for v in shape.split("x"))
            found.update(run(k, n, bits, [int(v) for v in a.m.split(",")], a.reps, gen, a.peers,
                             tuple(int(v) for v in a.grid16.split(",") if v)))
    print("\n```json\n" + json.dumps(found, indent=1) + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
