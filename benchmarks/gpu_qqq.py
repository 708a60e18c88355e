"""QQQ (W4A8) on the GPU: ``QQQLinear`` (Triton, int8 tensor cores) checked against ``QQQTorchLinear``, then timed
side by side with bf16 ``F.linear`` (cuBLAS).

    python3 benchmarks/gpu_qqq.py                        # checks + the table (3 shapes x 6 Ms, g128 and per-channel)
    python3 benchmarks/gpu_qqq.py --no-check --shapes 4096x14336 --ms 1,16
    python3 benchmarks/gpu_qqq.py --sweep --shapes 4096x14336 --ms 16,256   # a few tile configs per point

Checks: random QQQ layers (grouped g128 and per-channel; float16 and bfloat16) built with ``load_qqq``; the Triton
layer's output against ``QQQTorchLinear`` run on the CPU (exact integer arithmetic: expected bit-identical), and
both against ``x @ dequantize(W)^T`` in float64 (the error the int8 activations bring).

Timing (``gpu_linear.timed``/``copies``): each point is a CUDA graph calling the op once per weight copy, the copies
together over 4x L2 (HBM, not cache, is measured), replayed ``--reps`` times; the median per call. Shapes are
``K x N`` (``y [M, N] = x [M, K] @ W^T``), activations bfloat16. QQQ times are end to end (per-token int8
quantization + the int8 GEMM), on random runtime words (every bit pattern is a valid code). Ratios are time QQQ /
time bf16 (< 1: faster). ``$OUT`` (a directory), when set, receives the report as ``gpu_qqq.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import parse as parse_args
from gpu_report import parser, run, say

SHAPES = ((4096, 14336), (14336, 4096), (8192, 28672))
MS = (1, 16, 64, 256, 1024, 4096)
DEV = torch.device("cuda")
def random_qqq(n: int, k: int, gs: int, gen: torch.Generator):
    from qlinear.layouts.qqq import QQQWeight

    codes = torch.randint(-8, 8, (n, k), dtype=torch.int8, generator=gen)
    group = (torch.rand(n, k // gs, generator=gen) * 12 + 4).half() if gs < k else torch.empty(n, 0).half()
    channel = (torch.rand(n, generator=gen) + 0.5) * (2e-4 if gs < k else 2e-3)
    return QQQWeight(codes, group, channel.float(), gs)


def layers(qw, dtype: torch.dtype):
    from qlinear.kernels.qqq import QQQLinear, QQQTorchLinear
    from qlinear.spec import Scheme

    s = Scheme(bits=4, group_size=qw.group_size, in_features=qw.in_features, out_features=qw.out_features,
               method="qqq", format="qqq")
    bias = torch.randn(qw.out_features) * 0.1
    cpu = QQQTorchLinear(s, bias=True, dtype=dtype)
    cpu.load_qqq(qw, bias)
    gpu = QQQLinear(s, bias=True, dtype=dtype)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.to(DEV)


def checks(args: argparse.Namespace) -> None:
    say("## Checks: QQQLinear (GPU) vs QQQTorchLinear (CPU, exact) and vs float64 x @ W^T")
    say()
    say("| K x N | group | dtype | M | identical | max diff (ulps of y) | rel err QQQ vs fp64 |")
    say("|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for (k, n), gs, dtype, ms in (((4096, 14336), 128, torch.bfloat16, (1, 16, 64, 256, 1000)),
                                  ((4096, 14336), -1, torch.bfloat16, (1, 16, 256)),
                                  ((4096, 4096), 128, torch.float16, (1, 37, 300)),
                                  ((192, 256), -1, torch.float16, (1, 5, 129))):
        qw = random_qqq(n, k, k if gs == -1 else gs, gen)
        cpu, gpu = layers(qw, dtype)
        w = qw.dequantize(torch.float64)
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(dtype)
            want = cpu(x)
            got = gpu(x.to(DEV)).cpu()
            same = int((got.view(torch.int16) == want.view(torch.int16)).sum())
            ulps = int((got.view(torch.int16).int() - want.view(torch.int16).int()).abs().max())
            ref = x.double() @ w.t() + cpu.bias.to(dtype).double()
            err = float((got.double() - ref).norm() / ref.norm())
            say(f"| {k}x{n} | {gs} | {str(dtype)[6:]} | {m} | {same}/{got.numel()} | {ulps} | {err:.2e} |")
    say()


def timing(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed
    from qlinear.kernels.triton import qqq_mm

    say("## Timing: bf16 F.linear (cuBLAS) vs QQQLinear (us per call, median of CUDA graph replays)")
    say()
    say("| K x N | M | bf16 | QQQ g128 | ratio | QQQ channel | ratio |")
    say("|---|---|---|---|---|---|---|")
    gen = torch.Generator(device=DEV).manual_seed(0)
    for k, n in args.shapes:
        rb = copies(n * k * 2)
        wb = [torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(rb)]
        rq = copies(n * k // 2)
        runs = {}
        for gs in (128, 0):
            ws = []
            for _ in range(rq):
                words = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32, device=DEV, generator=gen)
                sg = torch.rand(k // 128, n, device=DEV, generator=gen) * 12 + 4 if gs else None
                sc = torch.rand(n, device=DEV, generator=gen) * 2e-4 + 1e-4
                ws.append((words, sg, sc))
            lock = torch.zeros(4096, dtype=torch.int32, device=DEV)
            runs[gs] = [lambda x, t=t, gs=gs, lock=lock: qqq_mm.qqq_linear(x, t[0], t[1], t[2], None, gs, lock=lock)
                        for t in ws]
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            tb = timed([lambda x, w=w: F.linear(x, w) for w in wb], x, args.reps)
            tg = timed(runs[128], x, args.reps)
            tc = timed(runs[0], x, args.reps)
            say(f"| {k}x{n} | {m} | {tb:.1f} | {tg:.1f} | {tg / tb:.2f} | {tc:.1f} | {tc / tb:.2f} |")
        del wb, runs
        torch.cuda.empty_cache()
    say()


def sweep(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed
    from qlinear.kernels.triton import qqq_mm
    from qlinear.kernels.triton.qqq_mm import QConfig

    say("## Sweep: tile configs (us per call, QQQ g128 and per-channel, bfloat16)")
    say()
    gen = torch.Generator(device=DEV).manual_seed(0)
    cands = ([QConfig(r, bn, sp, 4, 3, variant="gemv") for r, bn in ((1, 64), (1, 128), (1, 256), (2, 128), (4, 64))
              for sp in (1, 2, 4, 8)]
             + [QConfig(bm, bn, sp, 4, 4, variant=v) for bm, bn in ((16, 64), (16, 128), (32, 128), (64, 128))
                for sp in (1, 2, 4, 8) for v in ("mma", "dense")]
             + [QConfig(bm, bn, 1, w, st, variant=v) for bm, bn, w, st in ((128, 128, 4, 4), (128, 128, 8, 3),
                                                                           (128, 256, 8, 3), (256, 128, 8, 3))
                for v in ("mma", "dense")])
    for k, n in args.shapes:
        rq = copies(n * k // 2)
        ws = [(torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32, device=DEV, generator=gen),
               torch.rand(k // 128, n, device=DEV, generator=gen) * 12 + 4,
               torch.rand(n, device=DEV, generator=gen) * 2e-4 + 1e-4) for _ in range(rq)]
        lock = torch.zeros(4096, dtype=torch.int32, device=DEV)
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            xq, s1 = qqq_mm.quantize_rows(x)
            for gs in args.groups:
                best = []
                for c in cands:
                    if (c.variant == "gemv") != (m <= 4) or (c.variant == "gemv" and c.block_m < min(m, 4)):
                        continue
                    if c.variant != "gemv" and (c.block_m > max(16, 2 * m) or (c.block_m < 128 and m > 256)):
                        continue
                    fns = [lambda _x, t=t, c=c, gs=gs, a=xq, s=s1, lk=lock: qqq_mm.qqq_mm(
                        a, s, t[0], t[1] if gs else None, t[2], None, torch.bfloat16, gs, c, lk) for t in ws]
                    try:
                        best.append((timed(fns, x, args.reps), c))
                    except Exception as err:  # a config that does not compile (shared memory) drops out
                        say(f"<!-- {c}: {type(err).__name__}: {str(err)[:120]} -->")
                best.sort(key=lambda t: t[0])
                auto = qqq_mm.qqq_config(m, n, k, torch.cuda.get_device_properties(DEV).multi_processor_count)
                top = "; ".join(f"{t:.1f} {c.block_m}x{c.block_n} s{c.split_k} w{c.num_warps} st{c.num_stages}"
                                f" {c.variant}" for t, c in best[:5])
                say(f"- {k}x{n} M={m} {'g128' if gs else 'channel'}: {top} (auto: {auto})")
        del ws
        torch.cuda.empty_cache()
    say()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, SHAPES, MS, reps=30)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--groups", default="128,0", help="sweep: group sizes (0: per-channel)")
    return parse_args(p, argv, "groups")


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)

    def body() -> None:
        if args.sweep:
            sweep(args)
        else:
            if not args.no_check:
                checks(args)
            timing(args)

    return run("gpu_qqq", "QQQ W4A8", argv, args.out, body)


if __name__ == "__main__":
    main()
