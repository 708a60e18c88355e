"""The tensor-core GEMV (``gemv_tc``, ``qmv_tc.py``) on the GPU: checked on many layers, then timed beside the
CUDA-core GEMV and bf16 cuBLAS over its configs.

    python3 benchmarks/gemv_tc_sweep.py [--shapes 4096x14336,...] [--bits 4,2] [--m 1,4,8,16] [--reps 20]

Checks first (fresh random weights, float64 reference, relative Frobenius error < 1e-2): sym/asym, act-order,
g32/g64/g128/channelwise, float16/bfloat16, odd N and K, M 1..16, split-K, additive offsets (GGUF). Then per
shape and bits: every (warps, K unit, split) at M=1, the best one at each M, against the shipped ``gemv``
config and ``F.linear`` in bfloat16 (CUDA-graph replay over weight copies > 4x L2, median). Prints JSON entries
for ``tuned_h200.json``, the shipped variant's beside gemv_tc's (same run), each with its time.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_sweep import setup
from gpu_linear import DEV, config, copies, gptq_qweight, timed
from gpu_peers import PEERS
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.dequant import dense_t
from qlinear.kernels.triton.layout import build, build_affine, build_affine32, build_kquant
from qlinear.kernels.triton.qmm import lock_slots, qmm
from qlinear.kernels.triton.qmv_tc import qmv_tc


def tc(x: torch.Tensor, p, cfg: Config, lock: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = torch.empty((x.shape[0], p.n), dtype=x.dtype, device=x.device)
    return qmv_tc(x, p, cfg, bias, lock, y, use_asm=True)


def check_case(bits: int, group: int, k: int, n: int, m: int, sym: bool, act: bool, dtype: torch.dtype,
               cfg: Config, gen: torch.Generator, offsets: bool = False) -> float:
    """Relative error of one call against a float64 reference built from the codes directly."""
    gs = group if group > 0 else k
    ng = -(-k // gs)
    codes = torch.randint(0, 1 << bits, (n, k), device=DEV, dtype=torch.uint8, generator=gen)
    g_idx = torch.arange(k, device=DEV) // gs
    if act:
        g_idx = g_idx[torch.randperm(k, device=DEV, generator=gen)]
    if offsets:
        s = torch.rand(n, k // 32, device=DEV, generator=gen) * 0.02 + 0.005
        o = -torch.rand(n, k // 32, device=DEV, generator=gen) * 0.1
        p = build_affine32(codes, s, o, bits)
        w = codes.double() * s.double().repeat_interleave(32, 1) + o.double().repeat_interleave(32, 1)
    else:
        s = torch.rand(n, ng, device=DEV, generator=gen) * 0.02 + 0.005
        if sym:
            z = torch.full((n, ng), 1 << (bits - 1), device=DEV, dtype=torch.int32)
        else:
            z = torch.randint(0, 1 << bits, (n, ng), device=DEV, dtype=torch.int32, generator=gen)
        p = build(codes, s, z, g_idx.cpu(), bits)
        w = (codes.double() - z.double()[:, g_idx]) * s.half().double()[:, g_idx]
    x = torch.randn(m, k, device=DEV, generator=gen)
    x[:, ::3] += 1.5  # a mean far from 0: the (m + z) * sum(x) correction must not cancel badly
    x = x.to(dtype)
    bias = torch.randn(n, device=DEV, generator=gen).to(dtype)
    ref = x.double() @ w.T + bias.double()
    lock = torch.zeros(lock_slots(n), dtype=torch.int32, device=DEV)
    y = tc(x, p, cfg, lock, bias)
    assert int(lock.abs().sum()) == 0, "split-K counters left non-zero"
    return float((y.double() - ref).norm() / ref.norm())


def checks(gen: torch.Generator) -> int:
    bad = 0
    cases = []
    for dtype in (torch.bfloat16, torch.float16):
        for bits, group, k, n, sym, act in ((4, 128, 4096, 4096, True, False), (4, 128, 1024, 200, False, True),
                                            (4, 32, 512, 72, False, False), (4, 64, 768, 136, True, True),
                                            (4, -1, 1000, 96, False, False), (2, 128, 1024, 264, False, False),
                                            (2, 32, 512, 40, True, True), (2, -1, 2048, 128, True, False),
                                            (4, 128, 4096, 14336, False, False), (8, 128, 4096, 4096, True, False),
                                            (8, 128, 1024, 200, False, True), (8, 32, 512, 72, False, False),
                                            (8, -1, 1000, 96, False, False)):
            for m in (1, 13):
                for cfg in (Config("gemv_tc", 8, 128, 128, 1, 4, 1),
                            Config("gemv_tc", 16, 32, 64, 5, 2, 1, prefetch=True),
                            Config("gemv_tc", 16, 64, 256, 16, 8, 1, prefetch=True)):
                    cases.append((bits, group, k, n, m, sym, act, dtype, cfg, False))
        cases.append((4, 32, 1024, 320, 1, True, False, dtype, Config("gemv_tc", 8, 128, 128, 4, 4, 1), True))
        cases.append((4, 32, 4096, 4096, 5, True, False, dtype, Config("gemv_tc", 8, 128, 128, 8, 4, 1), True))
        cases.append((8, 32, 1024, 320, 3, True, False, dtype, Config("gemv_tc", 8, 128, 64, 4, 4, 1), True))
    worst = 0.0
    for i, c in enumerate(cases):
        cfg = replace(c[8], sub_zero=i % 2 == 1, stage_x=i // 2 % 2 == 1)
        err = check_case(*c[:8], cfg, gen, offsets=c[9])
        worst = max(worst, err)
        if not err < 1e-2:
            bad += 1
            print(f"WRONG {c[:8]} {cfg}: {err:.2e}")
    print(f"checks: {len(cases)} layers (half with the zero subtracted in the asm, half with x staged), {bad} failed, "
          f"worst relative error {worst:.2e}", flush=True)
    return bad


def candidates(p) -> list[Config]:
    ck = p.rows_per_block * (32 // p.bits)
    out = []
    for wn, wk in ((2, 1), (4, 1), (1, 4), (1, 8), (2, 2), (2, 4)):
        ctas = -(-p.n // (32 * wn))
        for unit in (2, 4):
            for split in (1, 2, 4, 8, 16, 32):
                if split * unit * wk > p.kp // ck or ctas * split > 32 * 132 or ctas * split * wn * wk < 132 * 3:
                    continue
                for pre in (False, True):
                    out.append(Config("gemv_tc", 8, 32 * wn, unit * ck, split, wn * wk, 1, prefetch=pre))
    return out


def fmt(c: Config, p) -> str:
    unit = c.block_k * p.bits // 32 // p.rows_per_block
    shape = f"n{c.block_n // 32}k{c.num_warps * 32 // c.block_n} u{unit} s{c.split_k}"
    flags = [("pf", c.prefetch), ("16r", c.block_m > 8), ("subz", c.sub_zero), ("sx", c.stage_x),
             ("vp", c.vector_params),
             (f"r{c.max_registers}", c.max_registers)]
    return shape + "".join(f" {name}" for name, on in flags if on)


def checked_time(x: torch.Tensor, ref: torch.Tensor, ps: list, c: Config, lock: torch.Tensor, reps: int
                 ) -> float | None:
    """Microseconds of one config over the weight copies, or None (and a note) if its output is wrong."""
    err = float((tc(x, ps[0], c, lock).float() - ref).norm() / ref.norm())
    if not err < 1e-2:
        print(f"WRONG M={x.shape[0]} {c}: {err:.2e}")
        return None
    return timed([lambda x, q=q: tc(x, q, c, lock) for q in ps], x, reps)


def peer_fns(p, r: int) -> dict:
    """Marlin, Machete and tinygemm on the same 4-bit g128 sym weight (r copies each), where they load."""
    out = {}
    qw = gptq_qweight(p)
    for name in ("marlin", "machete", "tinygemm"):
        try:
            out[name] = [PEERS[name](qw.clone(), p.scales[:, :p.n].clone()) for _ in range(r)]
        except Exception as err:  # the op library was not carried, or the op refused the shape
            print(f"<!-- {name} unavailable: {type(err).__name__}: {str(err)[:200]} -->")
    return out


def best_peer(peers: dict, x: torch.Tensor, reps: int) -> str:
    t = {}
    for name, fns in peers.items():
        try:
            t[name] = timed(fns, x, reps)
        except Exception as err:
            print(f"<!-- {name} failed at M={x.shape[0]}: {type(err).__name__}: {str(err)[:200]} -->")
    if not t:
        return "-"
    name = min(t, key=t.get)
    return f"{t[name]:.1f} {name}"


def entry(c: Config, us: float) -> dict:
    """A table entry: the config's fields and its median time (``configs.measured_variant`` compares these
    between variants of one key, so a key's entries must come from one run)."""
    return {**{f: v for f, v in c.as_dict().items() if f != "variant"}, "us": round(us, 2)}


