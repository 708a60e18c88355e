"""GGUF at large M (the ``dense`` variant of ``GGUFTritonKernel``): which decoder should form the transient weight.

    PYTHONPATH=src python benchmarks/gpu_gguf_dense.py [--qtypes Q4_K,Q6_K,Q4_0,Q8_0] [--shapes 4096x14336]

Per type and shape: the whole weight decoded by torch's decoders (``layouts/gguf``, float32, then cast to bf16, as
the layer did before 2026-12-05) and by the Triton ``dequant_kernel`` straight into bf16 at a few row blocks,
checked equal bit for bit; then the layer at ``--ms`` against bf16 ``F.linear`` on the same shape. Times are
medians of CUDA-event timed eager calls (us); ``$OUT``, when set, receives ``gpu_gguf_dense.md``.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import parse as parse_args
from gpu_report import parser, run, say

DEV = torch.device("cuda")
BLOCK_NS = (16, 32, 64)


def event_us(fn: Callable[[], object], reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


def row(k: int, n: int, qt: str, ms: list[int], reps: int) -> str:
    """One table row: the decoders timed and compared, then the layer with each decoder against bf16."""
    from e2e_decoder import gguf
    from qlinear.kernels import gguf_triton
    from qlinear.kernels.triton import gguf_mm

    layer = gguf(qt)(k, n, DEV)
    code = int(layer.qtype)
    ref = layer.decode_rows(0, n).to(torch.bfloat16)
    t_torch = event_us(lambda: layer.decode_rows(0, n).to(torch.bfloat16), reps)
    t_tri, equal = [], True
    for bn in BLOCK_NS:
        def triton_decode(bn: int = bn) -> torch.Tensor:
            return gguf_mm.dequantize(layer.qweight, code, k, dtype=torch.bfloat16, block_n=bn)
        equal &= torch.equal(triton_decode(), ref)
        t_tri.append(event_us(triton_decode, reps))
    cells = []
    for m in ms:
        x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
        times = []
        with torch.inference_mode():
            for decoder in ("torch", "triton"):
                gguf_triton.DENSE_DECODER = decoder
                times.append(event_us(lambda x=x: layer(x), reps))
            tb = event_us(lambda x=x: F.linear(x, ref), reps)
        cells.append(f"{times[0]:.0f} / {times[1]:.0f} / {tb:.0f}")
    return (f"| {k}x{n} | {qt} ({type(layer).__name__}) | {t_torch:.1f} | " + " | ".join(f"{t:.1f}" for t in t_tri)
            + f" | {'yes' if equal else 'NO'} | " + " | ".join(cells) + " |")


def body(args) -> None:
    say("| shape | qtype | torch decode + cast us | " + " | ".join(f"Triton BN={b} us" for b in BLOCK_NS)
        + " | equal | " + " | ".join(f"M={m}: layer (torch / Triton decoder) / bf16 us" for m in args.ms) + " |")
    say("|---|---|---|" + "---|" * len(BLOCK_NS) + "---|" + "---|" * len(args.ms))
    for k, n in args.shapes:
        for qt in args.qtypes.split(","):
            say(row(k, n, qt, args.ms, args.reps))
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> str:
    p = parser(__doc__, ((4096, 14336),), (2048,), reps=20)
    p.add_argument("--qtypes", default="Q4_K,Q6_K,Q4_0,Q8_0")
    args = parse_args(p, argv)
    return run("gpu_gguf_dense", "GGUF dense variant: decoders", argv, args.out, lambda: body(args))


if __name__ == "__main__":
    main()
