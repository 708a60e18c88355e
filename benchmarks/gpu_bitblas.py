"""BitBLAS checkpoints on the GPU: ``BitblasLinear`` / ``AWQBitBlasKernel`` (BitBLAS tensors, qlinear's Triton GPTQ
kernels) checked against ``TritonV2Linear`` and ``TorchLinear`` on the same weight, then timed beside bf16 ``F.linear``.

    PYTHONPATH=src python benchmarks/gpu_bitblas.py
    PYTHONPATH=src python benchmarks/gpu_bitblas.py --no-check --shapes 4096x14336 --ms 1,16

Checks: random layers (GPTQ 4-bit asym g128, 4-bit sym g128, 2-bit asym g64, 8-bit sym g32; AWQ 4-bit g64;
float16 and bfloat16 inputs) built with ``load_affine``. The BitBLAS layer must equal ``TritonV2Linear`` loaded
with the same weight bit for bit (same runtime layout); against qlinear's exact ``TorchLinear`` and a float64
``x @ W^T`` the relative error is printed. Timing (``gpu_linear.timed``/``copies``): a CUDA graph calling the layer
once per weight copy (copies over 4x L2), median per call; 4-bit asymmetric g128, bfloat16 activations; ratio =
time BitBLAS layer / time bf16. ``$OUT`` (a directory), when set, receives the report as ``gpu_bitblas.md``.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import bf16_baseline, parser, run, say
from gpu_report import parse as parse_args

SHAPES = ((4096, 14336), (14336, 4096))
MS = (1, 16, 64, 256)
DEV = torch.device("cuda")
def random_weight(n: int, k: int, bits: int, gs: int, sym: bool, gen: torch.Generator):
    from qlinear.affine import AffineWeight

    g = k // gs
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.int16).to(torch.uint8)
    zeros = torch.full((n, g), 1 << (bits - 1), dtype=torch.int32) if sym \
        else torch.randint(0, 1 << bits, (n, g), generator=gen, dtype=torch.int32)
    scales = (torch.rand(n, g, generator=gen) * 0.02 / (1 << (bits - 2)) + 1e-3).half()
    return AffineWeight(codes, scales, zeros, torch.arange(k, dtype=torch.int32) // gs, bits, gs, sym)


def bitblas_layer(q, method: str, bias: torch.Tensor | None):
    from qlinear.kernels.bitblas import AWQBitBlasKernel, BitblasLinear
    from qlinear.spec import Scheme

    s = Scheme(bits=q.bits, group_size=q.group_size, in_features=q.in_features, out_features=q.out_features,
               sym=q.sym, method=method, format="bitblas")
    layer = (AWQBitBlasKernel if method == "awq" else BitblasLinear)(s, bias=bias is not None)
    layer.load_affine(q, bias)
    return layer.to(DEV)


def gptq_layer(cls, q, bias: torch.Tensor):
    from qlinear.spec import Scheme

    s = Scheme(bits=q.bits, group_size=q.group_size, in_features=q.in_features, out_features=q.out_features, sym=q.sym)
    layer = cls(s, bias=True)
    layer.load_affine(q, bias)
    return layer.to(DEV)


def checks() -> None:
    from qlinear.kernels.torch import TorchLinear
    from qlinear.kernels.triton_gptq import TritonV2Linear

    say("## Checks: BitBLAS layer (GPU) vs TritonV2Linear (same weight), TorchLinear (exact) and float64 x @ W^T")
    say()
    say("| method | bits | group | sym | K x N | dtype | M | = Triton GPTQ | rel err vs Torch | vs fp64 |")
    say("|---|---|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for method, bits, gs, sym, (k, n) in (("gptq", 4, 128, False, (4096, 4096)), ("gptq", 4, 128, True, (4096, 1024)),
                                          ("gptq", 2, 64, False, (2048, 1024)), ("gptq", 8, 32, True, (1024, 2048)),
                                          ("awq", 4, 64, False, (4096, 2048))):
        q = random_weight(n, k, bits, gs, sym, gen)
        bias = (torch.randn(n, generator=gen) * 0.1).half()
        ours, tri, exact = bitblas_layer(q, method, bias), gptq_layer(TritonV2Linear, q, bias), \
            gptq_layer(TorchLinear, q, bias)
        w = q.dequantize(torch.float64).to(DEV)
        for dtype in (torch.float16, torch.bfloat16):
            for m in (1, 16, 300):
                x = torch.randn(m, k, generator=gen).to(dtype).to(DEV)
                got = ours(x)
                same = bool(torch.equal(got, tri(x)))
                want = exact(x)
                rt = float((got.double() - want.double()).norm() / want.double().norm())
                ref = x.double() @ w.t() + bias.double().to(DEV)
                r64 = float((got.double() - ref).norm() / ref.norm())
                say(f"| {method} | {bits} | {gs} | {sym} | {k}x{n} | {str(dtype)[6:]} | {m} | {same} | {rt:.1e} | "
                    f"{r64:.1e} |")
        del ours, tri, exact
        torch.cuda.empty_cache()
    say()


def timing(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed

    say("## Timing: bf16 F.linear (cuBLAS) vs BitblasLinear 4-bit asym g128 (us per call, median of graph replays)")
    say()
    say("| K x N | M | bf16 | BitBLAS layer | ratio |")
    say("|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(1)
    dgen = torch.Generator(device=DEV).manual_seed(1)
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, dgen)
        first = bitblas_layer(random_weight(n, k, 4, 128, False, gen), "gptq", None)
        first.prepare()
        layers = [first]
        for _ in range(copies(n * k // 2) - 1):  # same weight, own memory: runtime copied, not rebuilt
            c = copy.deepcopy(first)
            c._runtime_key = c._current_key()
            layers.append(c)
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=dgen)
            tb = timed(wb, x, args.reps)
            tq = timed(layers, x, args.reps)
            say(f"| {k}x{n} | {m} | {tb:.1f} | {tq:.1f} | {tq / tb:.2f} |")
        del wb, layers, first
        torch.cuda.empty_cache()
    say()


def parse(argv: list[str] | None) -> argparse.Namespace:
    return parse_args(parser(__doc__, SHAPES, MS, reps=30), argv)


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)

    def body() -> None:
        if not args.no_check:
            checks()
        timing(args)

    return run("gpu_bitblas", "BitBLAS checkpoints", argv, args.out, body)


if __name__ == "__main__":
    main()