def sweep(k: int, n: int, bits: int, ms: list[int], reps: int, gen: torch.Generator, with_peers: bool) -> dict:
    p, ps, lock, x, ref = setup(k, n, bits, 1, gen)
    peers = peer_fns(p, len(ps)) if with_peers and bits == 4 else {}
    for name, fns in peers.items():  # every contender multiplies the same weight
        err = float((fns[0](x).float() - ref).norm() / ref.norm())
        print(f"<!-- {k}x{n} {name} vs reference: rel err {err:.1e}{' MISMATCH' if err > 2e-2 else ''} -->")
    w16 = torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=gen)
    r16 = copies(w16.numel() * 2)
    ws = [w16] + [w16.clone() for _ in range(r16 - 1)]
    bf16 = timed([lambda x, w=w: torch.nn.functional.linear(x, w) for w in ws], x, reps)
    del ws, w16
    gemv_cfg = config(p, 1, "gemv")
    gemv = timed([lambda x, q=q: qmm(x, q, gemv_cfg, None, lock) for q in ps], x, reps)
    rows = []  # (us, config)
    for c in candidates(p):
        us = checked_time(x, ref, ps, c, lock, reps)
        if us is not None:
            rows.append((us, c))
    rows.sort(key=lambda r: r[0])
    for _, c in rows[:6]:  # the best six again with the zero subtracted in the asm (no Cx MMA), x staged or not
        for v in (replace(c, sub_zero=True), replace(c, sub_zero=True, stage_x=True), replace(c, stage_x=True),
                  replace(c, sub_zero=True, max_registers=64),  # 64 registers: 32 warps per SM
                  replace(c, sub_zero=True, vector_params=True)):
            us = checked_time(x, ref, ps, v, lock, reps)
            if us is not None:
                rows.append((us, v))
    rows.sort(key=lambda r: r[0])
    best_us, best = rows[0]
    top = ", ".join(f"{us:.1f} {fmt(c, p)}" for us, c in rows[:6])
    print(f"| {k}x{n} | {bits} | 1 | {bf16:.1f} | {best_peer(peers, x, reps)} | {gemv:.1f} | {best_us:.1f} | "
          f"{bf16 / best_us:.2f}x | {gemv / best_us:.2f}x | {top} |", flush=True)
    found = {configs.table_key("gemv_tc", 1, n, k, bits, p.group): entry(best, best_us),
             configs.table_key("gemv", 1, n, k, bits, p.group): entry(gemv_cfg, gemv)}
    for m in ms:
        if m == 1:
            continue
        xm = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
        refm = (xm.float() @ dense_t(p, torch.float32)).float()
        tries = []
        for _, c in rows[:4]:  # 16 rows: one program with two row sets, or row sets in programs side by side
            for bm in (8, 16) if m > 8 else (8,):
                for stage in (False, True):
                    v = replace(c, block_m=bm, stage_x=stage)
                    us = checked_time(xm, refm, ps, v, lock, reps)
                    if us is not None:
                        tries.append((us, v))
        t_tc, c_tc = min(tries, key=lambda r: r[0])
        cfg_m = config(p, m)
        t_ship = timed([lambda x, q=q, c=cfg_m: qmm(x, q, c, None, lock) for q in ps], xm, reps)
        print(f"| {k}x{n} | {bits} | {m} | - | {best_peer(peers, xm, reps)} | {t_ship:.1f} ({cfg_m.variant}) | "
              f"{t_tc:.1f} | - | {t_ship / t_tc:.2f}x | {fmt(c_tc, p)} |", flush=True)
        found[configs.table_key("gemv_tc", m, n, k, bits, p.group)] = entry(c_tc, t_tc)
        if cfg_m.variant != "gemv_tc":  # timed in the same run: the selector takes the faster of the two
            found[configs.table_key(cfg_m.variant, m, n, k, bits, p.group)] = entry(cfg_m, t_ship)
    return found


