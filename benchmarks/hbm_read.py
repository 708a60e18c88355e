"""HBM read bandwidth for the roofline column: a contiguous Triton read (a weight-streaming kernel's pattern),
beside the device-to-device copy; and (run as a script) the same bytes read in gemv_tc's tile pattern from
row-major ``[KW, NP]`` words and from strip-major ``[NP / 32, KW, 32]`` words (``layout.stripe``).

    python3 benchmarks/hbm_read.py [--shapes 4096x14336,...] [--reps 20]

Why: on the H200 ``b.copy_(a)`` of 1 GiB measured 2.75 TB/s (read + write counted) while this read of the
8192x28672 weight reached 4.04 TB/s with 8 programs per SM, 2048 words a step, 8 warps
(``results/h200-gemv_profile-2026-12-02.md``, ``gemv_profile.py --sweep``), so a roofline against the copy read
above 100%. The quantized kernels only read their weights; their ceiling is the read rate.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def flat_kernel(W, OUT, NUMEL, PER, BLOCK: tl.constexpr):
    """A contiguous read of ``PER`` words per program (the best pattern for the bytes), summed so that nothing
    is optimised away: the ceiling."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(pid * PER, tl.minimum(pid * PER + PER, NUMEL), BLOCK):
        offs = i + tl.arange(0, BLOCK)
        acc += tl.load(W + offs, mask=offs < NUMEL, other=0)
    tl.store(OUT + pid, tl.sum(acc, axis=0))


def flat_read(words: torch.Tensor, out: torch.Tensor, block: int, warps: int) -> torch.Tensor:
    """The sum (int32, wrapping) of each program's share of the int32 ``words`` into ``out`` (one slot each)."""
    numel = words.numel()
    programs = out.numel()
    per = -(-numel // programs // block) * block
    flat_kernel[(programs,)](words, out, numel, per, BLOCK=block, num_warps=warps)
    return out


def read_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Bytes/s of one read of ``nbytes`` (median of ``reps`` CUDA-graph replays), the measured best grid."""
    from gpu_linear import timed

    words = torch.zeros(nbytes // 4, dtype=torch.int32, device=device)
    out = torch.empty(8 * torch.cuda.get_device_properties(device).multi_processor_count, dtype=torch.int32,
                      device=device)
    us = timed([lambda w: flat_read(w, out, 2048, 8)], words, reps)
    return nbytes / (us * 1e-6)


@triton.jit
def tile_kernel(W, OUT, KW, NP, PER, STRIPED: tl.constexpr, BN: tl.constexpr, BR: tl.constexpr):
    """gemv_tc's reads without its arithmetic: program ``(strip of BN columns, split)`` reads ``PER`` word rows
    of its columns ``BR`` rows a step, from ``[KW, NP]`` (row ``NP`` words apart) or strip-major (each 32
    columns' rows contiguous)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BN + tl.arange(0, BN)[None, :]
    if STRIPED:
        base = (cols // 32) * (KW * 32) + cols % 32
        rs = 32
    else:
        base = cols
        rs = NP
    acc = tl.zeros((BR, BN), dtype=tl.int32)
    for r in range(pid_k * PER, tl.minimum(pid_k * PER + PER, KW), BR):
        rows = r + tl.arange(0, BR)[:, None]
        acc += tl.load(W + rows * rs + base, mask=rows < KW, other=0)
    tl.store(OUT + pid_k * NP + pid_n * BN + tl.arange(0, BN), tl.sum(acc, axis=0))


def tile_read(words: torch.Tensor, out: torch.Tensor, kw: int, np_: int, striped: bool, bn: int, br: int,
              split: int, warps: int) -> torch.Tensor:
    """Column sums (int32, wrapping) of each split's rows into ``out [split, NP]``."""
    per = -(-kw // split // br) * br
    tile_kernel[(np_ // bn, split)](words, out, kw, np_, per, STRIPED=striped, BN=bn, BR=br, num_warps=warps)
    return out


def flat_words(words: torch.Tensor, out: torch.Tensor, _x: torch.Tensor) -> torch.Tensor:
    return flat_read(words, out, 2048, 8)


def tile_words(words: torch.Tensor, args: tuple, _x: torch.Tensor) -> torch.Tensor:
    return tile_read(words, *args)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_linear import DEV, copies, timed

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,8192x28672,4096x4096,14336x4096")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; 4-bit words [K / 8, N]; us (TB/s)\n")
    print("| K x N | MB | flat | row-major tile: best (config) | strip-major tile: best (config) |")
    print("| --- | --- | --- | --- | --- |")
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    for shape in a.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        kw = k // 8
        w = torch.randint(-(1 << 30), 1 << 30, (kw, n), dtype=torch.int32, device=DEV)
        ws = [w] + [w.clone() for _ in range(copies(w.numel() * 4) - 1)]
        ss = [v.reshape(kw, n // 32, 32).transpose(0, 1).contiguous() for v in ws]
        want = w.sum(0, dtype=torch.int64)
        mb = w.numel() * 4 / 1e6
        flat_out = torch.empty(8 * sms, dtype=torch.int32, device=DEV)
        flat = timed([functools.partial(flat_words, v, flat_out) for v in ws], w, a.reps)
        cells = []
        for striped, src in ((False, ws), (True, ss)):
            best = None
            for bn, br, warps in ((32, 32, 1), (64, 32, 2), (64, 64, 4), (128, 32, 4)):
                for split in (1, 2, 4, 8, 16):
                    if (n // bn) * split < 2 * sms or split * br > kw:
                        continue
                    out = torch.empty((split, n), dtype=torch.int32, device=DEV)
                    got = tile_read(src[0], out, kw, n, striped, bn, br, split, warps).sum(0, dtype=torch.int64)
                    ok = bool(((got - want) % (1 << 32) == 0).all())
                    args = (out, kw, n, striped, bn, br, split, warps)
                    us = timed([functools.partial(tile_words, v, args) for v in src], w, a.reps)
                    if ok and (best is None or us < best[0]):
                        best = (us, f"{bn}x{br} s{split} w{warps}")
            cells.append("-" if best is None else f"{best[0]:.1f} ({mb / best[0]:.2f}) {best[1]}")
        print(f"| {k}x{n} | {mb:.1f} | {flat:.1f} ({mb / flat:.2f}) | {cells[0]} | {cells[1]} |", flush=True)
        del ws, ss
    return 0


if __name__ == "__main__":
    sys.exit(main())
