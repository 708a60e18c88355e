"""bitsandbytes 4-bit (NF4 / FP4) weights on the GPU: our Triton kernels (``kernels/triton/lut4.py``) checked against
a float64 reference and bitsandbytes' own decode, then timed beside bf16 cuBLAS and bitsandbytes' CUDA kernels.

    python3 benchmarks/gpu_bnb.py                          # checks + the table (OUT=dir: also gpu_bnb.md / .json)
    python3 benchmarks/gpu_bnb.py --shapes 4096x14336 --ms 1,4 --no-check
    python3 benchmarks/gpu_bnb.py --sweep --shapes 4096x14336 --ms 1    # GEMV tile/split configs at one M
    TRITON_INTERPRET=1 python3 benchmarks/gpu_bnb.py --interpret        # the script itself on CPU, tiny shapes

Weights: random ``W [N, K]`` in bf16 quantized by ``bitsandbytes.functional.quantize_4bit`` (NF4, block 64, no
double quantization); ours reads the same bytes and absmax (``prepare_lut4``) and bnb's ``quant_state.code`` as
the table. Timing (as ``gpu_linear.timed``): a CUDA graph of one call per weight copy, the copies together over
4x L2 (HBM is measured, not cache), replayed ``--reps`` times; the median per call, in us. bnb is timed as
``bnb.matmul_4bit(x, W.t(), quant_state)`` (its gemv kernel at M = 1, dequantize + cuBLAS above). Ratios are
time ours / time peer (< 1: ours faster). A variant that fails is reported and skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))
MS = (1, 4, 16, 64, 256, 1024)
TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
Fn = Callable[[torch.Tensor], torch.Tensor]
LINES: list[str] = []
RECORDS: list[dict] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def decodes(dev: torch.device) -> tuple[str, ...]:
    return ("prmt", "gather") if dev.type == "cuda" else ("gather",)  # prmt is inline PTX


def candidates(m: int, auto: str, dev: torch.device) -> list[tuple[str, str]]:
    """(variant, decode) pairs timed at M: AUTO's variant first, its neighbours too, so crossovers can be read."""
    vs = {1: ["gemv"], 2: ["gemv", "skinny"], 4: ["gemv", "skinny"], 16: ["skinny", "mma"], 64: ["skinny", "mma"],
          256: ["mma", "dense"], 1024: ["mma", "dense"]}.get(m) or ["gemv", "skinny", "mma", "dense"]
    return [(v, d) for v in [auto] + [v for v in vs if v != auto] for d in decodes(dev)]


# ---- inputs ------------------------------------------------------------------------------------------------------

def bnb_weight(n: int, k: int, quant_type: str, block: int, dtype: torch.dtype, gen: torch.Generator,
               dev: torch.device):
    """``(W dense in dtype, packed bytes [N*K/2, 1], quant_state)`` from bitsandbytes' own quantizer."""
    import bitsandbytes.functional as bf

    w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).to(dtype)
    q, st = bf.quantize_4bit(w, blocksize=block, quant_type=quant_type, compress_statistics=False)
    return w, q, st


