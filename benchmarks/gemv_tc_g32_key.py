"""One table key, every form it serves: M = 1 over groups of 32, the GPTQ forms and the forms with offsets.

    python3 benchmarks/gemv_tc_g32_key.py [--shapes 14336x4096,4096x14336] [--configs "n2k2 u2 s16 subz vp,..."]

The table key (``variant:m:n:k:b:g``) has no field for offsets, so one entry serves GPTQ g32 (sym and asym), GGUF
Q4_K (two-level scales, ``build_kquant``) and MLX g32 (bfloat16 scale and bias, ``build_affine``) alike. The gemv_tc
sweep over the offset forms found configs 1.35-1.40x faster than the shipped choice on 14336x4096
(results/h100-gemv_tc_affine-2026-12-07-partial.md); an entry for the key is safe only if it is fast on all four.
Per shape and form: the shipped choice (table or heuristic), the CUDA-core gemv, and each listed gemv_tc config,
each checked against a float64 product first. Prints the config with the smallest worst ratio to each form's best,
and the table entries (gemv_tc and gemv times from one form, one run) for ``tuned_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemv_tc_sweep import entry, fmt, kquant_values, tc
from gpu_linear import DEV, copies, timed
from qlinear.kernels.triton import configs
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton.layout import build, build_affine, build_kquant
from qlinear.kernels.triton.qmm import lock_slots, qmm

#: the best configs of the offset sweep (both shapes) and the heuristic's pick on 14336x4096
CONFIGS = ("n2k2 u2 s16 subz vp,n2k2 u2 s16 vp,n2k2 u2 s16,n4k1 u2 s32 subz vp,n2k1 u2 s32 subz vp,n4k1 u2 s32 vp,"
           "n2k2 u4 s8 pf vp,n4k1 u4 s32 subz vp,n4k1 u2 s16 subz,n2k1 u2 s8 pf vp,n4k1 u2 s8 pf subz vp")
FORMS = ("gptq_sym", "gptq_asym", "kquant", "bf16g32")


def parse(text: str, p) -> Config:
    """``fmt``'s notation back to a gemv_tc config: n<warps along N>k<warps along K> u<unit> s<split> + flags."""
    shape, unit, split, *flags = text.split()
    wn, wk = (int(v) for v in shape[1:].split("k"))
    block_k = int(unit[1:]) * p.rows_per_block * 32 // p.bits
    return Config("gemv_tc", 8, 32 * wn, block_k, int(split[1:]), wn * wk, 1, prefetch="pf" in flags,
                  sub_zero="subz" in flags, vector_params="vp" in flags)


