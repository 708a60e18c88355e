"""Tensor-parallel scaling of a quantized Llama-3-8B MLP (4096 -> 14336 -> 4096): time per token at tp=1 vs tp=N.

    python -m torch.distributed.run --standalone --nproc-per-node=2 benchmarks/tp_mlp.py   # 2 GPUs, NCCL
    python -m torch.distributed.run --standalone --nproc-per-node=2 benchmarks/tp_mlp.py --device cpu --small
                                                                                         # gloo smoke test

Every rank builds the same whole GPTQ 4-bit g128 layers (``quantize_rtn`` of a seeded random weight,
``create_layer`` with backend AUTO), then cuts them with ``qlinear.parallel``: gate and up column-parallel without
gather, down row-parallel on the split input (one all-reduce per MLP, Megatron-LM's plan). First the sharded MLP's
output is checked against the whole MLP's on every rank; then rank 0 times the whole MLP alone (tp=1) and all ranks
time the sharded one (tp=N), each as ``--layers`` MLPs with their own weights in one CUDA graph (HBM streaming,
NCCL all-reduce inside the graph), median of ``--reps`` replays. Scaling efficiency = t(tp=1) / (N * t(tp=N)).
On the CPU there are no graphs and the numbers are only a smoke test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import qlinear
from qlinear.build import create_layer
from qlinear.parallel.launch import join_process_group
from qlinear.parallel.layers import ColumnParallelLinear, RowParallelLinear

BF16 = torch.bfloat16


def quantized(k: int, n: int, seed: int, dev: torch.device) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    q = qlinear.quantize_rtn(torch.randn(n, k, generator=g) * 0.02, bits=4, group_size=128, sym=True)
    return create_layer(q, format="gptq_v2", device=dev, dtype=BF16)


class Mlp(nn.Module):
    """SiLU-gated MLP over three linears (whole layers or tensor-parallel wrappers)."""

    def __init__(self, gate: nn.Module, up: nn.Module, down: nn.Module) -> None:
        super().__init__()
        self.gate, self.up, self.down = gate, up, down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def build(hidden: int, mlp: int, seed: int, dev: torch.device, tp: bool) -> Mlp:
    gate, up, down = (quantized(hidden, mlp, seed, dev), quantized(hidden, mlp, seed + 1, dev),
                      quantized(mlp, hidden, seed + 2, dev))
    if not tp:
        return Mlp(gate, up, down)
    return Mlp(ColumnParallelLinear.from_layer(gate, gather_output=False),
               ColumnParallelLinear.from_layer(up, gather_output=False),
               RowParallelLinear.from_layer(down, input_is_parallel=True))


def timed(fn: Callable[[], object], dev: torch.device, reps: int, sync: bool) -> float:
    """Median ms per call (CUDA graph replays on a GPU); ``sync``: every rank calls it, with a barrier before each
    call (a tp=1 timing runs on rank 0 alone and has none)."""
    fn()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        out = []
        for _ in range(reps):
            if sync:
                dist.barrier()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        return statistics.median(out)
    out = []
    for _ in range(reps):
        if sync:
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--ms", default="1,8,64", help="tokens per call")
    p.add_argument("--layers", type=int, default=8, help="MLPs with their own weights per timed call")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--small", action="store_true", help="hidden 256, MLP 512 (smoke test)")
    args = p.parse_args(argv)
    kind = torch.device(args.device).type
    join_process_group("nccl" if kind == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if kind == "cuda" else "cpu")
    if kind == "cuda":
        torch.cuda.set_device(dev)
    hidden, mlp = (256, 512) if args.small else (4096, 14336)
    ms = [int(v) for v in args.ms.split(",")]
    whole = [build(hidden, mlp, 10 * i, dev, tp=False) for i in range(args.layers)] if rank == 0 else []
    parts = [build(hidden, mlp, 10 * i, dev, tp=True) for i in range(args.layers)]
    rows, ok = [], True
    with torch.inference_mode():
        x = torch.randn(3, hidden, device=dev, dtype=BF16)
        dist.broadcast(x, 0)
        got = parts[0](x).float()
        if rank == 0:
            want = whole[0](x).float()
            err = float((got - want).norm() / want.norm())
            ok = err < 1e-2
            rows.append(f"sharded vs whole MLP (M=3, rank 0): relative difference {err:.1e} {'ok' if ok else 'FAIL'}")
        for m in ms:
            x = torch.randn(m, hidden, device=dev, dtype=BF16)
            t1 = timed(lambda x=x: [w(x) for w in whole], dev, args.reps, sync=False) if rank == 0 else 0.0
            dist.barrier()
            tn = timed(lambda x=x: [w(x) for w in parts], dev, args.reps, sync=True)
            if rank == 0:
                t1, tn = t1 / args.layers, tn / args.layers
                rows.append(f"| {m} | {t1 * 1e3:.1f} | {tn * 1e3:.1f} | {t1 / tn:.2f}x | {t1 / (world * tn):.0%} |")
    if rank == 0:
        name = torch.cuda.get_device_name(dev) if kind == "cuda" else "cpu"
        print(f"# tp_mlp on {world} x {name} (torch {torch.__version__}), MLP {hidden} -> {mlp} -> {hidden}, "
              f"GPTQ 4-bit g128, {args.layers} MLPs per call\n")
        print(rows[0] + "\n")
        print(f"| M | tp=1 us/MLP | tp={world} us/MLP | speed-up | scaling efficiency |")
        print("| --- | --- | --- | --- | --- |")
        print("\n".join(rows[1:]))
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
