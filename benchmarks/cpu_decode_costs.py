"""Two costs on the CPU int4 decode path, one thread, each beside what it is weighed against (ms, median):

    python benchmarks/cpu_decode_costs.py [--shape 4096x14336] [--ms 64,256] [--reps 5]

1. The scales and offsets the decode path takes from the runtime's (scale, offset) pairs per call
   (``Int4PackRuntime.scales()`` / ``offsets()``, no longer kept beside them) against the whole
   ``decode_matmul`` call, for GPTQ 4-bit groups of 128 and 32.
2. An 8-bit MLX layer (two nibble parts along K, ``MlxCpuLinear``): the layer as AUTO runs it, the decode path
   over both parts, and a prototype that adds the two parts' decoded tiles before one GEMM of the real K (not in
   the library: it lost), against dense bf16 ``F.linear``. Needs the native extra's decoder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_formats import median_ms


def folded_matmul(rt: object, xp: torch.Tensor, fold: int, tile_elements: int = 1 << 20) -> torch.Tensor:
    """The prototype: decode ``2 fold`` positions a tile (native decoder), add the halves, one GEMM of ``fold``."""
    from qlinear.kernels.cpu_int4 import native_decoder

    native = native_decoder()
    m, kp = xp.shape
    bl = rt.block
    tiles = max(1, tile_elements // (kp * bl))
    cols = bl * tiles
    scales = rt.scales()
    w = torch.empty(kp, cols, dtype=torch.bfloat16)
    wf = torch.empty(fold, cols, dtype=torch.bfloat16)
    y = torch.empty(m, rt.n_pad, dtype=torch.bfloat16)
    for b0 in range(0, rt.n_pad // bl, tiles):
        t = min(tiles, rt.n_pad // bl - b0)
        native(rt.packed[b0].data_ptr(), scales.data_ptr(), w.data_ptr(), kp, rt.group, rt.n_pad, b0 * bl, t,
               bl // 2, cols)
        f = wf[:, :t * bl]
        torch.add(w[:fold, :t * bl], w[fold:2 * fold, :t * bl], out=f)
        y[:, b0 * bl:(b0 + t) * bl] = xp[:, :fold] @ f
    sums = xp.float().reshape(m, -1, rt.group).sum(2)
    return y.float() + sums @ rt.offsets()


def main(argv: list[str] | None = None) -> str:
    from qlinear import create_layer, quantize_rtn
    from qlinear.kernels.cpu_int4 import decode_matmul, native_decoder
    from qlinear.kernels.mlx_cpu import MlxCpuLinear
    from qlinear.layouts.mlx import scheme_for
    from qlinear.mlx_quant import quantize

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x14336")
    p.add_argument("--ms", default="64,256")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    k, n = (int(v) for v in args.shape.split("x"))
    ms = [int(v) for v in args.ms.split(",")]
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=gen) * 0.02
    lines = [f"command: python benchmarks/cpu_decode_costs.py --shape {args.shape} --ms {args.ms} --reps {args.reps}",
             "", "| GPTQ 4-bit | M | decode_matmul ms | scales() + offsets() ms | share |", "|---|---|---:|---:|---:|"]
    for group in (128, 32):
        rt = create_layer(quantize_rtn(w, bits=4, group_size=group, sym=False), dtype=torch.bfloat16)._rt
        tiles = max(1, (1 << 19) // (rt.k_pad * rt.block))
        for m in ms:
            x = torch.randn(m, rt.k_pad, generator=gen).bfloat16()
            whole = median_ms(lambda x=x, rt=rt, tiles=tiles: decode_matmul(rt, x, tiles), args.reps)
            part = median_ms(lambda rt=rt: (rt.scales(), rt.offsets()), args.reps)
            lines.append(f"| g{group} | {m} | {whole:.2f} | {part:.3f} | {part / whole:.3f} |")
    lines += ["", "| MLX 8-bit g64 | M | dense bf16 | layer (AUTO) | decode, both parts | folded decode (prototype) | "
              "folded vs layer, rel. diff |", "|---|---|---:|---:|---:|---:|---:|"]
    if native_decoder() is None:
        lines.append("| (the native extra is not installed: `pip install ./native`) | | | | | | |")
        text = "\n".join(lines)
        print(text)
        return text
    layer = MlxCpuLinear(scheme_for(8, 64, k, n), dtype=torch.bfloat16)
    layer.load_mlx(quantize(w.bfloat16(), bits=8, group_size=64))
    dense = layer.dequantize(torch.float32).bfloat16()
    with torch.no_grad():
        layer(torch.zeros(1, k, dtype=torch.bfloat16))
        rt = layer._rt
        tiles = max(1, (1 << 19) // (rt.k_pad * rt.block))
        for m in ms:
            x = torch.randn(m, k, generator=gen).bfloat16()
            xp = x.index_select(1, layer._rows)
            cells = [median_ms(f, args.reps) for f in (lambda x=x: F.linear(x, dense), lambda x=x: layer(x),
                                                       lambda xp=xp: decode_matmul(rt, xp, tiles),
                                                       lambda xp=xp: folded_matmul(rt, xp, k))]
            got, want = folded_matmul(rt, xp, k)[:, :n], layer(x).float()
            diff = float((got - want).norm() / want.norm())
            lines.append(f"| {k}x{n} | {m} | " + " | ".join(f"{c:.1f}" for c in cells) + f" | {diff:.1e} |")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
