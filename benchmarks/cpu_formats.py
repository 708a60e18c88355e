"""The issue-24 formats on this CPU, one thread: each format's exact Torch kernel against dense bf16 ``F.linear`` and
GPTQ 4-bit on AUTO's CPU kernel, side by side in one run (median of ``--reps`` calls, milliseconds).

    python benchmarks/cpu_formats.py                       # 4096x14336, M = 1 and 16
    python benchmarks/cpu_formats.py --shapes 1024x1024 --ms 1 --reps 2
    python benchmarks/cpu_formats.py --only MLX,EXL2   # those rows only

Layers are random but valid (every code pattern decodes): MLX 4-bit g64 (mlx's own quantizer, in torch),
VPTQ v8 k65536 (2 bits), EXL3 4-bit 3INST, EXL2 at about 3.9 bits, ParoQuant 4-bit g128 with 8 rotation rounds.
These kernels decode the weight tile by tile inside every forward (no dense copy is kept), so they are the
portable, exact path, not the fast one; the fast paths are the CUDA kernels (benchmarks/gpu_*.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

LINES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def gptq(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear import create_layer, quantize_rtn

    q = quantize_rtn(torch.randn(n, k, generator=gen) * 0.02, bits=4, group_size=128, sym=True)
    return create_layer(q, format="gptq_v2", dtype=torch.bfloat16)


def mlx(k: int, n: int, gen: torch.Generator, cls: type | None = None, bits: int = 4) -> torch.nn.Module:
    """An MLX g64 layer quantized by qlinear's transcription of mlx's quantizer; ``cls``: the kernel (default the
    exact ``MlxTorchLinear``)."""
    from qlinear.kernels.mlx_torch import MlxTorchLinear
    from qlinear.layouts.mlx import scheme_for
    from qlinear.mlx_quant import quantize

    layer = (cls or MlxTorchLinear)(scheme_for(bits, 64, k, n), dtype=torch.bfloat16)
    layer.load_mlx(quantize((torch.randn(n, k, generator=gen) * 0.02).bfloat16(), bits=bits, group_size=64))
    return layer


def mlx_parts(k: int, n: int, gen: torch.Generator, bits: int = 4) -> torch.nn.Module:
    from qlinear.kernels.mlx_cpu import MlxCpuLinear

    return mlx(k, n, gen, MlxCpuLinear, bits)


def mlx8_parts(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    return mlx_parts(k, n, gen, 8)


def vptq(k: int, n: int, gen: torch.Generator, cls: type | None = None, v: int = 8,
         codebook: torch.dtype = torch.float16, residual: int = 0) -> torch.nn.Module:
    """v8 k65536 (2 bits), norm and permutation; ``cls``: the kernel (default the exact ``VPTQLinear``); ``v``,
    ``codebook`` and ``residual``: another vector length, codebook dtype or residual codebook size."""
    from qlinear.kernels.vptq import VPTQLinear
    from qlinear.layouts.vptq import VptqParams
    from qlinear.spec import Scheme

    p = VptqParams(vector_len=v, num_centroids=65536, group_num=1, group_size=k, num_res_centroids=residual,
                   enable_norm=True, enable_perm=True, codebook_dtype=codebook, aux_dtype=torch.int16)
    s = Scheme(bits=p.nominal_bits(), group_size=-1, in_features=k, out_features=n, method="vptq", format="vptq",
               layout_params=p)
    layer = (cls or VPTQLinear)(s, dtype=torch.bfloat16)
    with torch.no_grad():
        for name, t in layer.tensors().items():
            if name == "indices":
                t.copy_(torch.randint(-2**31, 2**31 - 1, t.shape, dtype=torch.int32, generator=gen))
            elif name == "perm":
                t.copy_(torch.randperm(k, generator=gen).to(torch.int16))
            else:
                t.copy_(torch.rand(t.shape, generator=gen) * 0.02 + 0.01)
    return layer


def vptq_native(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear.kernels.vptq_cpu import VPTQCpuLinear

    return vptq(k, n, gen, VPTQCpuLinear)


def vptq_native_bf16(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear.kernels.vptq_cpu import VPTQCpuLinear

    return vptq(k, n, gen, VPTQCpuLinear, codebook=torch.bfloat16)


def vptq_native_v12(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear.kernels.vptq_cpu import VPTQCpuLinear

    return vptq(k, n, gen, VPTQCpuLinear, v=12)


def vptq_native_v16(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear.kernels.vptq_cpu import VPTQCpuLinear

    return vptq(k, n, gen, VPTQCpuLinear, v=16, residual=65536)


def exl3(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear.kernels.exl3 import ExllamaV3TorchLinear
    from qlinear.layouts.exl3 import Exl3Params
    from qlinear.spec import Scheme

    s = Scheme(bits=4, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
               pack_dtype=torch.int16, layout_params=Exl3Params(4, "3inst"))
    layer = ExllamaV3TorchLinear(s, dtype=torch.bfloat16)
    layer.load_exl3({"trellis": torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 64), generator=gen,
                                              dtype=torch.int16),
                     "suh": (torch.randn(k, generator=gen) * 0.05).half(),
                     "svh": (torch.randn(n, generator=gen) * 0.05).half()})
    return layer


def exl2(k: int, n: int, gen: torch.Generator, cls: type | None = None) -> torch.nn.Module:
    """The same 3.9-bit mix each call (the seed is the caller's generator); ``cls``: the kernel (default the exact
    ``Exl2TorchLinear``)."""
    from qlinear.kernels.exl2 import Exl2TorchLinear
    from qlinear.layouts import exl2 as layout
    from qlinear.spec import Scheme

    widths = [8] * (k // 1024) + [6] * (k // 1024) + [5] * (k // 512) + [4] * (k // 64)
    widths += [3] * (k // 32 - len(widths))
    p = layout.Exl2Params(tuple(widths), (32,) * len(widths))
    codes = torch.cat([torch.randint(0, 1 << b, (32, n), generator=gen) for b in widths])
    scale_max = (torch.rand(len(widths), generator=gen) * 0.02 + 0.002).half()
    t = layout.encode(codes, torch.randint(0, 16, (len(widths), n), generator=gen), scale_max,
                      torch.randperm(k, generator=gen), p)
    s = Scheme(bits=p.max_bits, group_size=-1, in_features=k, out_features=n, method="exl2", format="exl2",
               layout_params=p)
    layer = (cls or Exl2TorchLinear)(s, dtype=torch.bfloat16)
    layer.load_state_dict(t)
    return layer


def exl2_parts(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear.kernels.exl2_cpu import Exl2CpuLinear

    return exl2(k, n, gen, Exl2CpuLinear)


def paroquant(k: int, n: int, gen: torch.Generator, cls: type | None = None) -> torch.nn.Module:
    """4-bit g128 with 8 rotation rounds; ``cls``: the kernel (default the exact ``ParoLinear``)."""
    from qlinear.kernels.paroquant import ParoLinear
    from qlinear.layouts.paroquant import ParoParams
    from qlinear.spec import Scheme

    gs, krot = 128, 8
    s = Scheme(bits=4, group_size=gs, in_features=k, out_features=n, method="paroquant", format="paroquant",
               layout_params=ParoParams(krot))
    layer = (cls or ParoLinear)(s, dtype=torch.bfloat16)
    layer.load_state_dict({
        "qweight": torch.randint(-2**31, 2**31 - 1, (k, n // 8), dtype=torch.int32, generator=gen),
        "qzeros": torch.randint(-2**31, 2**31 - 1, (k // gs, n // 8), dtype=torch.int32, generator=gen),
        "scales": (torch.rand(k // gs, n, generator=gen) * 0.01 + 0.001).half(),
        "pairs": torch.stack([torch.cat([torch.randperm(gs, generator=gen) for _ in range(k // gs)])
                              for _ in range(krot)]).to(torch.int16),
        "theta": ((torch.rand(krot, k // 2, generator=gen) * 2 - 1) * 3.2).half(),
        "channel_scales": (torch.rand(1, k, generator=gen) * 1.5 + 0.5).half()})
    return layer


def paroquant_int4(k: int, n: int, gen: torch.Generator) -> torch.nn.Module:
    from qlinear.kernels.paro_cpu import ParoCpuLinear

    return paroquant(k, n, gen, ParoCpuLinear)


FORMATS: dict[str, Callable[[int, int, torch.Generator], torch.nn.Module]] = {
    "GPTQ 4-bit g128 (AUTO)": gptq, "MLX 4-bit g64": mlx, "MLX 4-bit g64 (AUTO: int4 kernels)": mlx_parts,
    "MLX 8-bit g64 (AUTO: two nibble parts)": mlx8_parts, "VPTQ v8 k65536 (2-bit)": vptq,
    "VPTQ v8 k65536 (2-bit) (AUTO with the native extra: vq_mv)": vptq_native,
    "VPTQ v8 k65536, bfloat16 codebook (AUTO, native)": vptq_native_bf16,
    "VPTQ v12 k65536 (1.3-bit) (AUTO, native)": vptq_native_v12,
    "VPTQ v16 k65536 + residual k65536 (2-bit) (AUTO, native)": vptq_native_v16, "EXL3 4-bit": exl3,
    "EXL2 ~3.9-bit": exl2, "EXL2 ~3.9-bit (AUTO: 4-bit parts)": exl2_parts, "ParoQuant 4-bit g128": paroquant,
    "ParoQuant 4-bit g128 (AUTO: rotation + int4 kernels)": paroquant_int4}


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4096x14336", help="K x N, comma separated")
    p.add_argument("--ms", default="1,16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--only", default="", help="comma-separated substrings: time only the layers whose names "
                                              "contain one (dense bf16 always)")
    args = p.parse_args(argv)
    only = [v for v in args.only.split(",") if v]
    torch.set_num_threads(1)
    say("# issue-24 formats on CPU, one thread (ms per call, median; ratio = time / dense bf16)")
    say()
    say(f"command: python benchmarks/cpu_formats.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    say()
    ms = [int(v) for v in args.ms.split(",")]
    say("| K x N | layer | kernel | " + " | ".join(f"M={m} ms | ratio" for m in ms) + " |")
    say("|---|---|---|" + "---|---|" * len(ms))
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        gen = torch.Generator().manual_seed(0)
        w = (torch.randn(n, k, generator=gen) * 0.02).bfloat16()
        xs = {m: torch.randn(m, k, generator=gen).bfloat16() for m in ms}
        dense = {m: median_ms(lambda x=xs[m], w=w: F.linear(x, w), args.reps) for m in ms}
        say(f"| {k}x{n} | dense bf16 | F.linear | " + " | ".join(f"{dense[m]:.2f} | 1.00" for m in ms) + " |")
        for name, make in FORMATS.items():
            if only and not any(v in name for v in only):
                continue
            layer = make(k, n, gen)
            with torch.no_grad():
                cells = [median_ms(lambda x=xs[m], layer=layer: layer(x), args.reps) for m in ms]
            say(f"| {k}x{n} | {name} | {type(layer).__name__} | "
                + " | ".join(f"{t:.2f} | {t / dense[m]:.2f}" for t, m in zip(cells, ms)) + " |")
            del layer
    say()
    return "\n".join(LINES) + "\n"


if __name__ == "__main__":
    main()
