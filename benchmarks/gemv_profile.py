"""Where the M=1 GEMV's time goes on the GPU: the GEMV beside a kernel that only streams the same words.

    python3 benchmarks/gemv_profile.py [--shapes 4096x14336,8192x28672] [--bits 4] [--reps 30]
    python3 benchmarks/gemv_profile.py --sweep      # grids of the GEMV and the stream, and a flat read
    ncu --clock-control none --section WarpStateStats ... python3 benchmarks/gemv_profile.py --once gemv

``stream`` reads the GEMV's words with its grid, tiles and split-K (no dequant, no activations): the time any
GEMV with this access pattern needs for its bytes. ``stream-nosync`` drops the split-K counter (each split
writes its own partial row). The difference GEMV - stream is the arithmetic that the loads do not hide.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_sweep import setup
from gpu_linear import DEV, config, copies, copy_bandwidth, our_weight, timed
from hbm_read import flat_read
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.common import load_words, store_split
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.qmm import lock_slots, qmm


@triton.jit
def stream_kernel(W, PART, LOCK, Y, N, KW, NP, SPLIT_K, BLOCK_N: tl.constexpr, BKW: tl.constexpr,
                  SYNC: tl.constexpr, TAIL: tl.constexpr = "store"):
    """The GEMV's word loads alone: XOR of every word of a column's share, as float. Without ``SYNC``, ``TAIL``
    adds the handshake's steps one by one: "store" (partials only), "barrier", "relaxed" (a relaxed counter
    increment), "acq_rel" (the real counter, nobody sums)."""
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nkb = tl.cdiv(KW, BKW)
    per = tl.cdiv(nkb, SPLIT_K)
    kb0 = pid_k * per
    kb1 = tl.minimum(kb0 + per, nkb)
    acc = tl.zeros((BKW, BLOCK_N), dtype=tl.int32)
    for kb in range(kb0, kb1):
        acc ^= load_words(W, kb * BKW + tl.arange(0, BKW), offs_n, KW, NP, False, False)
    out = tl.sum(acc.to(tl.float32), axis=0)[None, :]
    offs_m = tl.arange(0, 1)
    if SYNC:
        store_split(Y, Y, PART, LOCK, out, offs_m, offs_n, 1, N, N, pid_n, pid_k, SPLIT_K, False, True, 1, BLOCK_N, 1)
    else:
        tl.store(PART + pid_k * N + offs_n[None, :], out, mask=(offs_n < N)[None, :])
        if TAIL != "store":
            tl.debug_barrier()
        if TAIL == "relaxed":
            tl.atomic_add(LOCK + pid_n, 1, sem="relaxed", scope="gpu")
        if TAIL == "acq_rel":
            tl.atomic_add(LOCK + pid_n, 1, sem="acq_rel", scope="gpu")


def flat_fns(ps: list, programs: int, block: int, warps: int) -> list:
    out = torch.empty(programs, dtype=torch.int32, device=DEV)
    return [lambda x, q=q: flat_read(q.qweight, out, block, warps) for q in ps]


def grids(p, cap_waves: int = 48) -> list[Config]:
    """GEMV grids: warps x K step x split-K, up to ``cap_waves`` x 132 CTAs."""
    out = []
    for w in (1, 2, 4, 8):
        tiles = -(-p.n // (128 * w))
        for bk in (64, 128):
            nkb = -(-p.kp // bk)
            for split in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
                if split <= nkb and tiles * split <= cap_waves * 132:
                    out.append(Config("gemv", 1, 128 * w, bk, split, w, 2))
    return out


def sweep(k: int, n: int, bits: int, reps: int, gen: torch.Generator) -> None:
    """Every grid of ``grids`` for the stream and the GEMV (output checked), and the flat read."""
    p, ps, lock, x, ref = setup(k, n, bits, 1, gen)
    res: dict[str, list] = {"stream": [], "stream-nosync": [], "gemv": [], "gemv-pf": [], "flat": []}
    for c in grids(p):
        c = configs.legal(c, 1, p.kp, bits)
        name = f"{c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps}"
        for pf in (False, True):
            c2 = replace(c, prefetch=pf)
            err = float((qmm(x, p, c2, None, lock).float() - ref).norm() / ref.norm())
            if not err < 1e-2:
                print(f"WRONG {name} pf={pf}: {err:.2e}")
                continue
            res["gemv-pf" if pf else "gemv"].append(
                (timed([lambda x, q=q, c2=c2: qmm(x, q, c2, None, lock) for q in ps], x, reps), name))
        if c.num_warps <= 4:  # 8 columns a thread (BLOCK_N = 256 x warps): x converted once for twice the weights
            cw = replace(c, block_n=2 * c.block_n)
            if not float((qmm(x, p, cw, None, lock).float() - ref).norm() / ref.norm()) < 1e-2:
                print(f"WRONG wide {name}")
            else:
                res.setdefault("gemv-wide", []).append(
                    (timed([lambda x, q=q, cw=cw: qmm(x, q, cw, None, lock) for q in ps], x, reps), f"wide {name}"))
        res["stream"].append((timed(stream_fns(ps, c, True), x, reps), name))
        res["stream-nosync"].append((timed(stream_fns(ps, c, False), x, reps), name))
    for progs in (132, 264, 528, 1056, 2112, 4224):
        for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8)):
            res["flat"].append((timed(flat_fns(ps, progs, block, warps), x, reps), f"{progs} progs {block} w{warps}"))
    nbytes = p.qweight.numel() * 4
    print(f"\n### {k}x{n} {bits}-bit: words {nbytes / 1e6:.1f} MB; best five per kernel (us, TB/s of words)\n")
    for kind, rows in res.items():
        rows.sort()
        cells = ", ".join(f"{us:.1f} ({nbytes / us / 1e6:.2f}) {nm}" for us, nm in rows[:5])
        print(f"- {kind}: {cells}", flush=True)


HANDSHAKE = ("store", "barrier", "relaxed", "acq_rel")


def stream_fns(ps: list, cfg, sync: bool, tail: str = "store") -> list:
    n = ps[0].n
    part = torch.empty((cfg.split_k, 1, n), dtype=torch.float32, device=DEV)
    y = torch.empty((1, n), dtype=torch.bfloat16, device=DEV)
    lock = torch.zeros(lock_slots(n), dtype=torch.int32, device=DEV)
    grid = (1, triton.cdiv(n, cfg.block_n), cfg.split_k)
    bkw = cfg.block_k * ps[0].bits // 32

    def fn(_x, q):
        stream_kernel[grid](q.qweight, part, lock, y, n, q.kw, q.np, cfg.split_k,
                            BLOCK_N=cfg.block_n, BKW=bkw, SYNC=sync, TAIL=tail, num_warps=cfg.num_warps,
                            num_stages=2)
    return [lambda x, q=q: fn(x, q) for q in ps]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x14336,8192x28672")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sweep", action="store_true", help="grids of the GEMV and the stream, and a flat read")
    ap.add_argument("--handshake", action="store_true", help="the split-K handshake's steps, one by one (stream)")
    ap.add_argument("--once", choices=("gemv", "stream"), help="one call of one kernel (for ncu)")
    args = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(0)
    if args.sweep:
        for shape in args.shapes.split(","):
            k, n = map(int, shape.split("x"))
            sweep(k, n, args.bits, args.reps, gen)
        return 0
    if args.handshake:
        print("| K x N | config | " + " | ".join(HANDSHAKE) + " | full us |")
        print("| --- " * (3 + len(HANDSHAKE)) + "|")
        for shape in args.shapes.split(","):
            k, n = map(int, shape.split("x"))
            p = our_weight(k, n, args.bits, gen)
            cfg = config(p, 1, "gemv")
            x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            r = copies(p.qweight.numel() * 4)
            ps = [p] + [p.with_tensors(qweight=p.qweight.clone()) for _ in range(r - 1)]
            cells = [f"{timed(stream_fns(ps, cfg, False, t), x, args.reps):.1f}" for t in HANDSHAKE]
            cells.append(f"{timed(stream_fns(ps, cfg, True), x, args.reps):.1f}")
            print(f"| {k}x{n} | {cfg.block_n}x{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} | " + " | ".join(cells)
                  + " |", flush=True)
        return 0
    bw = None if args.once else copy_bandwidth()
    if bw:
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
        print("| K x N | config | GEMV us | stream us | stream-nosync us | bf16 us | GEMV TB/s | stream TB/s |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape in args.shapes.split(","):
        k, n = map(int, shape.split("x"))
        p = our_weight(k, n, args.bits, gen)
        cfg = config(p, 1, "gemv")
        x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        lock = torch.zeros(lock_slots(p.n), dtype=torch.int32, device=DEV)
        if args.once:
            for _ in range(3):  # compile, then the profiled calls
                if args.once != "stream":
                    qmm(x, p, config(p, 1, args.once), None, lock)
                else:
                    stream_fns([p], cfg, True)[0](x)
            torch.cuda.synchronize()
            continue
        r = copies(p.qweight.numel() * 4)
        ps = [p] + [p.with_tensors(qweight=p.qweight.clone(), scales=p.scales.clone()) for _ in range(r - 1)]
        t_gemv = timed([lambda x, q=q, c=cfg, lk=lock: qmm(x, q, c, None, lk) for q in ps], x, args.reps)
        t_s = timed(stream_fns(ps, cfg, True), x, args.reps)
        t_ns = timed(stream_fns(ps, cfg, False), x, args.reps)
        ws = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=gen)
              for _ in range(copies(n * k * 2))]
        t_bf = timed([lambda x, w=w: torch.nn.functional.linear(x, w) for w in ws], x, args.reps)
        nbytes = p.qweight.numel() * 4 + p.scales.numel() * p.scales.element_size()
        cname = f"{cfg.block_n}x{cfg.block_k} s{cfg.split_k} w{cfg.num_warps}{' pf' if cfg.prefetch else ''}"
        print(f"| {k}x{n} | {cname} | {t_gemv:.1f} | {t_s:.1f} | {t_ns:.1f} | {t_bf:.1f} | "
              f"{nbytes / t_gemv / 1e6:.2f} | {p.qweight.numel() * 4 / t_s / 1e6:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
