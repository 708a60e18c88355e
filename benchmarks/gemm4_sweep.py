"""Mid-M sweep (M = 16..256): ``gemm4`` (Gluon, ``triton/qmm4.py``) configs against the shipped ``gemm3``, bf16
cuBLAS, Marlin and Machete, side by side in one run; every config's output checked first (float reference,
two calls bit-identical).

    python3 benchmarks/gemm4_sweep.py [--shapes 4096x14336,...] [--m 16,64,128,256] [--peers] [--json out.json]

gemm4 is gemm3's swap-AB product with the pipeline written out: the next step's dequantization runs while this
step's wgmma does. Weights rotate over copies totalling > 4x L2; CUDA-graph replay; median.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemm3_sweep import FIELDS, checked, splits
from gpu_linear import DEV, config, copies, gptq_qweight, our_weight, timed
from gpu_peers import PEERS
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.dequant import dense_t


def tiles_for(m: int, quick: bool) -> list[tuple[int, int, int, int, int]]:
    """(block_m, block_n, block_k, warps, stages) worth timing at this M: M tiles of the bucket or half it."""
    b = configs.m_bucket(m)
    out = []
    for bm in (16, 32, 64, 128, 256):
        if bm > max(16, b) or (bm < b // 2 and not (b > 256 and bm >= 128)):  # above 256 rows: 128/256 tiles
            continue
        for bn, w in ((64, 4), (128, 4), (128, 8), (256, 8)):
            for bk, st in ((64, 4), (128, 4)) if quick else ((64, 4), (64, 6), (128, 3), (128, 4)):
                if bm * bn > 256 * 128:
                    continue
                out.append((bm, bn, bk, w, st))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,8192x28672,14336x4096,4096x4096")
    ap.add_argument("--m", default="16,64,128,256")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peers", action="store_true", help="time bf16, Marlin and Machete beside")
    ap.add_argument("--quick", action="store_true", help="two (block_k, stages) pairs instead of four")
    ap.add_argument("--splits", default="", help="split-K factors to time (default: ones that fill the SMs)")
    ap.add_argument("--budget", type=float, default=1e9, help="seconds after which no new shape starts")
    ap.add_argument("--json", help="write the best gemm4 config per key (table entries, with us) here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels")
        return 2
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}; "
          f"us, median of {args.reps} graph replays\n")
    print("| K x N | M | bf16 | Marlin | Machete | shipped | gemm4 best | vs shipped | vs best peer | "
          "top gemm4 configs |")
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
            base = config(p, m)
            t_ship = checked(p, r, base, x, ref, args.reps)
            rows = []
            for bm, bn, bk, wp, st in tiles_for(m, args.quick):
                for s in [int(v) for v in args.splits.split(",")] if args.splits else splits(m, n, k, bm, bn, bk):
                    c = configs.legal(Config("gemm4", bm, bn, bk, s, wp, st), m, p.kp, 4)
                    us = checked(p, r, c, x, ref, args.reps)
                    if us is not None:
                        rows.append((us, c))
            rows.sort(key=lambda row: row[0])
            if not rows:  # every config failed: the kernel, not a config, is wrong; stop spending device time
                print(f"| {k}x{n} | {m} | no gemm4 config ran |")
                return 1
            best, bc = rows[0]
            peer = min((v for kk, v in t_peer.items() if kk != "bf16" and v), default=None)
            top = ", ".join(f"{us:.1f} {c.block_m}x{c.block_n}x{c.block_k} w{c.num_warps} st{c.num_stages} "
                            f"s{c.split_k}" for us, c in rows[:4])
            f = "{:.1f}".format
            print(f"| {k}x{n} | {m} | {f(t_peer['bf16']) if t_peer.get('bf16') else '-'} | "
                  f"{f(t_peer['marlin']) if t_peer.get('marlin') else '-'} | "
                  f"{f(t_peer['machete']) if t_peer.get('machete') else '-'} | "
                  f"{f(t_ship) + ' ' + base.variant if t_ship else '-'} | {best:.1f} | "
                  f"{t_ship / best if t_ship else 0:.2f}x | {peer / best if peer else 0:.2f}x | {top} |", flush=True)
            found[configs.table_key("gemm4", m, n, k, 4, p.group)] = {
                f2: getattr(bc, f2) for f2 in FIELDS} | {"us": round(best, 2)}
            if t_ship and base.variant != "gemm4":  # the shipped config beside gemm4's best (not over it)
                found[configs.table_key(base.variant, m, n, k, 4, p.group)] = {
                    f2: getattr(base, f2) for f2 in FIELDS} | {"us": round(t_ship, 2)}
        del p, w, peers
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps({"devices": {torch.cuda.get_device_name(): {"configs": found}}},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
