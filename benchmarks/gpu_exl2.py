"""ExLlamaV2 layers on the GPU: ``ExllamaV2Linear`` / ``AwqExllamaV2Linear`` (CUDA route: qlinear's Triton GPTQ
kernels) and ``Exl2TorchLinear`` (EXL2 mixed-bit, exact Torch decode per forward), checked then timed beside bf16
``F.linear`` (cuBLAS).

    PYTHONPATH=src python benchmarks/gpu_exl2.py
    PYTHONPATH=src python benchmarks/gpu_exl2.py --no-check --shapes 4096x14336 --ms 1,16

Checks, on random layers: each layer on the GPU against the same layer on the CPU (exllamav2's exact float16
decode there; for EXL2 the same decode on both devices) and against ``x @ W^T`` in float64. Timing
(``gpu_linear.timed``/``copies``): a CUDA graph calling the layer once per weight copy (copies together over 4x L2),
replayed ``--reps`` times, median per call; activations bfloat16. EXL2 layers hold 3.9 bits per weight on average
(4.0 with the scales): 8/6/5/4/3-bit groups of 32 rows, widest first as exllamav2 orders them. Their time includes
decoding the whole weight in column tiles on every call. ``Exl2TritonLinear`` is timed as a forward runs it (at
M <= ``ONE_LAUNCH_MAX_M`` every segment in one launch, ``triton/exl2_tc.py``) and, at M <= 16, one segment at a time
(``variant="gemv_tc"``); the checks run the one launch at M = 1..16. ``--sweep`` adds the one-launch kernel's split
and step sizes at M = 1, 4, 16 on the first shape.
``$OUT`` (a directory), when set, receives the report as ``gpu_exl2.md``.
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
MS = (1, 16, 64, 256)
DEV = torch.device("cuda")
def exl2_params(k: int):
    """3.9 bits per weight: rows 1/32 8-bit, 1/32 6-bit, 1/16 5-bit, 1/2 4-bit, the rest 3-bit; 32-row groups."""
    from qlinear.layouts.exl2 import Exl2Params

    plan = [(8, k // 32), (6, k // 32), (5, k // 16), (4, k // 2)]
    bits: list[int] = []
    for b, rows in plan:
        bits += [b] * (rows // 32)
    bits += [3] * ((k - 32 * len(bits)) // 32)
    return Exl2Params(tuple(bits), (32,) * len(bits))


def exl2_layer(k: int, n: int, gen: torch.Generator, cls=None):
    from qlinear.kernels.exl2 import Exl2TorchLinear
    from qlinear.layouts import exl2
    from qlinear.spec import Scheme

    p = exl2_params(k)
    codes = torch.cat([torch.randint(0, 1 << b, (r, n), generator=gen) for b, r in zip(p.group_bits, p.group_rows)])
    qs = torch.randint(0, 16, (len(p.group_bits), n), generator=gen)
    smax = (torch.rand(len(p.group_bits), generator=gen) * 0.02 + 0.002).half()
    t = exl2.encode(codes, qs, smax, torch.randperm(k, generator=gen), p)
    t["bias"] = (torch.randn(n, generator=gen) * 0.1).half()
    s = Scheme(bits=p.max_bits, group_size=-1, in_features=k, out_features=n, method="exl2", format="exl2",
               layout_params=p)
    layer = (cls or Exl2TorchLinear)(s, bias=True, dtype=torch.bfloat16)
    layer.load_state_dict(t)
    return layer


def exv2_layer(cls, k: int, n: int, gen: torch.Generator, desc_act: bool):
    from qlinear import quantize_rtn
    from qlinear.spec import Scheme

    awq = cls.__name__.startswith("Awq")
    perm = torch.randperm(k, generator=gen) if desc_act else None
    q = quantize_rtn(torch.randn(n, k, generator=gen) * 0.02, bits=4, group_size=128, sym=False, desc_act=desc_act,
                     perm=perm)
    s = Scheme(bits=4, group_size=128, in_features=k, out_features=n, sym=False, desc_act=desc_act,
               method="awq" if awq else "gptq", format="gemm" if awq else "gptq")
    layer = cls(s, bias=True)
    layer.load_affine(q, bias=torch.randn(n, generator=gen) * 0.1)
    return layer


def row(name: str, k: int, n: int, m: int, cpu_layer, dtype: torch.dtype, gen: torch.Generator,
        gpu_cls=None, variant: str | None = None) -> None:
    """``gpu_cls``: run that class on the GPU, loaded from the CPU layer's state dict (CUDA-only classes);
    ``variant``: call its ``matmul`` with that variant instead of its forward."""
    import copy

    x = torch.randn(m, k, generator=gen).to(dtype)
    want = cpu_layer(x).double()
    w = cpu_layer.dequantize(torch.float64)
    ref = x.double() @ w.t() + cpu_layer.bias.double()
    if gpu_cls is None:
        gpu = copy.deepcopy(cpu_layer).to(DEV)
    else:
        gpu = gpu_cls(cpu_layer.scheme, bias=cpu_layer.bias is not None, dtype=dtype).to(DEV)
        gpu.load_state_dict({k: v.to(DEV) for k, v in cpu_layer.state_dict().items()})
    got = (gpu(x.to(DEV)) if variant is None else gpu.matmul(x.to(DEV), variant=variant)).cpu().double()
    scale = float(ref.abs().max())
    say(f"| {name} | {k}x{n} | {str(dtype)[6:]} | {m} | {float((got - want).abs().max()) / scale:.2e} | "
        f"{float((got - ref).abs().max()) / scale:.2e} | {float((want - ref).abs().max()) / scale:.2e} |")


def checks(args: argparse.Namespace) -> None:
    from qlinear.kernels.exl2_triton import Exl2TritonLinear
    from qlinear.kernels.exllamav2 import AwqExllamaV2Linear, ExllamaV2Linear

    say("## Checks: GPU layer vs the same layer on CPU, and both vs float64 x @ W^T (max |diff| / max |y|)")
    say()
    say("| layer | K x N | dtype | M | GPU vs CPU | GPU vs fp64 | CPU vs fp64 |")
    say("|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    k, n = 1024, 2048
    cases = [("ExllamaV2Linear act-order", exv2_layer(ExllamaV2Linear, k, n, gen, True), torch.float16),
             ("ExllamaV2Linear", exv2_layer(ExllamaV2Linear, k, n, gen, False), torch.bfloat16),
             ("AwqExllamaV2Linear", exv2_layer(AwqExllamaV2Linear, k, n, gen, False), torch.float16),
             ("Exl2TorchLinear", exl2_layer(k, n, gen), torch.bfloat16),
             ("Exl2TorchLinear", exl2_layer(k, n, gen), torch.float16)]
    for name, layer, dtype in cases:
        for m in (1, 7, 64):
            row(name, k, n, m, layer, dtype, gen)
    for dtype in (torch.bfloat16, torch.float16):  # GPU: the Triton segments; CPU: the exact torch decode
        layer = exl2_layer(k, n, gen)
        for m in (1, 7, 64, 300):
            row("Exl2TritonLinear", k, n, m, layer, dtype, gen, gpu_cls=Exl2TritonLinear)
        for m in (1, 4, 9, 16):  # every segment in one launch
            row("Exl2TritonLinear exl2_tc", k, n, m, layer, dtype, gen, gpu_cls=Exl2TritonLinear, variant="exl2_tc")
    say()


class Forced(torch.nn.Module):
    """An ``Exl2TritonLinear`` called with a fixed variant (and config) for side-by-side timing."""

    def __init__(self, layer, variant: str, config=None) -> None:
        super().__init__()
        self.layer, self.variant, self.config = layer, variant, config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer.matmul(x, variant=self.variant, config=self.config)


def timing(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed
    from qlinear.kernels.exl2_triton import Exl2TritonLinear
    from qlinear.kernels.exllamav2 import ExllamaV2Linear

    say("## Timing: bf16 F.linear (cuBLAS) vs ExllamaV2Linear act-order (Triton route), Exl2TritonLinear (its forward; "
        "and one segment at a time, gemv_tc each, at M <= 16) and Exl2TorchLinear (us per call; ratio = time / bf16)")
    say()
    say("| K x N | M | bf16 | ExllamaV2Linear g128 | ratio | Exl2TritonLinear 3.9b | ratio | per segment | ratio "
        "| Exl2TorchLinear 3.9b | ratio |")
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(1)
    ggen = torch.Generator(device=DEV).manual_seed(1)
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, ggen)
        base_v2 = exv2_layer(ExllamaV2Linear, k, n, gen, True)
        base_x2 = exl2_layer(k, n, gen)
        base_xt = exl2_layer(k, n, gen, Exl2TritonLinear).to(DEV)
        v2 = [base_v2.to(DEV)] + [_clone(base_v2) for _ in range(copies(n * k // 2) - 1)]
        xt = [base_xt] + [_clone(base_xt) for _ in range(copies(n * k // 2) - 1)]
        one = [Forced(layer, "gemv_tc") for layer in xt]  # one segment at a time
        x2 = [base_x2.to(DEV), _clone(base_x2)]  # decode-bound: two copies, few replays
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=ggen)
            tb = timed(wb, x, args.reps)
            cells = []
            for layers, reps in ((v2, args.reps), (xt, args.reps), (one, args.reps), (x2, min(args.reps, 5))):
                if layers is one and m > 16:
                    cells += ["-", "-"]
                    continue
                try:
                    t = timed(list(layers), x, reps)
                    cells += [f"{t:.1f}", f"{t / tb:.2f}"]
                except Exception as err:  # report, keep the table going
                    cells += [f"failed: {type(err).__name__}: {str(err)[:80]}", "-"]
            say(f"| {k}x{n} | {m} | {tb:.1f} | " + " | ".join(cells) + " |")
        if args.sweep and (k, n) == args.shapes[0]:
            sweep(xt, wb, k, args.reps, ggen)
        del wb, v2, xt, x2, one
        torch.cuda.empty_cache()
    say()


def sweep(layers: list, dense: list, k: int, reps: int, ggen: torch.Generator) -> None:
    """The one-launch kernel's total split (``split_k`` x segments, shared by bytes), step size and prefetch."""
    import dataclasses

    from gpu_linear import timed

    say()
    say(f"### One launch (exl2_tc) configs, K = {k}: us per call (bf16 in the header)")
    say()
    for m in (1, 4, 16):
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=ggen)
        base = layers[0].fused_config(m, DEV, variant="exl2_tc")
        if base is None:
            say(f"M = {m}: no gemv_tc config for the widest segment (skipped)")
            continue
        say(f"M = {m}, bf16 {timed(dense, x, reps):.1f} us; default {base}")
        say()
        say("| split_k | block_k | prefetch | us |")
        say("|---|---|---|---|")
        for split in (2, 4, 8, 16):
            for bk in (64, 128, 256):
                for pre in (False, True):
                    cfg = dataclasses.replace(base, split_k=split, block_k=bk, prefetch=pre)
                    try:
                        t = f"{timed([Forced(layer, 'exl2_tc', cfg) for layer in layers], x, reps):.1f}"
                    except Exception as err:  # report, keep going
                        t = f"failed: {type(err).__name__}: {str(err)[:60]}"
                    say(f"| {split} | {bk} | {pre} | {t} |")
        say()


def _clone(layer):
    import copy

    return copy.deepcopy(layer)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, SHAPES, MS, reps=20)
    p.add_argument("--sweep", action="store_true", help="time the one-launch kernel's configs (first shape)")
    return parse_args(p, argv)


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)

    def body() -> None:
        if not args.no_check:
            checks(args)
        timing(args)

    return run("gpu_exl2", "ExLlamaV2 / EXL2", argv, args.out, body)


if __name__ == "__main__":
    main()
