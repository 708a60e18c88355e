"""EXL3 on the GPU: ``ExllamaV3Linear`` (Triton trellis decode) checked against ``ExllamaV3TorchLinear``, then timed
side by side with bf16 ``F.linear`` (cuBLAS).

    PYTHONPATH=src python benchmarks/gpu_exl3.py                  # checks + the table (2 shapes x bits 2,3,4 x Ms)
    PYTHONPATH=src python benchmarks/gpu_exl3.py --no-check --shapes 4096x14336 --ms 1 --bits 4

Checks: random EXL3 layers (random trellis words are valid codes; every codebook; float16 and bfloat16 inputs); the
Triton layer's output against ``ExllamaV3TorchLinear`` on the CPU (float32 on the exact float16 inner weight; the
Triton path rounds the transformed input to float16, as exllamav3 does, so differences of about 1e-3 relative are
expected) and both against ``x @ W`` in float64.

Timing (``gpu_linear.timed``/``copies``): CUDA graphs over enough weight copies to exceed 4x L2, median per call.
Shapes are ``K x N`` (``y [M, N] = x [M, K] @ W``), activations bfloat16, codebook 3inst. ``layer`` is the whole
forward (three Triton launches: input scale + Hadamard, decode product, output Hadamard + scale + bias; plus the
split-K zero fill); ``kernel`` the decode product alone (with a float16 cast of x). Ratios are time / bf16 time
(< 1: faster). ``$OUT``, when set, receives the report as ``gpu_exl3.md``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import bf16_baseline, parser, run, say
from gpu_report import parse as parse_args

SHAPES = ((4096, 14336), (14336, 4096))
MS = (1, 4, 16, 64, 256)
BITS = (2, 3, 4)
DEV = torch.device("cuda")
def random_tensors(k: int, n: int, bits: int, cb: str, gen: torch.Generator, device: torch.device | str = "cpu"
                   ) -> dict[str, torch.Tensor]:
    from qlinear.layouts import exl3

    t = {"trellis": torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * bits), generator=gen,
                                  dtype=torch.int16, device=gen.device).to(device),
         "suh": (torch.randn(k, generator=gen, device=gen.device) * 0.05).half().to(device),
         "svh": (torch.randn(n, generator=gen, device=gen.device) * 0.05).half().to(device)}
    if cb in exl3.MARKERS:
        t[cb] = exl3.marker_tensor(cb).to(device)
    return t


def layers(k: int, n: int, bits: int, cb: str, gen: torch.Generator):
    from qlinear.kernels.exl3 import ExllamaV3Linear, ExllamaV3TorchLinear
    from qlinear.layouts.exl3 import Exl3Params
    from qlinear.spec import Scheme

    p = Exl3Params(bits, cb)
    s = Scheme(bits=bits, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
               pack_dtype=torch.int16, layout_params=p)
    cpu = ExllamaV3TorchLinear(s, bias=True)
    cpu.load_exl3(random_tensors(k, n, bits, cb, gen), (torch.randn(n, generator=gen) * 0.1).half())
    gpu = ExllamaV3Linear(s, bias=True)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.to(DEV)


def checks(args: argparse.Namespace) -> None:
    say("## Checks: ExllamaV3Linear (GPU) vs ExllamaV3TorchLinear (CPU) and vs float64 x @ W")
    say()
    say("| K x N | bits | codebook | dtype | M | rel diff vs Torch | rel err Triton vs fp64 | rel err Torch vs fp64 |")
    say("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for (k, n), bits, cb, dtype, ms in (((4096, 1024), 4, "3inst", torch.bfloat16, (1, 16, 33, 300)),
                                        ((1024, 4096), 2, "mcg", torch.float16, (1, 4, 64)),
                                        ((2048, 1024), 3, "mul1", torch.bfloat16, (1, 16, 40)),
                                        ((256, 384), 8, "3inst", torch.float16, (1, 7, 100))):
        cpu, gpu = layers(k, n, bits, cb, gen)
        w = cpu.dequantize(torch.float64).t()
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(dtype)
            want = cpu(x).double()
            got = gpu(x.to(DEV)).cpu().double()
            ref = x.double() @ w + cpu.bias.double()
            rel = float((got - want).norm() / want.norm())
            worst = max(worst, rel)
            say(f"| {k}x{n} | {bits} | {cb} | {str(dtype)[6:]} | {m} | {rel:.2e} | "
                f"{float((got - ref).norm() / ref.norm()):.2e} | {float((want - ref).norm() / ref.norm()):.2e} |")
    say()
    # bfloat16 outputs: one-ulp flips (2^-8 relative) between two correctly rounded results give about 4e-3 alone
    say(f"worst relative difference Triton vs Torch: {worst:.2e} ({'ok' if worst < 1e-2 else 'TOO LARGE'})")
    say()


def timing(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed
    from qlinear.kernels.exl3 import ExllamaV3Linear
    from qlinear.kernels.triton import exl3_mv
    from qlinear.layouts.exl3 import Exl3Params
    from qlinear.spec import Scheme

    say("## Timing: bf16 F.linear (cuBLAS) vs ExllamaV3Linear (us per call, median of CUDA graph replays)")
    say()
    cols = " | ".join(f"{b}-bit layer | ratio | {b}-bit kernel | ratio" for b in args.bits)
    say(f"| K x N | M | bf16 | {cols} |")
    say("|---|---|---|" + "---|---|---|---|" * len(args.bits))
    gen = torch.Generator(device=DEV).manual_seed(0)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    gemv_vs_block: list[str] = []
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, gen)
        runs = {}
        for bits in args.bits:
            s = Scheme(bits=bits, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
                       pack_dtype=torch.int16, layout_params=Exl3Params(bits))
            mods = []
            for _ in range(copies(n * k * bits // 8)):
                layer = ExllamaV3Linear(s).to(DEV)
                layer.load_exl3(random_tensors(k, n, bits, "3inst", gen, DEV))
                mods.append(layer)
            runs[bits] = ([lambda x, m=m: m(x) for m in mods],
                          [lambda x, m=m, b=bits: exl3_mv.inner_product(x.half(), m.trellis, b, "3inst")
                           for m in mods],
                          [lambda x, m=m, b=bits: exl3_mv.fused_product(x.half(), m.trellis, b, "3inst", sms)
                           for m in mods])
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            tb = timed(wb, x, args.reps)
            cells = []
            for bits in args.bits:
                tl_, tk = timed(runs[bits][0], x, args.reps), timed(runs[bits][1], x, args.reps)
                cells.append(f"{tl_:.1f} | {tl_ / tb:.2f} | {tk:.1f} | {tk / tb:.2f}")
            say(f"| {k}x{n} | {m} | {tb:.1f} | " + " | ".join(cells) + " |")
            if m <= exl3_mv.FUSED_MAX_M:  # the block decode + tl.dot, where inner_product may run another kernel
                block = [timed(runs[bits][2], x, args.reps) for bits in args.bits]
                gemv_vs_block.append(f"| {k}x{n} | {m} | " + " | ".join(f"{t:.1f}" for t in block) + " |")
        del wb, runs
        torch.cuda.empty_cache()
    say()
    if gemv_vs_block:
        say(f"M <= {exl3_mv.FUSED_MAX_M} through the block decode + tl.dot kernel (`exl3_mv.fused_product`), us, "
            f"for comparison with the kernel columns above (which decode into mma fragments up to M = "
            f"{exl3_mv.TC_MAX_M}, `exl3_tc.py`):")
        say()
        say("| K x N | M | " + " | ".join(f"{b}-bit block kernel" for b in args.bits) + " |")
        say("|---|---|" + "---|" * len(args.bits))
        for line in gemv_vs_block:
            say(line)
        say()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, SHAPES, MS, reps=30)
    p.add_argument("--bits", default=",".join(map(str, BITS)))
    return parse_args(p, argv, "bits")


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)

    def body() -> None:
        if not args.no_check:
            checks(args)
        timing(args)

    return run("gpu_exl3", "EXL3", argv, args.out, body)


if __name__ == "__main__":
    main()
