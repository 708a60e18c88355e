"""Side-by-side timing of qlinear's Triton kernels against bf16 cuBLAS, torch tinygemm, vLLM Marlin and Machete.

    python3 benchmarks/gpu_linear.py                      # the Markdown table (4-bit g128 sym, bf16)
    python3 benchmarks/gpu_linear.py --variants           # each of our variants timed separately (crossovers)
    python3 benchmarks/gpu_linear.py --tune --json t.json # small config sweep -> entries for tuned_h200.json

Method: weights rotated over enough copies to exceed 4x L2 (HBM, not cache, is measured); each point is a
CUDA graph of one call per copy, replayed; median per call. Roofline: bytes (weights + scales + zeros +
activations + outputs) over time, against the HBM read rate measured in the same run (``hbm_read.py``: a
read-only Triton stream; the device copy is printed beside it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_peers import PEERS, Fn
from hbm_read import read_bandwidth
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.layout import Packed, build, pack_words

SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096), (8192, 28672))
MS = (1, 4, 16, 64, 128, 256, 1024, 4096)
DEV = torch.device("cuda")


def timed(fns: list[Fn], x: torch.Tensor, reps: int) -> float:
    """Median microseconds per call: one graph calling every fn (one weight copy each) once, replayed."""
    for f in fns:
        f(x)  # compile, load and prepare every copy before capture (no host syncs inside it)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f(x)
    g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / len(fns))
    del g
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write counted)."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    us = timed([lambda _, a=a, b=b: b.copy_(a)], a, 10)
    return 2 * (1 << 30) / (us * 1e-6)


def copies(nbytes: int) -> int:
    l2 = getattr(torch.cuda.get_device_properties(DEV), "L2_cache_size", 60 << 20)
    return max(2, math.ceil(4 * l2 / nbytes))


def our_weight(k: int, n: int, bits: int, gen: torch.Generator) -> Packed:
    """A random symmetric g128 weight in our runtime layout (built on the GPU)."""
    codes = torch.randint(0, 1 << bits, (n, k), device=DEV, dtype=torch.uint8, generator=gen)
    scales = torch.rand(n, k // 128, device=DEV, generator=gen) * 0.01 + 0.001
    zeros = torch.full((n, k // 128), 1 << (bits - 1), dtype=torch.int32, device=DEV)
    g_idx = torch.arange(k, dtype=torch.int32) // 128
    return build(codes, scales, zeros, g_idx, bits)


def gptq_qweight(p: Packed) -> torch.Tensor:
    """Our field-blocked words re-packed the plain GPTQ way (word row w holds codes 8w .. 8w+7): the same
    codes the peers expect. Our runtime words are NOT GPTQ words (field ``j`` of word row ``w`` is sorted
    row ``(w // R) * R * PF + j * R + w % R``), so handing them to a peer multiplies a different weight."""
    assert p.perm is None and p.bits == 4 and p.np == p.n
    pf, r = 32 // p.bits, p.rows_per_block
    kw, n = p.qweight.shape
    shifts = torch.arange(0, 32, p.bits, device=p.qweight.device).view(1, pf, 1)
    fields = (p.qweight.unsqueeze(1) >> shifts) & ((1 << p.bits) - 1)  # [KW, PF, N]: field j of word row w
    codes = fields.reshape(kw // r, r, pf, n).transpose(1, 2).reshape(kw * pf, n)  # sorted row order
    return pack_words(codes.to(torch.uint8), p.bits, 1)


def our_fns(p: Packed, r: int, cfg: Config) -> list[Fn]:
    from qlinear.kernels.triton.dequant import dense_mm
    from qlinear.kernels.triton.qmm import lock_slots, qmm

    lock = torch.zeros(lock_slots(p.n), dtype=torch.int32, device=DEV)
    ps = [p] + [p.with_tensors(qweight=p.qweight.clone(), scales=p.scales.clone()) for _ in range(r - 1)]
    if cfg.variant == "dense":
        return [lambda x, q=q: dense_mm(x, q, cfg) for q in ps]
    return [lambda x, q=q: qmm(x, q, cfg, None, lock) for q in ps]


def config(p: Packed, m: int, variant: str | None = None) -> Config:
    props = torch.cuda.get_device_properties(DEV)
    cfg = configs.choose(props.name, props.multi_processor_count, m, p.n, p.k, p.bits, p.group, variant)
    return configs.legal(cfg, m, p.kp, p.bits)


def roofline(k: int, n: int, m: int, bits: int, us: float, bw: float) -> float:
    nbytes = k * n * bits / 8 + (k // 128) * n * 2 + m * k * 2 + m * n * 2
    return nbytes / (us * 1e-6) / bw


def fmt(us: float | None) -> str:
    return "-" if us is None else f"{us:.1f}"


def check_peers(p: Packed, peers: dict[str, list[Fn] | str], gen: torch.Generator,
                variants: tuple[str, ...] = ()) -> None:
    """Every peer, and each of our variants, against one float reference built from the SAME weight copy
    (ours, dequantized) and the SAME input (else a time means nothing)."""
    from qlinear.kernels.triton.dequant import dense_t

    x = torch.randn(16, p.k, device=DEV, dtype=torch.bfloat16, generator=gen)
    ref = x.float() @ dense_t(p, torch.float32)
    outs = {f"ours {v}": our_fns(p, 1, config(p, 16, v))[0](x).float() for v in variants}
    outs["ours"] = our_fns(p, 1, config(p, 16))[0](x).float()
    for name, fns in peers.items():
        if not isinstance(fns, str):
            outs[name] = fns[0](x).float()
    for name, y in outs.items():
        err = float((y - ref).norm() / ref.norm())
        print(f"<!-- {p.k}x{p.n} {name} vs reference: rel diff {err:.1e}{' MISMATCH' if err > 2e-2 else ''} -->")


def main_table(args: argparse.Namespace, bw: float) -> None:
    gen = torch.Generator(device=DEV).manual_seed(0)
    print("| K x N | M | bf16 | tinygemm | Marlin | Machete | ours | variant | vs bf16 | vs best peer | roofline |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k, n in args.shapes:
        p = our_weight(k, n, 4, gen)
        r_ours = copies(p.qweight.numel() * 4)
        qw = gptq_qweight(p)
        peers: dict[str, list[Fn] | str] = {}
        for name, make in PEERS.items():
            if name in args.skip:
                continue
            try:
                r = copies(k * n * 2) if name == "bf16" else r_ours
                peers[name] = [make(qw.clone(), p.scales[:, :n].clone()) for _ in range(r)]
            except Exception as err:
                peers[name] = f"{type(err).__name__}: {err}"[:400]
                print(f"<!-- {name} unavailable for {k}x{n}: {peers[name]} -->")
        check_peers(p, peers, gen)
        for m in args.m:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            t: dict[str, float | None] = {}
            for name, fns in peers.items():
                skip = isinstance(fns, str) or (name == "tinygemm" and m > args.tinygemm_max_m)
                t[name] = None if skip else timed(fns, x, args.reps)  # type: ignore[arg-type]
            cfg = config(p, m)
            ours = timed(our_fns(p, r_ours, cfg), x, args.reps)
            best = min((v for kk, v in t.items() if kk != "bf16" and v), default=None)
            print(f"| {k}x{n} | {m} | {fmt(t.get('bf16'))} | {fmt(t.get('tinygemm'))} | {fmt(t.get('marlin'))} | "
                  f"{fmt(t.get('machete'))} | {ours:.1f} | {cfg.variant} s{cfg.split_k} | "
                  f"{t['bf16'] / ours if t.get('bf16') else 0:.2f}x | {best / ours if best else 0:.2f}x | "
                  f"{100 * roofline(k, n, m, 4, ours, bw):.0f}% |", flush=True)
        del peers, p
        torch.cuda.empty_cache()
    for bits in (8, 2):
        for k, n in args.shapes:
            p = our_weight(k, n, bits, gen)
            x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            cfg = config(p, 1)
            us = timed(our_fns(p, copies(p.qweight.numel() * 4), cfg), x, args.reps)
            print(f"| {k}x{n} {bits}-bit | 1 | | | | | {us:.1f} | {cfg.variant} s{cfg.split_k} | | | "
                  f"{100 * roofline(k, n, 1, bits, us, bw):.0f}% |", flush=True)


def variants_table(args: argparse.Namespace, bw: float) -> dict[str, object]:
    """Each variant on its own, per shape and M: where the crossovers are."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    names = configs.VARIANTS
    winners: dict[int, list[str]] = {}
    print("| K x N | M | " + " | ".join(names) + " | best | configs |\n| --- | --- |" + " --- |" * (len(names) + 2))
    for k, n in args.shapes:
        p = our_weight(k, n, 4, gen)
        r = copies(p.qweight.numel() * 4)
        check_peers(p, {}, gen, names)
        for m in args.m:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            t = {}
            for v in names:
                if ((v == "gemv" and m > 16) or (v.startswith("skinny") and m > 256) or (v == "dense" and m < 16)
                        or (v == "skinny3" and m > 16)
                        or (v.startswith("gemm") and m < 16)):
                    continue
                try:
                    t[v] = timed(our_fns(p, r, config(p, m, v)), x, args.reps)
                except Exception as err:  # out of resources: report, keep timing the rest
                    print(f"<!-- {k}x{n} M={m} {v} {config(p, m, v)}: {type(err).__name__}: {str(err)[:200]} -->")
            best = min(t, key=t.__getitem__)
            winners.setdefault(m, []).append(best)
            cfgs = " ".join(f"{v}={config(p, m, v).block_m}x{config(p, m, v).block_n}x{config(p, m, v).block_k}"
                            f"s{config(p, m, v).split_k}" for v in t if v != "dense")
            print(f"| {k}x{n} | {m} | " + " | ".join(fmt(t.get(v)) for v in names) + f" | {best} | {cfgs} |",
                  flush=True)
    cross: dict[str, int] = {}
    for v in names[:-1]:
        ms = [m for m, w in winners.items() if max(set(w), key=w.count) == v]
        if ms:
            cross[v] = configs.m_bucket(max(ms))
    print(f"\nsuggested crossovers (majority winner per M): {json.dumps(cross)}")
    return {"crossovers": {"4": cross}}


def candidates(variant: str, base: Config) -> list[Config]:
    """A small neighbourhood of the heuristic config: the sweep is bounded by compile time."""
    out = [base]
    if variant == "gemv":  # block_n follows num_warps (128 per warp: the body's layout contract)
        for w, bk, st in ((1, base.block_k, 2), (4, base.block_k, 2), (base.num_warps, base.block_k * 2, 2),
                          (base.num_warps, base.block_k, 3), (base.num_warps, max(1, base.block_k // 2), 2)):
            out.append(Config(variant, base.block_m, 128 * w, bk, base.split_k, w, st))
        out += [Config(variant, base.block_m, base.block_n, base.block_k, max(1, base.split_k * f), base.num_warps, 2)
                for f in (0.5, 2)]
    else:
        for bn, bk, w, st in ((64, 128, 4, 3), (64, 256, 4, 3), (128, 64, 4, 3), (128, 64, 8, 4), (256, 64, 8, 3),
                              (128, 256, 4, 3), (256, 128, 8, 3), (128, 128, 4, 4)):
            out.append(Config(variant, base.block_m, bn, bk, base.split_k, w, st))
        out += [Config(variant, base.block_m, base.block_n, base.block_k, max(1, int(base.split_k * f)),
                       base.num_warps, base.num_stages) for f in (0.5, 2)]
    return [Config(c.variant, c.block_m, c.block_n, c.block_k, int(c.split_k), c.num_warps, c.num_stages)
            for c in dict.fromkeys(out)]


def tune(args: argparse.Namespace) -> dict[str, object]:
    gen = torch.Generator(device=DEV).manual_seed(2)
    props = torch.cuda.get_device_properties(DEV)
    found: dict[str, dict[str, int]] = {}
    for k, n in args.shapes:
        p = our_weight(k, n, 4, gen)
        r = copies(p.qweight.numel() * 4)
        for m in args.m:
            x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
            variant = args.variant or configs.pick_variant(props.name, m, 4)
            if variant == "dense":
                continue
            best: tuple[float, Config] | None = None
            for c in candidates(variant, config(p, m, variant)):
                c = configs.legal(c, m, p.kp, 4)
                try:
                    us = timed(our_fns(p, r, c), x, max(5, args.reps // 2))
                except Exception as err:  # out of shared memory or registers: skip the candidate
                    print(f"<!-- {c}: {type(err).__name__} -->")
                    continue
                if best is None or us < best[0]:
                    best = (us, c)
            assert best is not None
            key = configs.table_key(variant, m, n, k, 4, p.group)
            found[key] = {f: v for f, v in best[1].as_dict().items() if f != "variant"}
            print(f"{key}: {best[0]:.1f} us {found[key]}", flush=True)
    return {"configs": found}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="KxN list")
    ap.add_argument("--m", default=",".join(map(str, MS)), help="M list")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--variants", action="store_true", help="time each of our variants separately")
    ap.add_argument("--tune", action="store_true", help="sweep a few configs per shape/M, print table entries")
    ap.add_argument("--json", help="write crossovers/configs found by --variants/--tune to this file")
    ap.add_argument("--variant", help="--tune this variant instead of the one the crossovers pick")
    ap.add_argument("--skip", default="", help="peers to leave out: bf16,tinygemm,marlin,machete")
    ap.add_argument("--tinygemm-max-m", type=int, default=256, help="tinygemm is pathological above this M")
    ap.add_argument("--table-of", help="use this device's tuned table ('' for none: heuristic + default crossovers)"
                    " instead of this GPU's own or its shipped alias (A/B of whether a table carries over)")
    args = ap.parse_args()
    args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    args.m = [int(v) for v in args.m.split(",")]
    args.skip = set(filter(None, args.skip.split(",")))
    if not torch.cuda.is_available():
        print("no CUDA device: this script times the GPU kernels")
        return 2
    t0 = time.time()
    if args.table_of is not None:
        configs.borrow_table(torch.cuda.get_device_name(), args.table_of)
    bw = read_bandwidth(DEV)
    name = torch.cuda.get_device_name()
    table = configs.table_device(name) if configs.device_table(name) else "none (heuristic)"
    print(f"{name} torch {torch.__version__} triton {__import__('triton').__version__}; "
          f"HBM read {bw / 1e12:.2f} TB/s (the roofline's denominator), device copy {copy_bandwidth() / 1e12:.2f} "
          f"TB/s; times in us (median of {args.reps} graph replays); config table: "
          f"{table}\n")
    found: dict[str, object] = {}
    if args.variants:
        found.update(variants_table(args, bw))
    if args.tune:
        found.update(tune(args))
    if not (args.variants or args.tune):
        main_table(args, bw)
    if found:
        text = json.dumps({"devices": {torch.cuda.get_device_name(): found}}, indent=1)
        print(text)
        if args.json:
            Path(args.json).write_text(text)
    print(f"\n{time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
