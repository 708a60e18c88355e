"""Where ``VPTQCpuLinear`` should switch from ``vq_mv`` to the decoded tiles, per layer: each VPTQ layer of
``cpu_formats.py`` at M rows through both paths, one thread, median of ``--reps`` calls (ms), side by side.

    python benchmarks/cpu_vptq_bound.py                    # v8, v12, v16 + residual; M = 4, 8, 12, 16
    python benchmarks/cpu_vptq_bound.py --ms 8,12 --reps 5

The rows bound (``vptq_cpu.mv_max_m``) is set past M to time ``vq_mv`` and to 0 to time the tiles.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_formats  # (also puts src/ on the path)

LAYERS = {"v8 k65536": cpu_formats.vptq_native, "v12 k65536": cpu_formats.vptq_native_v12,
          "v16 k65536 + residual k65536": cpu_formats.vptq_native_v16}


def main() -> None:
    from qlinear.kernels import vptq_cpu

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="4096x14336", help="K x N")
    p.add_argument("--ms", default="4,8,12,16")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    k, n = (int(v) for v in args.shape.split("x"))
    ms = [int(v) for v in args.ms.split(",")]
    print(f"command: python benchmarks/cpu_vptq_bound.py --shape {args.shape} --ms {args.ms} --reps {args.reps}\n")
    print("| layer (codebooks) | " + " | ".join(f"M={m} mv / tiles" for m in ms) + " |")
    print("|---|" + "---|" * len(ms))
    saved = (vptq_cpu.MV_MAX_M, vptq_cpu.MV_MAX_M_LARGE_TABLES)
    for name, make in LAYERS.items():
        layer = make(k, n, torch.Generator().manual_seed(0))
        q = layer.params
        mib = q.group_num * (q.num_centroids + max(q.num_res_centroids, 0)) * q.vector_len * 2 / 2**20
        cells = []
        for m in ms:
            x = torch.randn(m, k, dtype=torch.bfloat16)
            times = []
            for bound in (m, 0):
                vptq_cpu.MV_MAX_M = vptq_cpu.MV_MAX_M_LARGE_TABLES = bound
                times.append(cpu_formats.median_ms(lambda layer=layer, x=x: layer(x), args.reps))
            cells.append(f"{times[0]:.1f} / {times[1]:.1f}")
        vptq_cpu.MV_MAX_M, vptq_cpu.MV_MAX_M_LARGE_TABLES = saved
        print(f"| {name} ({mib:g} MiB) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
