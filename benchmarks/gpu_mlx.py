"""MLX on the GPU: ``MlxTritonLinear`` (the GPTQ Triton kernels with MLX's biases as offsets) checked against
``MlxTorchLinear`` (exact, as ``mx.dequantize``) and float64, then timed beside bf16 ``F.linear`` (cuBLAS) and
``MlxTorchLinear`` on the same GPU (what a user had before).

    PYTHONPATH=src python benchmarks/gpu_mlx.py                  # checks + the table, < 120 s
    PYTHONPATH=src python benchmarks/gpu_mlx.py --no-check --shapes 4096x14336 --ms 1,16 --variants gemv_tc,gemm5

Checks: random MLX layers (random codes, scales of both signs, biases near the group minimum as mlx's quantizer
makes them), every width run (2-8 bits), groups 32/64/128, float16 and bfloat16; every variant family that takes
offsets, gemm5 included (over groups of 64/128 since 2026-12-07), against the float64
product of the exact (unrounded) ``s q + b`` weight and against ``MlxTorchLinear`` on the same device.

Timing (``gpu_linear.timed``/``copies``): a CUDA graph calling the op once per weight copy, the copies together over
4x L2, replayed ``--reps`` times; the median per call in us. Shapes ``K x N``, bfloat16 activations and scales.
``--variants`` adds a column per named variant (``layer.matmul(x, variant=...)``). ``$OUT`` receives
``gpu_mlx.md``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import bf16_baseline, checks_then_timing, parser, say
from gpu_report import parse as parse_args

SHAPES = ((4096, 14336), (14336, 4096))
MS = (1, 4, 16, 64, 256, 1024)
DEV = torch.device("cuda")
OFFSET_VARIANTS = ("gemv", "gemv_tc", "skinny2", "gemm2", "gemm5", "dense")


def random_weight(n: int, k: int, bits: int, gs: int, sdtype: torch.dtype, gen: torch.Generator):
    from qlinear.layouts.mlx import MlxWeight

    codes = torch.randint(0, 1 << bits, (n, k), generator=gen).to(torch.uint8)
    scales = ((torch.rand(n, k // gs, generator=gen) - 0.5) * 0.004).to(sdtype)
    biases = (-scales.float() * (1 << (bits - 1)) + (torch.rand(n, k // gs, generator=gen) - 0.5) * 1e-3).to(sdtype)
    return MlxWeight(codes, scales, biases, bits, gs)


def make(kind: type, w, dtype: torch.dtype, bias: torch.Tensor | None = None):
    from qlinear.layouts import mlx

    layer = kind(mlx.scheme_for(w.bits, w.group_size, w.in_features, w.out_features), bias=bias is not None,
                 dtype=dtype)
    layer.load_mlx(w, bias)
    return layer


CHECKS = [((4096, 2048), bits, gs, sd, ms) for bits, gs, sd in ((4, 64, torch.bfloat16), (4, 32, torch.float16),
                                                                  (8, 64, torch.bfloat16), (3, 128, torch.float16),
                                                                  (6, 64, torch.bfloat16), (2, 32, torch.bfloat16),
                                                                  (4, 128, torch.bfloat16), (4, 32, torch.bfloat16),
                                                                  (3, 64, torch.float16), (8, 32, torch.float16),
                                                                  (5, 128, torch.bfloat16))
          for ms in [(1, 5, 16, 40, 100, 300)]]


def forced(layer, m: int, variant: str):
    """The config of ``variant`` for M rows as the layer would form it."""
    layer.ensure_prepared()
    return layer.config(m, DEV, variant)


def checks() -> int:
    from qlinear.kernels.mlx_torch import MlxTorchLinear
    from qlinear.kernels.mlx_triton import MlxTritonLinear

    say("## Checks: MlxTritonLinear (GPU) per variant vs float64 of s q + b, and vs MlxTorchLinear (GPU)")
    say()
    say("| K x N | bits | gs | dtype | M | variant | rel err vs fp64 | rel diff vs MlxTorchLinear | |")
    say("|---|---|---|---|---|---|---|---|---|")
    failed = 0
    gen = torch.Generator().manual_seed(0)
    for (k, n), bits, gs, sd, ms in CHECKS:
        w = random_weight(n, k, bits, gs, sd, gen)
        bias = (torch.randn(n, generator=gen) * 0.1).to(sd)
        gpu = make(MlxTritonLinear, w, sd, bias).to(DEV)
        exact = make(MlxTorchLinear, w, sd, bias).to(DEV)
        w64 = (w.codes.double() * w.scales.double().repeat_interleave(gs, 1)
               + w.biases.double().repeat_interleave(gs, 1)).to(DEV)
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(sd).to(DEV)
            ref = x.double() @ w64.t() + bias.double().to(DEV)
            base = exact(x)
            for v in OFFSET_VARIANTS:
                try:
                    got = gpu.matmul(x, config=forced(gpu, m, v))
                except (ValueError, RuntimeError) as e:
                    say(f"| {k}x{n} | {bits} | {gs} | {str(sd)[6:]} | {m} | {v} | refused: {str(e)[:80]} | | |")
                    continue
                err = float((got.double() - ref).norm() / ref.norm())
                diff = float((got.double() - base.double()).norm() / base.double().norm())
                ok = err < (1e-2 if sd == torch.bfloat16 else 2e-3)
                failed += not ok
                say(f"| {k}x{n} | {bits} | {gs} | {str(sd)[6:]} | {m} | {v} | {err:.1e} | {diff:.1e} | "
                    f"{'pass' if ok else 'FAIL'} |")
    say()
    return failed


def timing(args: argparse.Namespace) -> int:
    """The table; each timed layer's own output (its default variant) checked against float64 of ``s q + b`` at
    every M first: the checks above use a smaller layer, and the timed shapes take other configs (split-K, wave
    tails). Returns the failures."""
    from gpu_linear import copies, timed
    from qlinear.kernels.mlx_torch import MlxTorchLinear
    from qlinear.kernels.mlx_triton import MlxTritonLinear

    extra = [v for v in args.variants.split(",") if v]
    say("## Timing (us per call, median of CUDA graph replays; bfloat16 activations and scales)")
    say()
    say("| K x N | bits | gs | M | bf16 F.linear | MlxTritonLinear | variant | rel err vs fp64 | ratio | "
        + "".join(f"{v} | " for v in extra) + "MlxTorchLinear |")
    say("|---|---|---|---|---|---|---|---|---|" + "---|" * len(extra) + "---|")
    failed = 0
    gen = torch.Generator().manual_seed(1)
    dgen = torch.Generator(device=DEV).manual_seed(1)
    for k, n in args.shapes:
        dense = bf16_baseline(k, n, dgen)
        for bits, gs in args.forms:
            w = random_weight(n, k, bits, gs, torch.bfloat16, gen)
            base = make(MlxTritonLinear, w, torch.bfloat16).to(DEV)
            base(torch.randn(1, k, device=DEV, dtype=torch.bfloat16))  # prepare
            layers = [base]
            for _ in range(copies(n * k * bits // 8) - 1):
                twin = copy.deepcopy(base)
                twin._runtime_key = twin._current_key()
                layers.append(twin)
            slow = make(MlxTorchLinear, w, torch.bfloat16).to(DEV)
            w64 = (w.codes.double() * w.scales.double().repeat_interleave(gs, 1)
                   + w.biases.double().repeat_interleave(gs, 1)).to(DEV)
            for m in args.ms:
                x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=dgen)
                ref = x.double() @ w64.t()
                err = float((base(x).double() - ref).norm() / ref.norm())
                failed += not err < 1e-2
                tb = timed(dense, x, args.reps)
                tl = timed([lambda a, lay=lay: lay(a) for lay in layers], x, args.reps)
                cols = []
                for v in extra:
                    cfg = forced(base, m, v)
                    try:
                        calls = [lambda a, lay=lay, c=cfg: lay.matmul(a, config=c) for lay in layers]
                        cols.append(f"{timed(calls, x, args.reps):.1f}")
                    except (ValueError, RuntimeError) as e:
                        cols.append(f"- ({str(e)[:40]})")
                ts = timed([slow], x, max(3, args.reps // 5)) if m <= 16 else float("nan")
                say(f"| {k}x{n} | {bits} | {gs} | {m} | {tb:.1f} | {tl:.1f} | {base.config(m, DEV).variant} | "
                    f"{err:.1e}{'' if err < 1e-2 else ' FAIL'} | {tl / tb:.2f} | " + "".join(f"{c} | " for c in cols)
                    + f"{ts:.1f} |")
            del layers, base, slow, w64
            torch.cuda.empty_cache()
        del dense
    say()
    return failed


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, SHAPES, MS, reps=30)
    p.add_argument("--forms", default="4x64,8x64,4x32", help="bits x group size, comma separated")
    p.add_argument("--variants", default="", help="variants timed beside the layer's own pick, comma separated")
    args = parse_args(p, argv)
    args.forms = [tuple(int(v) for v in f.split("x")) for f in args.forms.split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    return checks_then_timing("gpu_mlx", "MLX", argv, parse(argv), checks, timing)


if __name__ == "__main__":
    sys.exit(main())
