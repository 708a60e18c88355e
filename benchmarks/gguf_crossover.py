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
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gguf_linear import copies, gpu_us, layer, random_blocks
from qlinear.kernels.gguf_triton import GGUFTritonKernel
from qlinear.kernels.triton import fragment_order
from qlinear.kernels.triton.gguf_configs import CROSSOVERS

VARIANTS = ("gemv", "skinny", "gemm", "dense")
#: the GPTQ variants that take additive offsets: what Q4_K's default runtime runs (``affine_offsets.NO_OFFSETS``)
RUNTIME_VARIANTS = ("gemv_tc", "gemv", "skinny2", "gemm2", "gemm5", "dense")
#: above these M a variant is not timed (it is far behind by then; gemv launches one program per row)
LIMITS = {"gemv": 16, "gemv_tc": 16, "skinny": 128, "skinny2": 128, "gemm": 4096, "gemm2": 4096,
          "gemm5": fragment_order.MAX_M, "dense": 1 << 20}
TOL = 1e-2  # bf16 activations and outputs


def rel_err(y: torch.Tensor, want: torch.Tensor) -> float:
    return float((y.double() - want).norm() / want.norm())


def timed(fn_of: Callable[[torch.nn.Module], object], lays: list, want: torch.Tensor, what: str) -> float:
    """Median us of ``fn_of`` over the copies, after its output on the first is checked (NaN: it failed)."""
    err = rel_err(fn_of(lays[0]), want)  # type: ignore[arg-type]
    if err > TOL:
        print(f"FAIL {what}: relative error {err:.2e}", flush=True)
        return float("nan")
    return gpu_us([lambda lay=lay: fn_of(lay) for lay in lays])


def cols(times: dict[str, float], names: tuple[str, ...]) -> str:
    return " | ".join(f"{times[v]:.1f}" if v in times else "-" for v in names)


def fastest(times: dict[str, float], t_bf16: float) -> str:
    good = [(t, v) for v, t in times.items() if t == t]
    return f"{min(good)[1]} ({t_bf16 / min(good)[0]:.2f}x)" if good else "-"


def cell(qt: str, k: int, n: int, ms: tuple[int, ...]) -> bool:
    raw = random_blocks(qt, n, k, "cuda")
    lays = [layer(GGUFTritonKernel, qt, k, n, raw.clone(), torch.bfloat16, affine_runtime=False)
            for _ in range(copies(raw.numel()))]
    # the default layer: Q4_K's two-level runtime in place of its blocks, other types their blocks
    rt = [layer(GGUFTritonKernel, qt, k, n, raw.clone(), torch.bfloat16) for _ in range(copies(raw.numel()))]
    rt = rt if rt[0].affine_packed() is not None else []
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies(2 * n * k))]
    w64 = lays[0].dequantize(torch.float32).double()
    ok = True
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        want = x.double() @ w64.t()
        t_bf16 = gpu_us([lambda w=w: torch.nn.functional.linear(x, w) for w in dense])  # noqa: B023
        blk = {v: timed(lambda lay, v=v: lay.matmul(x, variant=v), lays, want, f"{qt} {k}x{n} M={m} {v}")  # noqa: B023
               for v in VARIANTS if m <= LIMITS[v]}
        run = {v: timed(lambda lay, v=v: lay.matmul(x, variant=v), rt, want, f"{qt} {k}x{n} M={m} runtime {v}")  # noqa: B023
               for v in RUNTIME_VARIANTS if rt and m <= LIMITS[v]}
        t_def = timed(lambda lay: lay(x), rt or lays, want, f"{qt} {k}x{n} M={m} default layer")  # noqa: B023
        ok &= all(t == t for t in (*blk.values(), *run.values(), t_def))
        auto = lays[0].config(m, x.device).variant
        print(f"| {k}x{n} | {qt} | {m} | {t_bf16:.1f} | {cols(blk, VARIANTS)} | {auto} | {fastest(blk, t_bf16)} | "
              f"{cols(run, RUNTIME_VARIANTS)} | {fastest(run, t_bf16)} | {t_def:.1f} ({t_bf16 / t_def:.2f}x) |",
              flush=True)
    del lays, rt, dense
    return ok


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
    print("| K x N | type | M | bf16 us | blocks: gemv | skinny | gemm | dense | blocks AUTO | fastest on blocks | "
          "runtime: gemv_tc | gemv | skinny2 | gemm2 | gemm5 | dense | fastest on the runtime | "
          "default layer us (vs bf16) |\n"
          + "| --- " * 18 + "|", flush=True)
    ok, t0 = True, time.time()
    for k, n in shapes:
        for qt in a.qtypes.split(","):
            ok &= cell(qt, k, n, ms)
    verdict = "all outputs within" if ok else "FAILURES above; tolerance"
    print(f"\n{verdict} {TOL} of float64 ({time.time() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
