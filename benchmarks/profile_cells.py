"""The cells of issue 25 that miss their target, run for Nsight Compute: each layer (built as ``e2e_decoder.py``
builds its linears, backend AUTO) and bf16 ``F.linear`` on the same shape, inside one NVTX range per cell.

    ncu --clock-control none --nvtx --nvtx-include "cell/" --section SpeedOfLight --section WarpStateStats \\
        python benchmarks/profile_cells.py                          # every cell
    python benchmarks/profile_cells.py --cells gptq4:4096x14336:4096 # one cell, no profiler (a smoke run)

A cell is ``variant:KxN:M`` with variant one of ``gptq4``, ``int8``, ``gptq2``, ``q4_k`` (the e2e decoder's
factories), ``exl3_2`` / ``exl3_4`` (random EXL3 layers, ``gpu_exl3.py``) or ``vptq`` (v8 k65536,
``gpu_vptq.py``). Each cell warms up (Triton compile, prepare) outside the range, then runs the quantized layer
once and ``F.linear`` once inside one NVTX range ``cell`` (the cells run in the printed order), so the profiler
sees exactly the kernels of one forward and its dense peer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_decoder import BF16, affine, gguf

#: the cells of docs/performance.md that trail bf16 or a peer, with the layer that runs them
CELLS = ("gptq4:4096x14336:4096", "gptq4:8192x28672:128", "gptq4:4096x4096:1", "int8:4096x14336:1",
         "gptq2:4096x14336:1", "q4_k:4096x14336:8", "q4_k:4096x14336:2048")
def exl3(bits: int):
    def make(k: int, n: int, dev: torch.device) -> torch.nn.Module:
        from gpu_exl3 import random_tensors
        from qlinear.kernels.exl3 import ExllamaV3Linear
        from qlinear.layouts.exl3 import Exl3Params
        from qlinear.spec import Scheme

        s = Scheme(bits=bits, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
                   pack_dtype=torch.int16, layout_params=Exl3Params(bits))
        layer = ExllamaV3Linear(s).to(dev)
        layer.load_exl3(random_tensors(k, n, bits, "3inst", torch.Generator(device=dev).manual_seed(0), dev))
        return layer
    return make


def vptq(k: int, n: int, dev: torch.device) -> torch.nn.Module:
    from gpu_vptq import random_layer

    return random_layer(k, n, "v8-k65536", torch.Generator(device=dev).manual_seed(0))


FACTORIES = {"gptq4": affine(4, "auto"), "int8": affine(8, "auto"), "gptq2": affine(2, "auto"), "q4_k": gguf("Q4_K"),
             "exl3_2": exl3(2), "exl3_4": exl3(4), "vptq": vptq}


def run_cell(cell: str, dev: torch.device) -> str:
    variant, shape, m = cell.split(":")
    k, n = (int(v) for v in shape.split("x"))
    layer = FACTORIES[variant](k, n, dev)
    dense = torch.randn(n, k, device=dev, dtype=BF16) * 0.02
    x = torch.randn(int(m), k, device=dev, dtype=BF16)
    with torch.inference_mode():
        for _ in range(3):
            layer(x)
            F.linear(x, dense)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("cell")
        layer(x)
        F.linear(x, dense)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    return f"{cell}: {type(layer).__name__}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", default=",".join(CELLS))
    args = p.parse_args(argv)
    dev = torch.device("cuda")
    for cell in args.cells.split(","):
        print(run_cell(cell, dev), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