def weight(form: str, k: int, n: int, gen: torch.Generator):
    """A random 4-bit g32 weight in ``form`` and its float64 dequantization (written from the codes here)."""
    if form.startswith("gptq"):
        codes = torch.randint(0, 16, (n, k), device=DEV, dtype=torch.uint8, generator=gen)
        s = torch.rand(n, k // 32, device=DEV, generator=gen) * 0.01 + 0.001
        z = (torch.full((n, k // 32), 8, device=DEV, dtype=torch.int32) if form == "gptq_sym"
             else torch.randint(0, 16, (n, k // 32), device=DEV, dtype=torch.int32, generator=gen))
        p = build(codes, s, z, torch.arange(k, dtype=torch.int32) // 32, 4)
        return p, (codes.double() - z.double().repeat_interleave(32, 1)) * s.half().double().repeat_interleave(32, 1)
    codes, sc, mins, d, dmin, s, o = kquant_values(k, n, gen)
    if form == "kquant":
        p = build_kquant(codes, sc, mins, d, dmin)
    else:  # MLX g32: bfloat16 scales and biases
        s, o = s.bfloat16().float(), o.bfloat16().float()
        p = build_affine(codes, s.bfloat16(), o.bfloat16(), 4, 32, torch.bfloat16)
    return p, codes.double() * s.double().repeat_interleave(32, 1) + o.double().repeat_interleave(32, 1)


@dataclass
class Cells:
    """One form's row: microseconds per contender (inf where the output was wrong), the config each ran, and what
    the shipped choice was."""

    us: dict[str, float]
    configs: dict[str, Config]
    shipped: str


def measure(k: int, n: int, form: str, names: list[str], reps: int, gen: torch.Generator) -> Cells:
    """The shipped choice, the CUDA-core gemv and each named gemv_tc config on one weight, copies > 4x L2."""
    p, w = weight(form, k, n, gen)
    x = torch.randn(1, k, device=DEV, generator=gen).to(torch.bfloat16)
    ref = x.double() @ w.T
    del w
    nbytes = sum(t.numel() * t.element_size() for t in p.tensors().values() if t is not None)
    ps = [p] + [p.with_tensors(**{f: t.clone() for f, t in p.tensors().items() if t is not None})
                for _ in range(copies(nbytes) - 1)]
    lock = torch.zeros(lock_slots(n), dtype=torch.int32, device=DEV)
    dev = torch.cuda.get_device_name()
    cfgs = {"shipped": configs.legal(configs.choose(dev, 132, 1, n, k, 4, 32), 1, p.kp, 4),
            "gemv": configs.legal(configs.choose(dev, 132, 1, n, k, 4, 32, "gemv"), 1, p.kp, 4),
            **{name: parse(name, p) for name in names}}
    us = {}
    for name, c in cfgs.items():
        def call(x: torch.Tensor, q=ps[0], c=c) -> torch.Tensor:
            return tc(x, q, c, lock) if c.variant == "gemv_tc" else qmm(x, q, c, None, lock)

        err = float((call(x).double() - ref).norm() / ref.norm())
        if err < 1e-2:
            us[name] = timed([lambda x, q=q: call(x, q) for q in ps], x, reps)
        else:
            print(f"<!-- WRONG {k}x{n} {form} {name}: {err:.2e} -->", flush=True)
            us[name] = float("inf")
    ship = cfgs["shipped"]
    return Cells(us, cfgs, fmt(ship, p) if ship.variant == "gemv_tc" else ship.variant)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="14336x4096,4096x14336", help="K x N")
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    names = a.configs.split(",")
    gen = torch.Generator(device=DEV).manual_seed(7)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, M = 1, 4-bit g32, us (median)\n")
    print("| K x N | form | shipped | gemv | " + " | ".join(names) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |")
    found = {}
    for shape in a.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        rows = {form: measure(k, n, form, names, a.reps, gen) for form in FORMS}
        for form, t in rows.items():
            print(f"| {k}x{n} | {form} | {t.us['shipped']:.1f} ({t.shipped}) | {t.us['gemv']:.1f} | "
                  + " | ".join(f"{t.us[c]:.1f}" for c in names) + " |", flush=True)
        best = {form: min(t.us[c] for c in names) for form, t in rows.items()}
        worst = {c: max(rows[f].us[c] / best[f] for f in FORMS) for c in names}
        pick = min(worst, key=worst.get)
        gain = {f: rows[f].us["shipped"] / rows[f].us[pick] for f in FORMS}
        print(f"\n{k}x{n}: the config with the smallest worst ratio to each form's best: {pick} (worst "
              f"{worst[pick]:.2f}x); shipped / it: " + ", ".join(f"{f} {g:.2f}x" for f, g in gain.items()) + "\n")
        sym = rows["gptq_sym"]
        if sym.us[pick] < sym.us["gemv"]:  # both times from one run, as configs.measured_variant compares them
            found[configs.table_key("gemv_tc", 1, n, k, 4, 32)] = entry(sym.configs[pick], sym.us[pick])
            found[configs.table_key("gemv", 1, n, k, 4, 32)] = entry(sym.configs["gemv"], sym.us["gemv"])
    print(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
