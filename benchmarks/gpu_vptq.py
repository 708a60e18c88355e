"""VPTQ on the GPU: ``VPTQCudaLinear`` (Triton) checked against ``VPTQLinear`` (exact Torch) and a float64 product,
then timed side by side with bf16 ``F.linear`` (cuBLAS).

    PYTHONPATH=src python benchmarks/gpu_vptq.py                     # checks + the table
    PYTHONPATH=src python benchmarks/gpu_vptq.py --no-check --shapes 4096x14336 --ms 1

Configurations, as VPTQ's released Llama checkpoints use them (one codebook group per layer, ``enable_norm`` and
``enable_perm`` on, no outliers): ``v8-k65536`` (2 bits per weight: a 16-bit code per 8 weights) and
``v8-k65536-256`` (3 bits: plus an 8-bit residual code). Random codes and codebooks are valid layers.

Checks: the Triton decode pass writes bit for bit the weight the Torch kernel decodes (itself bit-exact with VPTQ and
GPTQModel, tests/external/test_vptq_producers.py); the Triton layer's output against ``VPTQLinear`` and both against
``x @ W^T`` in float64. Timing (``gpu_linear.timed``/``copies``): a CUDA graph calling the op once per layer copy,
copies together over 4x L2, replayed ``--reps`` times; median per call. Shapes are ``K x N``; activations bfloat16,
codebooks float16 (as released). Times include the per-call gather of ``x`` by ``perm``. Ratios are time VPTQ / time
bf16 (< 1: faster). VPTQ's own CUDA kernel (the vptq wheel's extension) is not timed: its wheel is built for another
torch than this environment's. ``$OUT`` (a directory), when set, receives the report as ``gpu_vptq.md``.
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
CONFIGS = {"v8-k65536": (8, 65536, -1), "v8-k65536-256": (8, 65536, 256)}
DEV = torch.device("cuda")
def scheme(k: int, n: int, cfg: str):
    from qlinear.layouts.vptq import VptqParams
    from qlinear.spec import Scheme

    v, c, r = CONFIGS[cfg]
    p = VptqParams(vector_len=v, num_centroids=c, group_num=1, group_size=k, num_res_centroids=r, enable_norm=True,
                   enable_perm=True, codebook_dtype=torch.float16, aux_dtype=torch.int16)
    return Scheme(bits=p.nominal_bits(), group_size=-1, in_features=k, out_features=n, method="vptq", format="vptq",
                  layout_params=p)


def random_layer(k: int, n: int, cfg: str, gen: torch.Generator, cls=None):
    """A random VPTQ layer of ``cls`` (default VPTQCudaLinear) built on the GPU, prepared."""
    from qlinear.kernels.vptq import VPTQCudaLinear

    layer = (cls or VPTQCudaLinear)(scheme(k, n, cfg), bias=False, dtype=torch.bfloat16).to(DEV)
    with torch.no_grad():
        for name, t in layer.tensors().items():
            if name == "indices":
                t.copy_(torch.randint(-2**31, 2**31 - 1, t.shape, dtype=torch.int32, device=DEV, generator=gen))
            elif name == "perm":
                t.copy_(torch.randperm(k, device=DEV, generator=gen).to(torch.int32).to(torch.int16))
            elif name == "weight_scale":
                t.copy_(torch.rand(t.shape, device=DEV, generator=gen) * 0.02 + 0.01)
            elif name == "weight_bias":
                t.copy_(torch.randn(t.shape, device=DEV, generator=gen) * 1e-3)
            else:
                scale = 0.1 if name.startswith("res_") else 1.0
                t.copy_(torch.randn(t.shape, device=DEV, generator=gen) * scale)
    layer.prepare()
    return layer


def checks(args: argparse.Namespace) -> None:
    from qlinear.kernels.triton import vptq_mv
    from qlinear.kernels.vptq import VPTQLinear

    say("## Checks: VPTQCudaLinear vs VPTQLinear (exact decode, Torch) and vs float64 x @ W^T")
    say()
    say("| K x N | config | M | path | decode identical | rel err vs Torch | rel err vs fp64 |")
    say("|---|---|---|---|---|---|---|")
    gen = torch.Generator(device=DEV).manual_seed(0)
    for (k, n), cfg in (((4096, 14336), "v8-k65536"), ((14336, 4096), "v8-k65536-256"), ((1000, 200), "v8-k65536")):
        tri = random_layer(k, n, cfg, gen)
        ref = VPTQLinear(tri.scheme, bias=False, dtype=torch.bfloat16).to(DEV)
        ref.load_state_dict(tri.state_dict())
        ref.prepare()
        w = ref.dequantize()
        t = tri.tensors()
        dec = vptq_mv.decode_main(t["indices"], t["centroids.weight"], t.get("res_centroids.weight"),
                                  tri._rt_scale, tri._rt_bias, tri.params, n, k, torch.float16)
        same = bool(torch.equal(dec, w[:, tri._rt_perm]))
        w64 = w.to(torch.bfloat16).double()
        for m in (1, 4, 16, 64):
            x = torch.randn(m, k, device=DEV, generator=gen).to(torch.bfloat16)
            want = ref(x)
            got = tri(x)
            exact = x.double() @ w64.t()
            e_ref = float((got.double() - want.double()).norm() / exact.norm())
            e_64 = float((got.double() - exact).norm() / exact.norm())
            path = "gemv" if m <= vptq_mv.GEMV_ROUTE_M else "mma" if m <= vptq_mv.MMA_MAX_M else "dense"
            say(f"| {k}x{n} | {cfg} | {m} | {path} | {same} | {e_ref:.2e} | {e_64:.2e} |")
        del tri, ref, w, dec
        torch.cuda.empty_cache()
    say()


def timing(args: argparse.Namespace) -> None:
    from gpu_linear import copies, timed

    say("## Timing: bf16 F.linear (cuBLAS) vs VPTQCudaLinear (us per call, median of CUDA graph replays)")
    say()
    head = " | ".join(f"{c} | ratio" for c in args.configs)
    say(f"| K x N | M | bf16 | {head} |")
    say("|---|---|---|" + "---|---|" * len(args.configs))
    gen = torch.Generator(device=DEV).manual_seed(0)
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, gen)
        runs = {}
        for cfg in args.configs:
            one = random_layer(k, n, cfg, gen)
            nbytes = sum(t.numel() * t.element_size() for t in one.tensors().values())
            layers = [one] + [random_layer(k, n, cfg, gen) for _ in range(copies(nbytes) - 1)]
            runs[cfg] = [lambda x, lay=lay: lay.product(x) for lay in layers]
        for m in args.ms:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            tb = timed(wb, x, args.reps)
            cells = []
            for cfg in args.configs:
                tv = timed(runs[cfg], x, args.reps)
                cells.append(f"{tv:.1f} | {tv / tb:.2f}")
            say(f"| {k}x{n} | {m} | {tb:.1f} | {' | '.join(cells)} |")
        del wb, runs
        torch.cuda.empty_cache()
    say()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, SHAPES, MS, reps=30)
    p.add_argument("--configs", default=",".join(CONFIGS))
    args = parse_args(p, argv)
    args.configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        p.error(f"unknown config(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)

    def body() -> None:
        if not args.no_check:
            checks(args)
        timing(args)

    return run("gpu_vptq", "VPTQ", argv, args.out, body)


if __name__ == "__main__":
    main()