def kquant_values(k: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Random Q4_K-shaped values: codes ``[N, K]``, 6-bit sub-scales and mins per 32, float16 ``d`` / ``dmin`` per
    256 (as float32), and the float32 scale and offset per 32 they make (``s = d sc``, ``o = -dmin m``)."""
    codes = torch.randint(0, 16, (n, k), device=DEV, dtype=torch.uint8, generator=gen)
    sc = torch.randint(0, 64, (n, k // 32), device=DEV, dtype=torch.uint8, generator=gen)
    mins = torch.randint(0, 64, (n, k // 32), device=DEV, dtype=torch.uint8, generator=gen)
    d = (torch.rand(n, k // 256, device=DEV, generator=gen) * 1e-3 + 1e-4).half().float()
    dmin = (torch.rand(n, k // 256, device=DEV, generator=gen) * 1e-3).half().float()
    s, o = d.repeat_interleave(8, 1) * sc.float(), -dmin.repeat_interleave(8, 1) * mins.float()
    return codes, sc, mins, d, dmin, s, o


def affine(k: int, n: int, reps: int, gen: torch.Generator, forms: tuple[str, ...] = ("affine32", "kquant")) -> None:
    """GGUF's affine runtimes at M=1 on random Q4_K-shaped values (codes, 6-bit sub-scales and mins per 32,
    float16 d and dmin per 256): the float32 scale + offset per 32 (``build_affine32``, Q4_0/Q4_1's form), the
    two-level form (``build_kquant``, Q4_K's) and bfloat16 scale and offset per 32 (``bf16g32``, MLX g32's):
    gemv_tc's configs against the shipped path and bf16."""
    codes, sc, mins, d, dmin, s, o = kquant_values(k, n, gen)
    w = codes.float() * s.repeat_interleave(32, 1) + o.repeat_interleave(32, 1)
    x = torch.randn(1, k, device=DEV, generator=gen).to(torch.bfloat16)
    ref = x.float() @ w.T
    del w
    w16 = torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=gen)
    ws = [w16] + [w16.clone() for _ in range(copies(w16.numel() * 2) - 1)]
    bf16 = timed([lambda x, w=w: torch.nn.functional.linear(x, w) for w in ws], x, reps)
    del ws, w16
    lock = torch.zeros(lock_slots(n), dtype=torch.int32, device=DEV)
    builders = {"affine32": lambda: build_affine32(codes, s, o, 4),
                "kquant": lambda: build_kquant(codes, sc, mins, d, dmin),
                # MLX's g32 form: bfloat16 scales and biases (rounded here; within the check's tolerance)
                "bf16g32": lambda: build_affine(codes, s.bfloat16(), o.bfloat16(), 4, 32, torch.bfloat16)}
    for name in forms:
        p = builders[name]()
        nbytes = sum(t.numel() * t.element_size() for t in (p.qweight, p.scales, p.offsets, p.supers)
                     if t is not None)
        ps = [p] + [p.with_tensors(**{f: t.clone() for f, t in p.tensors().items() if t is not None})
                    for _ in range(copies(nbytes) - 1)]
        ship = configs.legal(configs.choose(torch.cuda.get_device_name(), 132, 1, n, k, 4, 32, "gemv"), 1, p.kp, 4)
        t_ship = timed([lambda x, q=q, c=ship: qmm(x, q, c, None, lock) for q in ps], x, reps)
        auto = configs.legal(configs.choose(torch.cuda.get_device_name(), 132, 1, n, k, 4, 32), 1, p.kp, 4)
        t_auto = timed([lambda x, q=q, c=auto: qmm(x, q, c, None, lock) for q in ps], x, reps)
        rows = []
        for c in candidates(p):
            us = checked_time(x, ref, ps, c, lock, reps)
            if us is not None:
                rows.append((us, c))
        rows.sort(key=lambda r: r[0])
        for _, c in rows[:6]:  # the best six with the zero FMA, per-lane parameter vectors, both
            for v in (replace(c, sub_zero=True), replace(c, vector_params=True),
                      replace(c, sub_zero=True, vector_params=True)):
                us = checked_time(x, ref, ps, v, lock, reps)
                if us is not None:
                    rows.append((us, v))
        rows.sort(key=lambda r: r[0])
        top = ", ".join(f"{us:.1f} {fmt(c, p)}" for us, c in rows[:5])
        best = rows[0][0]
        print(f"| {name} {k}x{n} ({nbytes / 1e6:.1f} MB) | 4 | 1 | {bf16:.1f} | - | {t_ship:.1f} (gemv); "
              f"{t_auto:.1f} (the table's pick: {fmt(auto, p) if auto.variant == 'gemv_tc' else auto.variant}) | "
              f"{best:.1f} | {bf16 / best:.2f}x | {t_ship / best:.2f}x | {top} |", flush=True)


