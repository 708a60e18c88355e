"""Resident bytes of CPU layers: the checkpoint's tensors against what the layer holds once prepared.

    python benchmarks/cpu_resident.py [--shape 4096x14336]

For GPTQ 4-bit (groups of 128 and 32), AWQ GEMM 4-bit, the ~3.9-bit EXL2 mix and MLX 4-bit g64 of
``cpu_formats.py``: one forward, then every tensor the layer holds (its buffers and its runtime's tensors), in
MiB and bits a weight.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

import torch


def mib(tensors: Iterable[torch.Tensor | None]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None) / 2**20


def affine(fmt: str, group: int) -> Callable[[int, int], torch.nn.Module]:
    def build(k: int, n: int) -> torch.nn.Module:
        from qlinear import create_layer, quantize_rtn

        w = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
        return create_layer(quantize_rtn(w, bits=4, group_size=group, sym=False), format=fmt, dtype=torch.bfloat16)
    return build


def exl2(k: int, n: int) -> torch.nn.Module:
    from cpu_formats import exl2_parts

    return exl2_parts(k, n, torch.Generator().manual_seed(0))


def mlx4(k: int, n: int) -> torch.nn.Module:
    from cpu_formats import mlx_parts

    return mlx_parts(k, n, torch.Generator().manual_seed(0))


def runtime_tensors(layer: torch.nn.Module) -> list[torch.Tensor]:
    rows = getattr(layer, "_rows", None)  # EXL2 / MLX on CPU: the input channel of each K position
    return [*layer._rt.tensors(), *([rows] if rows is not None else [])]


def checkpoint(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in layer.state_dict().items() if k != "bias"}


LAYERS = {"GPTQ 4-bit g128": affine("gptq_v2", 128), "GPTQ 4-bit g32": affine("gptq_v2", 32),
          "AWQ GEMM 4-bit g128": affine("gemm", 128), "EXL2 ~3.9-bit": exl2, "MLX 4-bit g64": mlx4}


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x14336")
    args = p.parse_args(argv)
    k, n = (int(v) for v in args.shape.split("x"))
    bits = 8 * 2**20 / (k * n)
    lines = [f"command: python benchmarks/cpu_resident.py --shape {args.shape}", "",
             "| layer | kernel | file MiB | file bits/w | resident MiB | resident bits/w | of which runtime | "
             "words dropped |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, build in LAYERS.items():
        layer = build(k, n)
        with torch.no_grad():
            layer(torch.zeros(1, k, dtype=torch.bfloat16))
        file = mib(checkpoint(layer).values())
        rt = mib(runtime_tensors(layer))
        kept = mib(layer.buffers())
        dropped = layer.codes_replaced
        lines.append(f"| {name} | {type(layer).__name__} | {file:.1f} | {file * bits:.2f} | {kept + rt:.1f} | "
                     f"{(kept + rt) * bits:.2f} | {rt:.1f} | {dropped} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