def runtime(q: torch.Tensor, st, n: int, k: int):
    from qlinear.kernels.triton import lut4

    return lut4.prepare_lut4(q.view(n, k // 2), st.absmax.view(n, k // st.blocksize), st.blocksize)


def reference(q: torch.Tensor, st, n: int, k: int) -> torch.Tensor:
    """Float64 weights by torch ops from the definition (bnb bytes: even column in the high nibble)."""
    b = q.view(n, k // 2).long()
    codes = torch.stack([b >> 4, b & 15], dim=-1).reshape(n, k)
    return st.code.double()[codes] * st.absmax.double().view(n, -1).repeat_interleave(st.blocksize, 1)


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


# ---- checks ------------------------------------------------------------------------------------------------------

def run_checks(args: argparse.Namespace, dev: torch.device) -> bool:
    """Every variant and decode on odd and real shapes, NF4 / FP4, blocks 32..256, fp16 / bf16, bias: against the
    float64 product, against bnb's ``dequantize_4bit`` weights, prmt == gather bitwise, two calls bitwise equal."""
    import bitsandbytes.functional as bf

    from qlinear.kernels.triton import lut4

    gen = torch.Generator(device=dev).manual_seed(1)
    ok, count, worst, equal = True, 0, {}, [0, 0]
    say("| K x N | type | block | dtype | bias | M | variant | decode | rel err vs f64 | vs bnb dequant | "
        "prmt == gather | repeat equal |")
    say("| --- " * 12 + "|")
    shapes = args.check_shapes
    for si, (k, n) in enumerate(shapes):
        for qt, block, dtype in (("nf4", 64, torch.bfloat16), ("fp4", 128, torch.float16),
                                 ("nf4", 32, torch.float16), ("fp4", 256, torch.bfloat16)):
            if k % block:
                continue
            _, q, st = bnb_weight(n, k, qt, block, dtype, gen, dev)
            rt = runtime(q, st, n, k)
            wref = reference(q, st, n, k)
            wbnb = bf.dequantize_4bit(q, st).double()
            dec = rel(wbnb, wref)
            if dec > 4e-3:
                say(f"<!-- bnb dequantize_4bit differs from the definition: rel {dec:.2e} ({qt}, {block}) -->")
                ok = False
            bias = torch.randn(n, device=dev, generator=gen).to(dtype) if si % 2 == 0 else None
            for m in args.check_ms:
                x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
                ref = x.double() @ wref.t() + (bias.double() if bias is not None else 0)
                refb = x.double() @ wbnb.t() + (bias.double() if bias is not None else 0)
                outs = {}
                for v in lut4.VARIANTS:
                    for d in decodes(dev):
                        try:
                            y = lut4.lut4_linear(x, rt, st.code, bias, variant=v, decode=d)
                            y2 = lut4.lut4_linear(x, rt, st.code, bias, variant=v, decode=d)
                        except Exception as e:  # a failing variant is reported, not fatal
                            say(f"| {k}x{n} | {qt} | {block} | {str(dtype)[6:]} | {bias is not None} | {m} | {v} | "
                                f"{d} | FAILED {type(e).__name__}: {str(e)[:150]} | | | |")
                            ok = False
                            continue
                        outs[(v, d)] = y
                        e1, e2 = rel(y, ref), rel(y, refb)
                        other = outs.get((v, "prmt")) if d == "gather" else None  # prmt runs first on CUDA
                        same = "-" if other is None else ("yes" if torch.equal(other, y) else "NO")
                        equal[0] += same == "yes"
                        equal[1] += same != "-"
                        good = e1 < TOL[dtype] and e2 < TOL[dtype] and torch.equal(y, y2) and same != "NO"
                        ok &= good
                        count += 1
                        key = f"{v} {d} {str(dtype)[6:]}"
                        worst[key] = max(worst.get(key, 0.0), e1)
                        if not good or args.verbose:
                            say(f"| {k}x{n} | {qt} | {block} | {str(dtype)[6:]} | {bias is not None} | {m} | {v} | "
                                f"{d} | {e1:.2e} | {e2:.2e} | {same} | {torch.equal(y, y2)} |"
                                + ("" if good else " **FAIL**"))
            if si == 0:
                ok &= decoded_weights(rt, st, wbnb, k, dtype, qt, block, dev)
    say(f"\n{count} layer checks: {'all passed' if ok else 'FAILURES above'}; prmt == gather bit for bit in "
        f"{equal[0]} of {equal[1]}; worst rel err vs float64 per variant: "
        + ", ".join(f"{key} {e:.1e}" for key, e in sorted(worst.items())) + "\n")
    RECORDS.append(dict(checks=count, ok=ok, worst=worst, prmt_equals_gather=equal))
    return ok


def decoded_weights(rt, st, wbnb: torch.Tensor, k: int, dtype: torch.dtype, qt: str, block: int,
                    dev: torch.device) -> bool:
    """The dense variant on an identity gives our decoded W^T in x's dtype: how much of it equals bnb's own
    ``dequantize_4bit`` bit for bit (ours rounds float16(table) * absmax, bnb float32(table) * absmax)."""
    from qlinear.kernels.triton import lut4

    try:
        eye = torch.eye(k, device=dev, dtype=dtype)
        wt = lut4.lut4_linear(eye, rt, st.code, variant="dense", decode=decodes(dev)[0]).t().double()
    except Exception as e:
        say(f"<!-- decoded weights FAILED: {type(e).__name__}: {str(e)[:300]} -->")
        return False
    diff = (wt - wbnb).abs()
    say(f"<!-- decoded weights {qt} block {block} {str(dtype)[6:]}: equal to bnb's dequantize_4bit "
        f"{float((diff == 0).double().mean()):.4f}, max diff {float(diff.max()):.3g} "
        f"(max |w| {float(wbnb.abs().max()):.3g}) -->")
    return float(diff.max()) <= 2 ** -7 * float(wbnb.abs().max())


# ---- timing ------------------------------------------------------------------------------------------------------

def timed(fns: list[Fn], x: torch.Tensor, reps: int) -> float:
    """``gpu_linear.timed`` (imported here: it loads the int4 kernels, after ``--interpret`` has been decided)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_linear import timed as graph_timed

    return graph_timed(fns, x, reps)


def cpu_timed(fns: list[Fn], x: torch.Tensor, reps: int) -> float:
    t0 = time.perf_counter()
    fns[0](x)
    return (time.perf_counter() - t0) * 1e6


def copies(nbytes: int, dev: torch.device) -> int:
    if dev.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 60 << 20)
    return max(2, math.ceil(4 * l2 / nbytes))


def point(timer, fns: list[Fn], x: torch.Tensor, reps: int, name: str) -> float | None:
    try:
        return timer(fns, x, reps)
    except Exception as e:
        say(f"<!-- {name} failed: {type(e).__name__}: {str(e)[:300]} -->")
        if os.environ.get("GPU_BNB_TRACE"):
            traceback.print_exc()
        return None


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.2f}"


def main_table(args: argparse.Namespace, dev: torch.device) -> None:
    import bitsandbytes as bnb

    from qlinear.kernels.triton import lut4

    timer = cpu_timed if dev.type != "cuda" else timed
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16
    say(f"NF4, block 64, bf16 activations; times in us, median of {args.reps} graph replays; ratios = ours / peer\n")
    say("| K x N | M | bf16 | bnb | ours (AUTO) | AUTO variant | ours/bf16 | ours/bnb | best of ours | "
        "all of ours (variant decode: us) |")
    say("| --- " * 10 + "|")
    for k, n in args.shapes:
        r4 = copies(n * k // 2, dev)
        weights = [bnb_weight(n, k, "nf4", 64, dtype, gen, dev) for _ in range(r4)]
        dense = [weights[i % r4][0] for i in range(copies(2 * n * k, dev))]
        rts = [runtime(q, st, n, k) for _, q, st in weights]
        for m in args.ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(dtype)
            t_bf16 = point(timer, [lambda a, wi=wi: F.linear(a, wi) for wi in dense], x, args.reps, "bf16")
            t_bnb = point(timer, [lambda a, q=q, st=st: bnb.matmul_4bit(a, q.t(), quant_state=st)
                                  for _, q, st in weights], x, args.reps, "bnb")
            ours: dict[str, float] = {}
            auto = lut4.choose_lut4_variant(m, n, k)
            for v, d in candidates(m, auto, dev):
                fns = [lambda a, rt=rt, st=st, v=v, d=d: lut4.lut4_linear(a, rt, st.code, variant=v, decode=d)
                       for rt, (_, _, st) in zip(rts, weights)]
                t = point(timer, fns, x, args.reps, f"ours {v} {d}")
                if t is not None:
                    ours[f"{v} {d}"] = t
            best = min(ours, key=ours.get) if ours else None
            ta = ours.get(f"{auto} {decodes(dev)[0]}")
            say(f"| {k}x{n} | {m} | {fmt(t_bf16)} | {fmt(t_bnb)} | {fmt(ta)} | {auto} | {ratio(ta, t_bf16)} | "
                f"{ratio(ta, t_bnb)} | {best or '-'} | " + ", ".join(f"{name}: {t:.1f}" for name, t in ours.items())
                + " |")
            RECORDS.append(dict(k=k, n=n, m=m, bf16=t_bf16, bnb=t_bnb, ours=ours, best=best, auto=auto))
        del weights, dense, rts
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def configs_to_sweep(n: int, m: int, k: int, rows: int) -> list[tuple[tuple[int, int, int], int]]:
    """(block_n, block_k, warps) around the default (2048 words a step), each at two split-K widths."""
    out = []
    for bn, bk, warps in ((64, 256, 4), (128, 64, 4), (256, 64, 4), (256, 64, 8), (512, 64, 8)):
        tiles = -(-n // (bn * max(1, bk // 64))) * -(-m // rows)
        for split in sorted({max(1, 132 * 6 // tiles), max(1, 132 * 12 // tiles)}):
            if split <= k // min(bk, 64):
                out.append(((bn, bk, warps), split))
    return out


def sweep(args: argparse.Namespace, dev: torch.device) -> None:
    """GEMV configs (rows, block_n, block_k, split, warps) at each M <= 4 (prmt decode): rows for ``lut4_config``."""
    from qlinear.kernels.triton import lut4
    from qlinear.kernels.triton.fp_common import FConfig

    timer = cpu_timed if dev.type != "cuda" else timed
    gen = torch.Generator(device=dev).manual_seed(0)
    say("| K x N | M | rows x BN x BK | split | warps | us |\n| --- | --- | --- | --- | --- | --- |")
    for k, n in args.shapes:
        r4 = copies(n * k // 2, dev)
        weights = [bnb_weight(n, k, "nf4", 64, torch.bfloat16, gen, dev) for _ in range(r4)]
        rts = [runtime(q, st, n, k) for _, q, st in weights]
        for m in args.ms:
            x = torch.randn(m, k, device=dev, generator=gen).to(torch.bfloat16)
            rows = 1 if m == 1 else (2 if m == 2 else 4)
            for (bn, bk, warps), split in configs_to_sweep(n, m, k, rows):
                cfg = FConfig("gemv", rows, bn, bk, split, warps, 3)
                fns = [lambda a, rt=rt, st=st, cfg=cfg: lut4.lut4_linear(a, rt, st.code, config=cfg)
                       for rt, (_, _, st) in zip(rts, weights)]
                t = point(timer, fns, x, args.reps, cfg.short())
                say(f"| {k}x{n} | {m} | {rows}x{bn}x{bk} | {split} | {warps} | {fmt(t)} |")
                RECORDS.append(dict(k=k, n=n, m=m, config=cfg.as_dict(), us=t))
        del weights, rts


# ---- main --------------------------------------------------------------------------------------------------------

def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="KxN list (default: the four Llama shapes)")
    ap.add_argument("--ms", help="M list (default 1,4,16,64,256,1024)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-check", action="store_true", help="skip the numerics checks")
    ap.add_argument("--check-only", action="store_true", help="only the numerics checks")
    ap.add_argument("--sweep", action="store_true", help="time GEMV configs instead of the table")
    ap.add_argument("--check-shapes", help="KxN list for the checks")
    ap.add_argument("--check-ms", help="M list for the checks")
    ap.add_argument("--verbose", action="store_true", help="print every check, not only failures")
    ap.add_argument("--interpret", action="store_true", help="CPU, Triton interpreter, tiny shapes (script check)")
    args = ap.parse_args(argv)
    shapes = ((256, 96),) if args.interpret else SHAPES
    ms = (1, 4, 17) if args.interpret else MS
    args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else shapes
    args.ms = [int(v) for v in args.ms.split(",")] if args.ms else list(ms)
    cs = [(256, 96), (128, 40)] if args.interpret else [(4096, 4096), (4160, 1000)]
    cm = [1, 3, 17] if args.interpret else [1, 3, 16, 300]
    args.check_shapes = [tuple(int(v) for v in s.split("x")) for s in args.check_shapes.split(",")] \
        if args.check_shapes else cs
    args.check_ms = [int(v) for v in args.check_ms.split(",")] if args.check_ms else cm
    return args


def run(args: argparse.Namespace, dev: torch.device) -> bool:
    ok = True
    if args.sweep:
        sweep(args, dev)
        return ok
    if not args.no_check:
        say("## Numerics (tolerance: bf16 1e-2, fp16 2e-3, relative Frobenius; failures only unless --verbose)\n")
        ok = run_checks(args, dev)
    if not args.check_only:
        say("## Times\n")
        main_table(args, dev)
    return ok


def interpreter_patch(args: argparse.Namespace):
    """Under ``--interpret``: the tests' interpreter set-up (bfloat16 dot operands multiplied as float32)."""
    if not args.interpret:
        return contextlib.nullcontext()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.triton_interp import interpreted

    from qlinear.kernels.triton import lut4

    return interpreted(lut4.lut4_dot_kernel)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.interpret:
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            print("--interpret needs TRITON_INTERPRET=1 in the environment (set before Python starts)")
            return 2
        dev, args.reps = torch.device("cpu"), 1
    elif not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels (--interpret checks it on CPU)")
        return 2
    else:
        dev = torch.device("cuda")
    try:
        import bitsandbytes
    except ImportError as e:
        print(f"bitsandbytes is not importable ({e}): pip install bitsandbytes==0.50.2, or put it on PYTHONPATH")
        return 2
    import triton

    t0 = time.time()
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU (interpreter)"
    say(f"# gpu_bnb: {name}, torch {torch.__version__}, triton {triton.__version__}, "
        f"bitsandbytes {bitsandbytes.__version__}")
    say(f"command: python benchmarks/gpu_bnb.py {' '.join(argv if argv is not None else sys.argv[1:])}\n")
    with interpreter_patch(args):
        ok = run(args, dev)
    say(f"\n{time.time() - t0:.0f} s")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_bnb.md").write_text("\n".join(LINES) + "\n")
        Path(out, "gpu_bnb.json").write_text(json.dumps(dict(ok=ok, records=RECORDS), indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
