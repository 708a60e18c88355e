"""Float-weight Triton kernels on the GPU: numerics of every variant, then side-by-side timing against bf16
cuBLAS, torch._scaled_mm (cuBLAS FP8, rowwise scales) and, where vLLM's op library is carried, vLLM's FP8
Marlin and cutlass_scaled_mm.

    python3 benchmarks/gpu_float.py --out benchmarks/results/h200-gpu_float-<date>.md   # checks + table
    python3 benchmarks/gpu_float.py --quick                       # 2 shapes, 4 Ms, few checks
    python3 benchmarks/gpu_float.py --shapes 4096x14336 --ms 1,16 --no-check
    python3 benchmarks/gpu_float.py --sweep --shapes 8192x28672 --ms 1,16,256   # a few tile configs per variant
    python3 benchmarks/gpu_float.py --sweep --families w8a8 --variants mma --ms 256,4096  # one kernel
    TRITON_INTERPRET=1 python3 benchmarks/gpu_float.py --interpret   # the script itself on CPU, tiny shapes

Method (``gpu_linear.timed``/``copies``): each point is a CUDA graph calling the op once per weight copy, the
copies together over 4x L2 (HBM, not cache, is measured), replayed ``--reps`` times; the median per call.
Shapes are ``K x N`` (``y [M, N] = x [M, K] @ W^T``). FP8 weights are random e4m3 codes with per-channel
float32 scales (``--granularity block``: 128x128 blocks); bf16 multiplies the same weights decoded, and the
FP8 peers the same codes. W8A8 "mm" is the product of already-quantized activations (as ``_scaled_mm`` and
cutlass are timed); "e2e" adds our per-token quantization. Ratios are time ours / time peer (< 1: faster).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_float_common import (
    MS,
    OUT,
    QUICK_MS,
    QUICK_SHAPES,
    SHAPES,
    bind,
    build,
    const,
    cutlass_mm,
    fmt,
    fp4_weight,
    fp8_dense,
    fp8_peer,
    fp8_scales,
    fp8_weight,
    marlin_fp8,
    point,
    ratio,
    rel,
    say,
    scaled_mm,
    timer,
)
from gpu_float_numerics import run_checks
from gpu_float_sweep import sweep


def main_table(args: argparse.Namespace, dev: torch.device) -> None:
    from qlinear.kernels.triton import fp4mm, fp8_w8a8, fp8mm

    timed, copies = timer(args)
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16
    cols = ("bf16", "_scaled_mm", "cutlass", "Marlin FP8", "fp8 W8A16", "W8A8 mm", "W8A8 e2e", "NVFP4", "MXFP4")
    say(f"FP8 scales: {args.granularity}; times in us, median of {args.reps} graph replays; ratios = time ours / "
        "time peer\n")
    say("| K x N | M | " + " | ".join(cols) + " | fp8/bf16 | fp8/Marlin | W8A8/_scaled_mm | NVFP4/bf16 | "
        "MXFP4/bf16 | fp8 variant | W8A8 variant | FP4 variant |")
    say("| --- " * (len(cols) + 10) + "|")
    for k, n in args.shapes:
        blk = (1, k) if args.granularity == "channel" else (128, 128)
        w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
        s = fp8_scales(n, k, blk, gen, dev)
        rows = s[:, 0].repeat_interleave(blk[0])[:n].contiguous()  # per-channel view of the scales for peers
        r8 = copies(n * k)
        ws = [w] + [w.clone() for _ in range(r8 - 1)]
        ss = [s] + [s.clone() for _ in range(r8 - 1)]
        lock = torch.zeros(1 << 16, dtype=torch.int32, device=dev)
        wbf = (fp8_dense(w, s, blk)).to(dtype)
        peers: dict[str, list | str] = {
            "bf16": build(lambda src=wbf: bind(F.linear, src.clone()), copies(2 * n * k), "bf16"),
            "Marlin FP8": build(lambda src=w, sc=s, b=blk: marlin_fp8(src.clone(), sc, b, dtype), r8, "Marlin FP8"),
        }
        del wbf
        fp4 = {kind: [fp4_weight(n, k, kind, gen, dev) for _ in range(copies(n * k // 2))] for kind in
               ("nvfp4", "mxfp4")}
        for m in args.ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
            xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
            t: dict[str, float | None] = {}
            notes: list[str] = []
            t["bf16"] = point(timed, peers["bf16"], x, args.reps)
            t["Marlin FP8"] = point(timed, peers["Marlin FP8"], x, args.reps)
            for name, make in (("_scaled_mm", scaled_mm), ("cutlass", cutlass_mm)):
                t[name] = point(timed, fp8_peer(make, name, ws, rows, xq, sx, dtype, notes), x, args.reps)
            v8 = fp8mm.choose_variant(m, n, k)
            t["fp8 W8A16"] = point(timed, [bind(fp8mm.fp8_linear, wi, si, blk, lock=lock) for wi, si in zip(ws, ss)],
                                   x, args.reps)
            vw = fp8_w8a8.choose_w8a8_variant(m, n, k)
            t["W8A8 mm"] = point(timed, [const(fp8_w8a8.fp8_w8a8_mm, xq, sx, wi, si, blk, None, dtype, lock=lock)
                                         for wi, si in zip(ws, ss)], x, args.reps)
            t["W8A8 e2e"] = point(timed, [bind(fp8_w8a8.fp8_w8a8_linear, wi, si, blk, lock=lock)
                                          for wi, si in zip(ws, ss)], x, args.reps)
            for kind, label in (("nvfp4", "NVFP4"), ("mxfp4", "MXFP4")):
                t[label] = point(timed, [bind(fp4mm.fp4_linear, p, c, kind, g, lock=lock) for p, c, g in fp4[kind]],
                                 x, args.reps)
            v4 = fp4mm.choose_fp4_variant(m, n, k)
            say(f"| {k}x{n} | {m} | " + " | ".join(fmt(t.get(c)) for c in cols) + " | "
                f"{ratio(t['fp8 W8A16'], t['bf16'])} | {ratio(t['fp8 W8A16'], t['Marlin FP8'])} | "
                f"{ratio(t['W8A8 mm'], t['_scaled_mm'])} | {ratio(t['NVFP4'], t['bf16'])} | "
                f"{ratio(t['MXFP4'], t['bf16'])} | {v8} | {vw} | {v4} |" + (f" {'; '.join(notes)}" if notes else ""))
        del peers, ws, ss, fp4
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def check_peers(args: argparse.Namespace, dev: torch.device) -> None:
    """Every peer against the float64 product of the same codes (a time means nothing if the peer multiplies
    other numbers)."""
    from qlinear.kernels.triton import fp8_w8a8

    gen = torch.Generator(device=dev).manual_seed(5)
    k, n = args.shapes[0]
    blk = (1, k) if args.granularity == "channel" else (128, 128)
    w = fp8_weight(n, k, torch.float8_e4m3fn, gen, dev)
    s = fp8_scales(n, k, blk, gen, dev)
    rows = s[:, 0].repeat_interleave(blk[0])[:n].contiguous()
    x = torch.randn(16, k, device=dev, generator=gen).to(torch.bfloat16)
    xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
    ref = x.double() @ fp8_dense(w, s, blk).t()
    ref8 = (xq.double() * sx.double()[:, None]) @ fp8_dense(w, s, blk).t()
    say("| peer | rel err vs float64 |\n| --- | --- |")
    for name, run, r in (("Marlin FP8", lambda: marlin_fp8(w, s, blk, torch.bfloat16)(x), ref),
                         ("_scaled_mm", lambda: scaled_mm(w, rows, torch.bfloat16)(xq, sx), ref8),
                         ("cutlass_scaled_mm", lambda: cutlass_mm(w, rows, torch.bfloat16)(xq, sx), ref8)):
        if blk[0] != 1 and name != "Marlin FP8":
            say(f"| {name} | (rowwise scales only: block weights not comparable) |")
            continue
        try:
            err = rel(run(), r)
            say(f"| {name} | {err:.2e}{' MISMATCH' if err > 2e-2 else ''} |")
        except Exception as e:
            say(f"| {name} | unavailable: {type(e).__name__}: {str(e)[:200]} |")
    say()


# ---- main -----------------------------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="KxN list (default: the four Llama shapes)")
    ap.add_argument("--ms", help="M list (default 1,4,16,64,256,1024,4096)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="2 shapes, M 1/16/256/4096, fewer checks")
    ap.add_argument("--no-check", action="store_true", help="skip the numerics checks")
    ap.add_argument("--check-only", action="store_true", help="only the numerics checks")
    ap.add_argument("--granularity", choices=("channel", "block"), default="channel", help="FP8 weight scales")
    ap.add_argument("--sweep", action="store_true", help="time a handful of tile configs per variant instead")
    ap.add_argument("--families", default="fp8,w8a8,nvfp4,mxfp4", help="--sweep: which kernels")
    ap.add_argument("--variants", default="", help="--sweep: these variants (default: those near M's crossover)")
    ap.add_argument("--interpret", action="store_true", help="CPU, Triton interpreter, tiny shapes (script check)")
    ap.add_argument("--out", help="write the report (Markdown) here")
    args = ap.parse_args(argv)
    if args.interpret:
        default_shapes, default_ms = ((256, 72),), (1, 5, 40)
    elif args.sweep:
        default_shapes, default_ms = ((8192, 28672),), (1, 16, 256)
    elif args.quick:
        default_shapes, default_ms = QUICK_SHAPES, QUICK_MS
    else:
        default_shapes, default_ms = SHAPES, MS
    args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes \
        else list(default_shapes)
    args.ms = [int(v) for v in args.ms.split(",")] if args.ms else list(default_ms)
    args.families = [f for f in args.families.split(",") if f]
    args.variants = [v for v in args.variants.split(",") if v]
    odd = ((992, 333), (1000, 333)) if not args.interpret else ((96, 40),)
    args.check_shapes = [args.shapes[0]] + ([] if args.quick else list(odd))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.interpret:
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            print("--interpret needs TRITON_INTERPRET=1 in the environment (set before Python starts)")
            return 2
        dev = torch.device("cpu")
        args.reps = 1
    elif not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels (--interpret checks it on CPU)")
        return 2
    else:
        dev = torch.device("cuda")
    t0 = time.time()
    import triton

    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU (interpreter)"
    say(f"# gpu_float: {name}, torch {torch.__version__}, triton {triton.__version__}")
    say(f"command: python benchmarks/gpu_float.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    ok = True
    with interpreter_patch(args):
        ok = run(args, dev)
    say(f"\n{time.time() - t0:.0f} s")
    if args.out:
        Path(args.out).write_text("\n".join(OUT) + "\n")
    return 0 if ok else 1


def interpreter_patch(args: argparse.Namespace):
    """Under ``--interpret``: the tests' interpreter set-up (bfloat16 dot operands multiplied as float32)."""
    if not args.interpret:
        return contextlib.nullcontext()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.triton_interp import interpreted

    from qlinear.kernels.triton import fp8mm

    return interpreted(fp8mm.fp8_dot_kernel)


def run(args: argparse.Namespace, dev: torch.device) -> bool:
    ok = True
    if args.sweep:
        sweep(args, dev)
    else:
        if not args.no_check:
            say("## Numerics (every variant vs float64; tolerance float16 2e-3, bfloat16 1e-2; each call twice: "
                "bitwise equal; split-K counters back at 0)\n")
            ok = run_checks(args, dev)
        if not args.check_only:
            say("## Peers' numerics\n")
            check_peers(args, dev)
            say("## Times\n")
            main_table(args, dev)
    return ok


if __name__ == "__main__":
    sys.exit(main())

