"""Marlin / Machete backends (vLLM's ops) on a GPU: every declared combination checked, then timed against ours.

    python benchmarks/gpu_vllm_backends.py [--out FILE] [--reps 20]

vLLM's op library comes from ``.peers/`` (see benchmarks/gpu_peers.py) through ``qlinear.kernels.vllm_ops``.
Part 1 builds each class through ``QuantLinear.create`` for every combination it declares (bits x group size x
act-order x sym, K = 512, N = 256, M = 5, bfloat16 and float16) and compares its output with a float64 reference
of the canonical weight: a declared combination that raises or mismatches is a failure. Part 2 times the four
backends against qlinear's Triton kernel and bf16 cuBLAS on 4096x14336 (median of CUDA-graph replays).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import qlinear
from gpu_peers import load_vllm  # decompresses .peers/ and loads the library
from qlinear.caps import Problem
from qlinear.kernels.registry import kernel_by_name
from qlinear.spec import Scheme
from qlinear.target import Target

CLASSES = {"MarlinLinear": "gptq_v2", "AwqMarlinLinear": "gemm", "MacheteLinear": "gptq",
           "AwqMacheteLinear": "gemm"}


def weight(k: int, n: int, bits: int, group: int, sym: bool, act: bool, seed: int) -> qlinear.AffineWeight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    q = qlinear.quantize_rtn(w, bits=bits, group_size=group, sym=sym)
    if act:  # a GPTQ act-order grouping: input k belongs to group rank(k) // group
        gs = k if group == -1 else group
        perm = torch.randperm(k, generator=g)
        g_idx = (torch.argsort(perm) // gs).to(torch.int32)
        q = qlinear.AffineWeight(q.codes, q.scales, q.zeros, g_idx, bits, gs, sym)
    return q


def check(name: str, fmt: str, dtypes: tuple[torch.dtype, ...]) -> list[str]:
    cls = kernel_by_name(name)
    c = cls.caps
    rows = []
    for bits, group, act, sym, dtype in itertools.product(sorted(c.bits), sorted(c.group_sizes), sorted(c.desc_act),
                                                          sorted(c.sym), dtypes):
        if fmt == "gemm" and act:
            continue
        q = weight(512, 256, bits, group, sym, act, seed=bits * 1000 + group)
        x = torch.randn(5, 512, dtype=dtype, device="cuda")
        ref = (x.double() @ q.dequantize(torch.float64).to("cuda").t())
        tag = f"{name} b{bits} g{group} act={act} sym={sym} {str(dtype)[6:]}"
        scheme = Scheme(bits=bits, group_size=group, in_features=512, out_features=256, format=fmt, sym=sym,
                        desc_act=act, method="awq" if fmt == "gemm" else "gptq")
        why = cls.reasons(Problem(scheme, dtype), Target.here("cuda"))
        if why:  # declared by the reference, refused here with the reason explain() gives
            rows.append(f"| {tag} | REFUSED | {why[0][:150]} |")
            continue
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-2  # bf16 output and, for Machete, bf16 -s*z zeros
        try:
            layer = qlinear.create_layer(q, format=fmt, backend=cls.backend, device="cuda", dtype=dtype)
            y = layer(x).double()
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            rows.append(f"| {tag} | {'ok' if err < tol else 'MISMATCH'} | {err:.1e} |")
        except Exception as exc:  # a declared combination that raises is a failure: report it
            msg = str(exc).splitlines()[0][:150]
            rows.append(f"| {tag} | RAISES | {type(exc).__name__}: {msg} |")
    return rows


def timed(fn, x: torch.Tensor, reps: int) -> float:
    """Median us per call of ``fn``: ``gpu_linear.timed`` on a graph of ten calls."""
    from gpu_linear import timed as graph_timed

    return graph_timed([fn] * 10, x, reps)


def bench(reps: int) -> list[str]:
    k, n = 4096, 14336
    q = weight(k, n, 4, 128, True, False, seed=7)
    dense = q.dequantize(torch.bfloat16).cuda()
    layers = {"bf16": lambda x: F.linear(x, dense)}
    for backend, fmt in (("gptq_triton", "gptq_v2"), ("gptq_marlin", "gptq_v2"), ("gptq_machete", "gptq"),
                         ("awq_marlin", "gemm"), ("awq_machete", "gemm")):
        layers[backend] = qlinear.create_layer(q, format=fmt, backend=backend, device="cuda",
                                                     dtype=torch.bfloat16)
    rows = ["| M | " + " | ".join(f"{b} us" for b in layers) + " | triton / marlin | triton / machete |",
            "|" + " --- |" * (len(layers) + 3)]
    for m in (1, 4, 16, 64, 128, 256, 1024, 4096):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        t = {}
        for b, fn in layers.items():
            try:
                t[b] = timed(fn, x, reps)
            except Exception as exc:
                print(f"{b} M={m}: {type(exc).__name__}: {exc}")
                t[b] = float("nan")
        rows.append(f"| {m} | " + " | ".join(f"{t[b]:.1f}" for b in layers)
                    + f" | {t['gptq_triton'] / t['gptq_marlin']:.2f} | {t['gptq_triton'] / t['gptq_machete']:.2f} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    reason = load_vllm()
    if reason:
        raise SystemExit(reason)
    lines = [f"# Marlin / Machete through vLLM's ops: {torch.cuda.get_device_name()} torch {torch.__version__}", "",
             "| combination | verdict | rel err / error |", "| --- | --- | --- |"]
    for name, fmt in CLASSES.items():
        lines += check(name, fmt, (torch.bfloat16, torch.float16))
    verdicts = [r.split("|")[2].strip() for r in lines[4:]]
    lines += ["", f"declared {len(verdicts)}, ok {verdicts.count('ok')}, mismatch {verdicts.count('MISMATCH')}, "
              f"raises {verdicts.count('RAISES')}, refused with a reason {verdicts.count('REFUSED')}", "",
              "4096x14336, 4-bit g128 sym, bf16 (median of CUDA-graph replays, 10 calls each, one weight copy: "
              "L2-warm; ratio < 1: ours faster)", ""]
    print("\n".join(lines), flush=True)
    table = bench(args.reps)
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text("\n".join(lines + table) + "\n")


if __name__ == "__main__":
    main()
