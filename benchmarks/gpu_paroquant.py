"""ParoQuant on the GPU: ``ParoQuantTritonLinear`` checked against ``ParoLinear`` (exact, CPU) and float64, then timed
beside bf16 ``F.linear`` (cuBLAS) and beside its own 4-bit Triton product without the rotation (what the input
transform costs).

    PYTHONPATH=src python benchmarks/gpu_paroquant.py            # checks + the table (2 shapes x 4 Ms), < 90 s
    PYTHONPATH=src python benchmarks/gpu_paroquant.py --no-check --shapes 4096x14336 --ms 1,16

Checks: random ParoQuant layers (random AWQ words, scales, rotations with every round and group a permutation,
krot 8 and 1, float16 and bfloat16). The Triton rotation kernel against the torch rotation on the same GPU tensors
(expected bit-identical: same operations, same roundings); the layer against ``ParoLinear`` on the CPU (bit-exact with
GPTQModel; the rotation's ``cos``/``sin`` come from the device's own float32 libm, and the product accumulates in
another order, so ulps, not bits) and against the float64 product of the CPU-rotated input and the dequantized weight.

Timing (``gpu_linear.timed``/``copies``): each point is a CUDA graph calling the op once per weight copy, the copies
together over 4x L2, replayed ``--reps`` times; the median per call, in us. Shapes are ``K x N``, activations
bfloat16, g128, krot 8 (paroquant's default). Copies of one layer are ``deepcopy``-ed on the GPU with their runtime
state (identical contents, so it stays valid). ``$OUT`` (a directory), when set, receives ``gpu_paroquant.md``.
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
MS = (1, 16, 64, 256)
DEV = torch.device("cuda")
def random_state(k: int, n: int, gs: int, krot: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "qweight": torch.randint(-2**31, 2**31 - 1, (k, n // 8), dtype=torch.int32, generator=gen),
        "qzeros": torch.randint(-2**31, 2**31 - 1, (k // gs, n // 8), dtype=torch.int32, generator=gen),
        "scales": (torch.rand(k // gs, n, generator=gen) * 0.01 + 0.001).half(),
        "pairs": torch.stack([torch.cat([torch.randperm(gs, generator=gen) for _ in range(k // gs)])
                              for _ in range(krot)]).to(torch.int16),
        "theta": ((torch.rand(krot, k // 2, generator=gen) * 2 - 1) * 3.2).half(),
        "channel_scales": (torch.rand(1, k, generator=gen) * 1.5 + 0.5).half(),
        "bias": (torch.randn(n, generator=gen) * 0.1).half(),
    }


def make(kind: type, k: int, n: int, gs: int, krot: int, state: dict[str, torch.Tensor], dtype: torch.dtype):
    from qlinear.layouts.paroquant import ParoParams
    from qlinear.spec import Scheme

    s = Scheme(bits=4, group_size=gs, in_features=k, out_features=n, method="paroquant", format="paroquant",
               layout_params=ParoParams(krot))
    layer = kind(s, bias=True, dtype=dtype)
    layer.load_state_dict(state, strict=True)
    return layer


CHECKS = (((4096, 4096), 128, 8, torch.bfloat16, (1, 16, 300)),
          ((2048, 1024), 64, 1, torch.float16, (1, 37)),
          ((1024, 512), 128, 8, torch.float16, (5, 256)))


def checks(cases: tuple = CHECKS) -> int:
    from qlinear.kernels.paro_base import ParoQuantBase
    from qlinear.kernels.paroquant import ParoLinear, ParoQuantTritonLinear

    say("## Checks: ParoQuantTritonLinear (GPU) vs ParoLinear (CPU, exact) and vs float64")
    say()
    say("| K x N | gs | krot | dtype | M | rotation: Triton = torch (GPU) | max diff vs CPU / max y | "
        "rel err vs fp64 | |")
    say("|---|---|---|---|---|---|---|---|---|")
    failed = 0
    gen = torch.Generator().manual_seed(0)
    for (k, n), gs, krot, dtype, ms in cases:
        state = random_state(k, n, gs, krot, gen)
        cpu = make(ParoLinear, k, n, gs, krot, state, dtype)
        gpu = make(ParoQuantTritonLinear, k, n, gs, krot, state, dtype).to(DEV)
        w64 = cpu.dequantize(torch.float64)
        for m in ms:
            x = torch.randn(m, k, generator=gen).to(dtype)
            xd = x.to(DEV)
            gpu.ensure_prepared()
            same = torch.equal(gpu.rotate_input(xd), ParoQuantBase.rotate_input(gpu, xd))
            want, got = cpu(x), gpu(xd).cpu()
            diff = float((got.float() - want.float()).abs().max() / want.float().abs().max())
            cpu.ensure_prepared()
            ref = cpu.rotate_input(x).double() @ w64.t() + cpu.bias.double()
            err = float((got.double() - ref).norm() / ref.norm())
            ok = same and err < (1e-2 if dtype == torch.bfloat16 else 2e-3)
            failed += not ok
            say(f"| {k}x{n} | {gs} | {krot} | {str(dtype)[6:]} | {m} | {same} | {diff:.1e} | {err:.1e} | "
                f"{'pass' if ok else 'FAIL'} |")
    say()
    return failed


def timing(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed
    from qlinear.kernels.paroquant import ParoQuantTritonLinear

    say("## Timing (us per call, median of CUDA graph replays; bfloat16, g128, krot 8)")
    say()
    say("| K x N | M | bf16 F.linear | Paro (rotation + 4-bit product) | 4-bit product alone | rotation alone | "
        "Paro / bf16 | Paro / product |")
    say("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(1)
    dgen = torch.Generator(device=DEV).manual_seed(1)
    for k, n in args.shapes:
        base = make(ParoQuantTritonLinear, k, n, 128, 8, random_state(k, n, 128, 8, gen), torch.bfloat16).to(DEV)
        x0 = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
        base(x0)  # prepare: runtime layout and rotation operands
        layers = [base]
        for _ in range(copies(n * k // 2) - 1):
            twin = copy.deepcopy(base)
            twin._runtime_key = twin._current_key()  # same contents: the cloned runtime state is current
            layers.append(twin)
        dense = bf16_baseline(k, n, dgen)
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=dgen)
            tb = timed(dense, x, args.reps)
            tp = timed([lambda a, lay=lay: lay(a) for lay in layers], x, args.reps)
            tq = timed([lambda a, lay=lay: lay.matmul(a) for lay in layers], x, args.reps)
            tr = timed([lambda a, lay=lay: lay.rotate_input(a) for lay in layers], x, args.reps)
            say(f"| {k}x{n} | {m} | {tb:.1f} | {tp:.1f} | {tq:.1f} | {tr:.1f} | {tp / tb:.2f} | {tp / tq:.2f} |")
        del layers, dense, base
        torch.cuda.empty_cache()
    say()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, SHAPES, MS, reps=30)
    return parse_args(p, argv)


def main(argv: list[str] | None = None) -> int:
    return checks_then_timing("gpu_paroquant", "ParoQuant", argv, parse(argv), checks, timing)


if __name__ == "__main__":
    sys.exit(main())