def shape_args(ap: argparse.ArgumentParser) -> None:
    """The options every gemv_tc timing script takes: shapes, bits, row counts, repetitions, peers."""
    ap.add_argument("--shapes", default="4096x14336,8192x28672,4096x4096,14336x4096")
    ap.add_argument("--bits", default="4,2")
    ap.add_argument("--m", default="1,4,8,16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--peers", action="store_true", help="time Marlin / Machete / tinygemm beside (4-bit)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    shape_args(ap)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--ms2", default="1", help="M values for the 2-bit shapes")
    ap.add_argument("--shapes2", default="", help="shapes for 2-bit (default: --shapes)")
    ap.add_argument("--affine", default="", help="shapes for GGUF's affine runtimes (float32 scale + offset per 32; "
                    "Q4_K's two levels)")
    ap.add_argument("--forms", default="affine32,kquant", help="which affine runtimes --affine times")
    ap.add_argument("--once", help="wn,wk,unit,split,prefetch,sub_zero,block_m[,stage_x,max_registers]: three "
                    "calls of one config on the first shape (ncu)")
    a = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(7)
    if a.once:
        k, n = (int(v) for v in a.shapes.split(",")[0].split("x"))
        p, _, lock, x, _ = setup(k, n, int(a.bits.split(",")[0]), int(a.m.split(",")[0]), gen)
        wn, wk, unit, split, pre, subz, bm, stage, regs = ([int(v) for v in a.once.split(",")] + [0, 0])[:9]
        c = Config("gemv_tc", bm, 32 * wn, unit * p.rows_per_block * 32 // p.bits, split, wn * wk, 1,
                   prefetch=bool(pre), sub_zero=bool(subz), stage_x=bool(stage), max_registers=regs)
        for _ in range(3):
            tc(x, p, c, lock)
        torch.cuda.synchronize()
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    bad = 0 if a.no_check else checks(gen)
    print("\n| K x N | bits | M | bf16 us | best peer us | shipped us | gemv_tc us | bf16 / tc | shipped / tc | "
          "best configs |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    found = {}
    for bits in (int(b) for b in filter(None, a.bits.split(","))):  # --bits "": only --affine
        shapes = a.shapes2 if bits == 2 and a.shapes2 else a.shapes
        ms = a.ms2 if bits == 2 else a.m
        for s in shapes.split(","):
            k, n = (int(v) for v in s.split("x"))
            try:
                found.update(sweep(k, n, bits, [int(v) for v in ms.split(",")], a.reps, gen, a.peers))
            except Exception as err:  # keep the rest of a scarce device run
                print(f"<!-- {k}x{n} {bits}-bit failed: {type(err).__name__}: {str(err)[:300]} -->", flush=True)
    for shape in filter(None, a.affine.split(",")):
        k, n = (int(v) for v in shape.split("x"))
        try:
            affine(k, n, a.reps, gen, tuple(a.forms.split(",")))
        except Exception as err:
            print(f"<!-- affine {k}x{n} failed: {type(err).__name__}: {str(err)[:300]} -->", flush=True)
    print(json.dumps(found, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
