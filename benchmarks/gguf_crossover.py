"""Every GGUF Triton variant at every M, side by side with bf16 cuBLAS: where should each variant stop?

    python benchmarks/gguf_crossover.py                      # Q4_K, Q8_0, Q6_K on 4096x14336 and 14336x4096
    python benchmarks/gguf_crossover.py --qtypes Q4_K --ms 1,8,64,512

``triton/gguf_configs.CROSSOVERS`` was measured when the ``dense`` variant decoded with torch (1.1-1.3 ms for
4096x14336); the Triton decoder now takes about a tenth of that, so dense may win much lower. For each cell this
times the raw-block variants (gemv, skinny, gemm, dense; each by its own heuristic config; ``affine_runtime=False``),
the default layer where it runs the GPTQ kernels (Q4_K: its two-level runtime in place of the blocks), and bf16
``F.linear``, every one checked against float64 of the
decoded weight first. Weights rotate over copies exceeding 4x L2 (``gguf_linear.copies``); median of CUDA-graph
replays. Prints a markdown table and the fastest raw-block variant per M.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gguf_linear import copies, gpu_us, layer, random_blocks
from qlinear.kernels.gguf_triton import GGUFTritonKernel
from qlinear.kernels.triton.gguf_configs import CROSSOVERS

VARIANTS = ("gemv", "skinny", "gemm", "dense")
#: above these M a variant is not timed (it is far behind by then; gemv launches one program per row)
LIMITS = {"gemv": 16, "skinny": 128, "gemm": 4096, "dense": 1 << 20}
TOL = 1e-2  # bf16 activations and outputs


def rel_err(y: torch.Tensor, want: torch.Tensor) -> float:
    return float((y.double() - want).norm() / want.norm())


def cell(qt: str, k: int, n: int, ms: tuple[int, ...]) -> tuple[list[str], bool]:
    raw = random_blocks(qt, n, k, "cuda")
    lays = [layer(GGUFTritonKernel, qt, k, n, raw.clone(), torch.bfloat16, affine_runtime=False)
            for _ in range(copies(raw.numel()))]
    # the default layer: Q4_K's two-level runtime in place of its blocks, other types their blocks
    aff = [layer(GGUFTritonKernel, qt, k, n, raw.clone(), torch.bfloat16) for _ in range(copies(raw.numel()))]
    aff = aff if aff[0].affine_packed() is not None else []
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies(2 * n * k))]
    w64 = lays[0].dequantize(torch.float32).double()
    rows, ok = [], True
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = x.double() @ w64.t()
        t_bf16 = gpu_us([lambda w=w: torch.nn.functional.linear(x, w) for w in dense])  # noqa: B023
        times: dict[str, float] = {}
        for v in VARIANTS:
            if m > LIMITS[v]:
                continue
            err = rel_err(lays[0].matmul(x, variant=v), want)
            if err > TOL:
                ok = False
                times[v] = float("nan")
                print(f"FAIL {qt} {k}x{n} M={m} {v}: relative error {err:.2e}", flush=True)
                continue
            times[v] = gpu_us([lambda lay=lay: lay.matmul(x, variant=v) for lay in lays])  # noqa: B023
        auto = lays[0].config(m, x.device).variant
        a_cell = "-"
        if aff:
            err = rel_err(aff[0](x), want)
            ok &= err <= TOL
            t_a = gpu_us([lambda lay=lay: lay(x) for lay in aff])  # noqa: B023
            a_cell = f"{t_a:.1f} ({t_bf16 / t_a:.2f}x){'' if err <= TOL else ' FAIL'}"
        best = min((t, v) for v, t in times.items() if t == t)
        cols = " | ".join(f"{times[v]:.1f}" if v in times else "-" for v in VARIANTS)
        t_auto = times.get(auto, best[0])
        rows.append(f"| {k}x{n} | {qt} | {m} | {t_bf16:.1f} | {cols} | {auto} ({t_bf16 / t_auto:.2f}x)"
                    f" | {best[1]} ({t_bf16 / best[0]:.2f}x) | {a_cell} |")
        print(rows[-1], flush=True)
    del lays, aff, dense
    return rows, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="4096x14336,14336x4096")
    ap.add_argument("--qtypes", default="Q4_K,Q8_0,Q6_K")
    ap.add_argument("--ms", default="1,2,4,8,16,32,64,128,256,512,1024,2048")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 2
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    ms = tuple(int(v) for v in a.ms.split(","))
    print(f"command: python benchmarks/gguf_crossover.py {' '.join(sys.argv[1:] if argv is None else argv)}\n"
          f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; CROSSOVERS now {CROSSOVERS}\n")
    print("| K x N | type | M | bf16 us | gemv | skinny | gemm | dense | AUTO (vs bf16) | fastest block variant "
          "| default layer (Q4_K runtime) us (vs bf16) |\n" + "| --- " * 11 + "|", flush=True)
    ok, t0 = True, time.time()
    for k, n in shapes:
        for qt in a.qtypes.split(","):
            _, good = cell(qt, k, n, ms)
            ok &= good
    verdict = "all outputs within" if ok else "FAILURES above; tolerance"
    print(f"\n{verdict} {TOL} of float64 ({time.time() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
