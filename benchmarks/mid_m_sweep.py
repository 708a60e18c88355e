"""The mid-M sweep both tiled swap-AB kernels share: one variant's configs against the shipped choice and the peers.

Used by ``gemm3_sweep.py`` and ``gemm4_sweep.py`` (they differ in the tiles worth timing and what "shipped" is).
Every config's output is checked against a float reference, and two calls must agree bit for bit, before it is
timed; weights rotate over copies totalling > 4x L2; CUDA-graph replay; median.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_linear import DEV, config, copies, gptq_qweight, our_fns, our_weight, timed
from gpu_peers import PEERS
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.dequant import dense_t

FIELDS = ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages", "max_registers", "tail_split")
#: fields an entry states only when they differ from ``Config``'s default
OPTIONAL = {"max_registers": 0, "tail_split": 1}
#: (block_m, block_n, block_k, warps, stages[, max_registers]) tiles worth timing for M rows
Tiles = Callable[[int], list[tuple[int, ...]]]


def splits(m: int, n: int, k: int, bm: int, bn: int, bk: int) -> list[int]:
    """Split-K factors that bring the CTAs near one, two or three per SM."""
    tiles = -(-m // bm) * -(-n // bn)
    steps = -(-k // bk)
    out = {1}
    for target in (132, 264, 396):
        s = max(1, min(16, steps // 4, round(target / tiles)))
        out.add(s)
    return sorted(out)


def entry(c: Config, us: float) -> dict[str, object]:
    """A table entry: the config's fields (a register cap and a tail split only when set) and its median time."""
    return {f: getattr(c, f) for f in FIELDS if OPTIONAL.get(f) != getattr(c, f)} | {"us": round(us, 2)}


def write_entries(path: str | None, found: dict[str, dict[str, object]]) -> None:
    """A sweep's table entries as the JSON ``merge_table.py`` reads (nothing without a path)."""
    if path:
        Path(path).write_text(json.dumps({"devices": {torch.cuda.get_device_name(): {"configs": found}}}, indent=1))


def checked(p, r: int, c: Config, x: torch.Tensor, ref: torch.Tensor, reps: int) -> float | None:
    """Microseconds, or None (printed why) when the config fails to launch or to match the reference."""
    try:
        fns = our_fns(p, r, c)
        y = fns[0](x).float()
        if not torch.equal(y, fns[0](x).float()):
            print(f"<!-- {c} RACE: two calls differ -->")
            return None
        err = float((y - ref).norm() / ref.norm())
        if not err < 1e-2:
            print(f"<!-- {c} MISMATCH rel {err:.1e} -->")
            return None
        return timed(fns, x, reps)
    except Exception as err:  # out of shared memory / registers: report, keep sweeping
        print(f"<!-- {c}: {type(err).__name__}: {str(err)[:160]} -->")
        return None


def arguments(doc: str, m_default: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,8192x28672,14336x4096,4096x4096")
    ap.add_argument("--m", default=m_default)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peers", action="store_true", help="time bf16, Marlin and Machete beside")
    ap.add_argument("--splits", default="", help="split-K factors to time (default: ones that fill the SMs)")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds after which no new shape starts")
    ap.add_argument("--json", help="write the best config per key (table entries, with us) and the shipped one")
    return ap


def sweep(args: argparse.Namespace, variant: str, tiles: Tiles, shipped: str | None) -> int:
    """Print the table (one row per shape and M) and write ``--json``; ``shipped``: the variant to time beside
    (None: the layer's own choice by M)."""
    if not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels")
        return 2
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}; "
          f"us, median of {args.reps} graph replays\n")
    print(f"| K x N | M | bf16 | Marlin | Machete | shipped | {variant} best | vs shipped | vs best peer | "
          f"top {variant} configs |")
    print("| --- " * 10 + "|")
    gen = torch.Generator(device=DEV).manual_seed(3)
    found: dict[str, dict[str, object]] = {}
    t0 = time.time()
    for shape in args.shapes.split(","):
        if time.time() - t0 > args.budget:
            print(f"<!-- {shape} not run: over the --budget of {args.budget:.0f} s -->")
            continue
        k, n = (int(v) for v in shape.split("x"))
        p = our_weight(k, n, 4, gen)
        r = copies(p.qweight.numel() * 4)
        w = dense_t(p, torch.float32)
        peers = {}
        if args.peers:
            qw = gptq_qweight(p)
            for name in ("bf16", "marlin", "machete"):
                try:
                    reps_w = copies(k * n * 2) if name == "bf16" else r
                    peers[name] = [PEERS[name](qw.clone(), p.scales[:, :n].clone()) for _ in range(reps_w)]
                except Exception as err:
                    print(f"<!-- {name} unavailable: {type(err).__name__}: {str(err)[:200]} -->")
        for m in [int(v) for v in args.m.split(",")]:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            ref = x.float() @ w
            t_peer = {}
            for name, fns in peers.items():
                err = float((fns[0](x).float() - ref).norm() / ref.norm())
                t_peer[name] = timed(fns, x, args.reps) if err < 2e-2 else None
                if err >= 2e-2:
                    print(f"<!-- {name} MISMATCH rel {err:.1e} -->")
            base = config(p, m, shipped)
            t_ship = checked(p, r, base, x, ref, args.reps)
            rows = []
            for bm, bn, bk, wp, st, *regs in tiles(m):
                for s in [int(v) for v in args.splits.split(",")] if args.splits else splits(m, n, k, bm, bn, bk):
                    c = configs.legal(Config(variant, bm, bn, bk, s, wp, st, max_registers=regs[0] if regs else 0),
                                      m, p.kp, 4)
                    us = checked(p, r, c, x, ref, args.reps)
                    if us is not None:
                        rows.append((us, c))
            rows.sort(key=lambda row: row[0])
            if not rows:  # every config failed: the kernel, not a config, is wrong; stop spending device time
                print(f"| {k}x{n} | {m} | no {variant} config ran |")
                return 1
            best, bc = rows[0]
            peer = min((v for kk, v in t_peer.items() if kk != "bf16" and v), default=None)
            top = ", ".join(f"{us:.1f} {c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} st{c.num_stages} "
                            f"s{c.split_k}{f' r{c.max_registers}' if c.max_registers else ''}" for us, c in rows[:4])
            f = "{:.1f}".format
            print(f"| {k}x{n} | {m} | {f(t_peer['bf16']) if t_peer.get('bf16') else '-'} | "
                  f"{f(t_peer['marlin']) if t_peer.get('marlin') else '-'} | "
                  f"{f(t_peer['machete']) if t_peer.get('machete') else '-'} | "
                  f"{f(t_ship) + ' ' + base.variant if t_ship else '-'} | {best:.1f} | "
                  f"{t_ship / best if t_ship else 0:.2f}x | {peer / best if peer else 0:.2f}x | {top} |", flush=True)
            found[configs.table_key(variant, m, n, k, 4, p.group)] = entry(bc, best)
            if t_ship and base.variant != variant:  # the shipped config beside the best (not over it)
                found[configs.table_key(base.variant, m, n, k, 4, p.group)] = entry(base, t_ship)
        del p, w, peers
        torch.cuda.empty_cache()
    write_entries(args.json, found)
    return 0
