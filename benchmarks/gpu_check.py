"""CUDA correctness sweep of the Triton kernels over every declared combination, plus a SASS report.

    python3 benchmarks/gpu_check.py            # sweep (covering design; --full for the product): exit 1 on failure
    python3 benchmarks/gpu_check.py --jobs 8   # the same sweep as 8 processes side by side (compile-bound)
    python3 benchmarks/gpu_check.py --sass     # registers, spills, shared memory, HGMMA/HMMA/vector-load counts
    python3 benchmarks/gpu_check.py --conformance   # every implemented CUDA kernel's declared combinations vs float64

Fresh random codes, scales, zeros and act-order per layer; the reference is float64 on the GPU from the
generated canonical weight (no qlinear decoding). Outputs are poisoned with NaN first (every element must
be written); each call runs twice (split-K must be deterministic) and the split-K counters must end at 0.
Tolerance on |y - ref| / |ref|: float16 2e-3, bfloat16 1e-2.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from qlinear import Scheme
from qlinear.affine import AffineWeight
from qlinear.kernels.triton.configs import Config
from qlinear.kernels.triton_awq import AwqGEMMTritonLinear
from qlinear.kernels.triton_gptq import TritonV2Linear

TOL = {torch.float16: 2e-3, torch.bfloat16: 1e-2}
BITS = (2, 4, 8)
GROUPS = (-1, 16, 32, 64, 128, 256, 1024)
SHAPES = ((2048, 1536), (2144, 1000), (1056, 777), (4096, 512))  # K x N: K tails, odd and unaligned N
M_VARIANT = ((1, "auto"), (4, "auto"), (1, "gemv_tc"), (5, "gemv_tc"), (8, "gemv_tc"), (13, "gemv_tc"),
             (1, "gemv"), (2, "gemv"), (3, "gemv"), (6, "gemv"),
             (16, "skinny"), (5, "skinny2"), (16, "skinny2"), (1, "skinny3"), (5, "skinny3"),
             (16, "skinny3"), (33, "gemm"), (128, "gemm"), (33, "gemm2"), (128, "gemm2"), (33, "gemm3"),
             (200, "gemm3"), (16, "gemm4"), (33, "gemm4"), (200, "gemm4"), (600, "gemm4"), (33, "gemm4@s7"),
             (16, "gemm5"), (33, "gemm5"), (200, "gemm5"), (600, "gemm5"), (33, "gemm5@s6"), (33, "gemm5@s7"),
             (1100, "gemm5@t2"), (1024, "dense"))
#: ``variant@sN``: the variant's config with split-K forced to N (on K = 2048, 128-code steps: 16 steps split 6
#: ways leaves one step (odd) for the last CTA, 7 ways none: the gemm4/gemm5 pair padding and peeled pair);
#: ``gemm5@tN``: 64x64 tiles, one CTA an SM, the last wave's columns split N ways in a second launch (at M = 1100
#: on 132 SMs: 18 M tiles, so N = 1536, 1000 and 512 leave 2, 2 and 1 columns of tiles to it, 777 none)


def tail_fires(cfg: Config, m: int, layer: TritonV2Linear) -> bool:
    """Whether gemm5 runs this call's last wave as a second, split launch (``qmm5.wave_tail``)."""
    if cfg.variant != "gemm5" or cfg.tail_split < 2:
        return False
    from qlinear.kernels.triton.qmm5 import resident, wave_tail

    p = layer.packed()
    slots = torch.cuda.get_device_properties(p.qweight.device).multi_processor_count * resident(cfg, cfg.block_k, p)
    return wave_tail(-(-m // cfg.block_m), -(-p.n // cfg.block_n), slots, cfg.tail_split) > 0


def random_affine(n: int, k: int, bits: int, group: int, sym: bool, desc: bool, gen: torch.Generator) -> AffineWeight:
    gs = k if group == -1 else group
    g = -(-k // gs)
    codes = torch.randint(0, 1 << bits, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, g, generator=gen) * 0.02 + 0.002).half().float()  # checkpoint scales are float16
    if sym:
        zeros = torch.full((n, g), 1 << (bits - 1), dtype=torch.int32)
    else:
        zeros = torch.randint(0, 1 << bits, (n, g), generator=gen, dtype=torch.int32)
    g_idx = torch.arange(k, dtype=torch.int32) // gs
    if desc:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    return AffineWeight(codes, scales, zeros, g_idx, bits, gs, sym)


def reference(q: AffineWeight, dev: torch.device) -> torch.Tensor:
    g = q.g_idx.long().to(dev)
    s, z = q.scales.double().to(dev), q.zeros.double().to(dev)
    return s[:, g] * (q.codes.double().to(dev) - z[:, g])


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def check_layer(layer: TritonV2Linear, q: AffineWeight, bias: torch.Tensor | None, dtype: torch.dtype,
                gen: torch.Generator, variants: tuple[str, ...] = ()) -> list[tuple[int, str, float, str]]:
    """Run every (M, variant) on one layer; returns (M, variant, error, problem-or-'')."""
    dev = layer._rt_qweight.device
    w64 = reference(q, dev)
    out = []
    from qlinear.kernels.triton.gemm4_limits import gemm4_reasons
    from qlinear.kernels.triton.qmm3 import skinny3_reasons
    from qlinear.kernels.triton.qmv_tc import capability, tc_reasons

    for m, name in M_VARIANT:
        variant, _, forced = name.partition("@")
        if variants and variant not in variants:
            continue
        if variant in ("skinny3", "gemm3") and skinny3_reasons(layer.packed(), m, dtype, variant):
            continue  # not declared for this layer (4-bit, 2+ word rows per field block): nothing to check
        if variant in ("gemm4", "gemm5") and gemm4_reasons(layer.packed(), m, dtype, capability(dev), variant):
            continue  # 4-bit, field blocks of 8 word rows, sm_90
        if variant == "gemv_tc" and tc_reasons(layer.packed(), m, dtype):
            continue  # 2/4-bit, field blocks of 2+ word rows
        x = torch.randn(m, q.in_features, generator=gen).to(dev, dtype)
        ref = x.double() @ w64.t() + (bias.double().to(dev) if bias is not None else 0)
        cfg = layer.config_for(m, dev, None if variant == "auto" else variant)
        if forced.startswith("s"):
            cfg = replace(cfg, split_k=int(forced[1:]))
        elif forced.startswith("t"):
            cfg = replace(cfg, block_m=64, block_n=64, num_warps=4, max_registers=0, split_k=1,
                          tail_split=int(forced[1:]))
        if variant in ("dense", "auto"):  # auto: the layer's own choice by M (the shipped table)
            y1 = layer.matmul(x, config=cfg)
            y2 = layer.matmul(x, config=cfg)
            variant = f"auto:{cfg.variant}" if variant == "auto" else variant
        else:
            from qlinear.kernels.triton.qmm import qmm

            y1 = torch.full((m, q.out_features), float("nan"), dtype=dtype, device=dev)
            y2 = torch.full_like(y1, float("nan"))
            r1 = qmm(x, layer.packed(), cfg, layer.bias, layer._rt_lock, out=y1)
            r2 = qmm(x, layer.packed(), cfg, layer.bias, layer._rt_lock, out=y2)
            if r1.data_ptr() != y1.data_ptr() or r1.shape != y1.shape or r2.shape != y2.shape:
                out.append((m, variant, float("nan"), f"returned {tuple(r1.shape)}, not the output it wrote"))
                continue
        sync(dev)
        err = float((y1.double() - ref).norm() / ref.norm())
        problem = ""
        if not bool(torch.isfinite(y1).all()):
            problem = "unwritten/NaN outputs"
        elif err > TOL[dtype]:
            problem = f"error {err:.2e} > {TOL[dtype]:.0e}"
        elif not torch.equal(y1, y2):
            problem = "two runs differ (race?)"
        elif int(layer._rt_lock.abs().sum()):
            problem = "split-K counters not reset"
        tag = f"/split{cfg.split_k}" if cfg.split_k > 1 else ""
        tag += f"/tail{cfg.tail_split}" if tail_fires(cfg, m, layer) else ""
        out.append((m, variant + tag, err, problem))
    return out


def write_rows(out: str | None, rows: list[tuple[str, int, str, float, str]]) -> list[str]:
    """The check table as markdown lines, also written to ``out`` when given."""
    table = ["| layer | M | variant | rel err | result |", "| --- | --- | --- | --- | --- |"]
    table += [f"| {name} | {m} | {v} | {err:.2e} | {problem or 'ok'} |" for name, m, v, err, problem in rows]
    if out:
        Path(out).write_text("\n".join(table) + "\n")
    return table


def sweep(full: bool, dev: torch.device, shapes: tuple[tuple[int, int], ...] = SHAPES,
          awq_shape: tuple[int, int] = (2048, 1000), budget: float = 1e9, out: str | None = None,
          bits: tuple[int, ...] = BITS, variants: tuple[str, ...] = (), shard: tuple[int, int] = (0, 1)) -> int:
    """Every (bits, group) once with (sym, act-order) rotating so each bits meets all four, dtypes
    alternating; ``full``: the whole product (4x the layers, mostly compile time). ``shard`` ``(i, n)``: only
    the layers whose index is ``i`` mod ``n`` (each layer draws from its own seed, so shards add up to the
    whole sweep)."""
    rows, failures, t0, skipped = [], 0, time.time(), 0
    flags = [(True, False), (False, True), (True, True), (False, False)]
    if full:
        combos = [(b, g, s, d) for b in bits for g in GROUPS for s, d in flags]
    else:
        combos = [(b, g, *flags[(i + b) % 4]) for b in bits for i, g in enumerate(GROUPS)]
    for i, (b, g, sym, desc) in enumerate(combos):
        if i % shard[1] != shard[0]:
            continue
        if time.time() - t0 > budget:
            skipped += 1
            continue
        gen = torch.Generator().manual_seed(1234 + i)
        k, n = shapes[i % len(shapes)]
        dtype = (torch.float16, torch.bfloat16)[i % 2]
        q = random_affine(n, k, b, g, sym, desc, gen)
        bias = torch.randn(n, generator=gen) * 0.1 if (i + 1) % 3 else None
        scheme = Scheme(bits=b, group_size=g, in_features=k, out_features=n, sym=sym, desc_act=desc, format="gptq_v2")
        layer = TritonV2Linear(scheme, bias=bias is not None, dtype=dtype)
        layer.load_affine(q, bias)
        layer = layer.to(dev)
        layer.prepare()
        for m, v, err, problem in check_layer(layer, q, layer.bias, dtype, gen, variants):
            failures += bool(problem)
            rows.append((f"gptq {b}b g{g} {'sym' if sym else 'asym'}{' act' if desc else ''} "
                         f"{str(dtype)[6:]} {k}x{n}", m, v, err, problem))
        write_rows(out, rows)  # after every layer: a run cut short by a timeout leaves what it checked
    for j, (g, sym) in enumerate(((128, False), (32, True), (-1, False), (64, True))):
        if (len(combos) + j) % shard[1] != shard[0]:
            continue
        if time.time() - t0 > budget:
            skipped += 1
            continue
        gen = torch.Generator().manual_seed(1234 + len(combos) + j)
        k, n = awq_shape
        q = random_affine(n, k, 4, g, sym, False, gen)
        scheme = Scheme(bits=4, group_size=g, in_features=k, out_features=n, sym=sym, method="awq", format="gemm")
        layer = AwqGEMMTritonLinear(scheme, dtype=torch.float16)
        layer.load_affine(q)
        layer = layer.to(dev)
        layer.prepare()
        for m, v, err, problem in check_layer(layer, q, None, torch.float16, gen, variants):
            failures += bool(problem)
            rows.append((f"awq 4b g{g} {'sym' if sym else 'asym'} float16 {k}x{n}", m, v, err, problem))
        write_rows(out, rows)
    table = write_rows(out, rows)
    # the console gets the failures and the worst error per variant (the full table can be long)
    print("\n".join(table[:2] + [t for t, r in zip(table[2:], rows) if r[4]]))
    worst: dict[str, float] = {}
    for _, _, v, err, _ in rows:
        worst[v.split("/")[0]] = max(worst.get(v.split("/")[0], 0.0), err)
    print("worst rel err per variant: " + ", ".join(f"{v} {e:.1e}" for v, e in worst.items()))
    where = f"; full table in {out}" if out else ""
    print(f"{len(rows)} checks, {failures} failed, {time.time() - t0:.0f} s{where}")
    if skipped:
        print(f"INCOMPLETE: {skipped} layers not run (over the --budget of {budget:.0f} s)")
    return 1 if failures else 0


#: (M, variant) for the GGUF runtime forms (groups of 32 with offsets): gemm5 through x in fragment order, its
#: split-K pair padding, and the variants that added offsets before it
FORM_CALLS = ((16, "gemm5"), (33, "gemm5"), (200, "gemm5"), (600, "gemm5"), (33, "gemm5@s7"), (1100, "gemm5@t2"),
              (12, "gemv_tc"), (20, "skinny2"), (50, "gemm2"))


def forms_sweep(dev: torch.device, out: str | None = None,
                shapes: tuple[tuple[int, int], ...] = ((2048, 1000), (1280, 777))) -> int:
    """GGUF Q4_K's two-level form (uint8 sub-scales and mins, float32 super pairs) and Q4_0/Q4_1's float32
    scale-and-offset form through the GPTQ kernels, against float64 built from the fields (no qlinear decoding),
    float16 and bfloat16, odd N and a K that is not a multiple of 64."""
    from qlinear.kernels.triton.layout import build_affine32, build_kquant
    from qlinear.kernels.triton.qmm import lock_slots, qmm
    from qlinear.kernels.triton_gptq import fitted_config, unfit_variants

    rows, failures = [], 0
    for i, (form, (k, n)) in enumerate([(f, s) for f in ("kquant", "affine32") for s in shapes]):
        gen = torch.Generator().manual_seed(99 + i)
        g = k // 32
        codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        if form == "kquant":
            sc, mn = (torch.randint(0, 64, (n, g), generator=gen, dtype=torch.uint8) for _ in range(2))
            d, dmin = ((torch.rand(n, -(-g // 8), generator=gen) * 2e-3).half().float() for _ in range(2))
            sup = torch.arange(g) // 8
            s64 = d.double()[:, sup] * sc.double()
            o64 = -dmin.double()[:, sup] * mn.double()
            p = build_kquant(codes, sc, mn, d, dmin)
        else:
            s64 = (torch.rand(n, g, generator=gen) * 0.02 + 0.002).double()
            o64 = (torch.rand(n, g, generator=gen) - 0.5).double() * 0.1
            p = build_affine32(codes, s64.float(), o64.float())
        grp = torch.arange(k) // 32
        w = (s64[:, grp] * codes.double() + o64[:, grp]).to(dev)
        p = p.with_tensors(**{name: t.to(dev) for name, t in p.tensors().items() if t is not None})
        lock = torch.zeros(lock_slots(n), dtype=torch.int32, device=dev)
        dtype = (torch.bfloat16, torch.float16)[i % 2]
        for m, name in FORM_CALLS:
            variant, _, forced = name.partition("@")
            if variant in unfit_variants(p, m, dtype, dev):
                continue  # this layout, dtype or device cannot run it
            cfg = fitted_config(p, m, dtype, dev, variant)
            if forced.startswith("s"):
                cfg = replace(cfg, split_k=int(forced[1:]))
            elif forced.startswith("t"):
                cfg = replace(cfg, block_m=64, block_n=64, num_warps=4, max_registers=0, split_k=1,
                              tail_split=int(forced[1:]))
            if variant in ("skinny2", "gemm2"):
                cfg = replace(cfg, block_k=32)  # one 32-group a step, as GGUFTritonKernel.runtime_config runs them
            x = torch.randn(m, k, generator=gen).to(dev, dtype)
            ref = x.double() @ w.t()
            y1 = qmm(x, p, cfg, None, lock, out=torch.full((m, n), float("nan"), dtype=dtype, device=dev))
            y2 = qmm(x, p, cfg, None, lock, out=torch.full((m, n), float("nan"), dtype=dtype, device=dev))
            sync(dev)
            err = float((y1.double() - ref).norm() / ref.norm())
            problem = ("unwritten/NaN outputs" if not bool(torch.isfinite(y1).all()) else
                       f"error {err:.2e} > {TOL[dtype]:.0e}" if err > TOL[dtype] else
                       "two runs differ (race?)" if not torch.equal(y1, y2) else
                       "split-K counters not reset" if int(lock.abs().sum()) else "")
            failures += bool(problem)
            rows.append((f"{form} {str(dtype)[6:]} {k}x{n}", m, name, err, problem))
        write_rows(out, rows)
    table = write_rows(out, rows)
    print("\n".join(table[:2] + [t for t, r in zip(table[2:], rows) if r[4]]))
    print(f"{len(rows)} form checks, {failures} failed")
    return 1 if failures else 0


def sharded(jobs: int, argv: list[str], out: str | None) -> int:
    """The sweep as ``jobs`` processes of this script (``--shard i/jobs``) side by side: the sweep is mostly
    Triton compile time, one CPU core a process, so a 16-core host runs all bits inside one call. Their
    tables are merged into ``out``; the exit status is the worst of theirs."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--shard", f"{i}/{jobs}", "--out",
                               str(tmp / f"shard{i}.md")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(jobs)]
    logs = [proc.communicate()[0] for proc in procs]
    rows = [line for i in range(jobs) if (tmp / f"shard{i}.md").exists()
            for line in (tmp / f"shard{i}.md").read_text().splitlines()[2:]]
    table = ["| layer | M | variant | rel err | result |", "| --- | --- | --- | --- | --- |", *sorted(rows)]
    if out:
        Path(out).write_text("\n".join(table) + "\n")
    bad = [r for r in rows if not r.endswith("| ok |")]
    print("\n".join(table[:2] + bad))
    for i, log in enumerate(logs):
        tail = [line for line in log.splitlines() if re.search(r"checks,|INCOMPLETE|Error|error:", line)]
        print(f"shard {i}/{jobs} (exit {procs[i].returncode}): " + " / ".join(tail[-3:]))
    print(f"{len(rows)} checks, {len(bad)} failed over {jobs} shards" + (f"; full table in {out}" if out else ""))
    return max(proc.returncode for proc in procs)


SASS_OPS = ("HGMMA", "HMMA", "LDGSTS", "LDG", "LDG.128", "LDS", "STS", "BAR", "ATOMG", "RED", "FFMA", "FADD",
            "FMUL", "HFMA2", "LOP3", "SHF", "PRMT", "I2F", "F2F", "LDL", "STL")
OPCODE = re.compile(r"^(?:.*?\*/|[^\t]*\t)\s*(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)[ ;]", re.M)


def sass_counts(sass: str) -> list[int]:
    """Instructions per base opcode (``LDG.128``: 16-byte global loads) in a SASS listing (cuobjdump's
    ``/*0070*/ OP ...`` lines or triton's ``ctrl<TAB>OP ...`` lines)."""
    ops = OPCODE.findall(sass)
    base = [o.split(".")[0] for o in ops]
    out = []
    for name in SASS_OPS:
        if name == "LDG.128":
            out.append(sum(1 for o in ops if o.split(".")[0] == "LDG" and ".128" in o))
        else:
            out.append(base.count(name))
    return out


def sass_report() -> int:
    """Compile each variant on a 4-bit g128 4096x4096 layer and report what the compiler produced."""
    from qlinear.kernels.triton.runtime import LAST

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(7)
    q = random_affine(4096, 4096, 4, 128, True, False, gen)
    layer = TritonV2Linear(Scheme(bits=4, group_size=128, in_features=4096, out_features=4096), dtype=torch.bfloat16)
    layer.load_affine(q)
    layer = layer.to(dev)
    layer.prepare()
    print("| kernel | config | regs | spills | smem B | " + " | ".join(SASS_OPS) + " |")
    print("| --- " * (5 + len(SASS_OPS)) + "|")
    for m, variant in ((1, "gemv"), (16, "skinny"), (16, "skinny2"), (16, "skinny3"), (128, "gemm"), (128, "gemm2"),
                       (1024, "dense")):
        x = torch.randn(m, 4096, device=dev, dtype=torch.bfloat16)
        cfg = layer.config_for(m, dev, variant)
        layer.matmul(x, config=cfg)
        torch.cuda.synchronize()
        kern = LAST["dequant" if variant == "dense" else "qmm"]
        try:
            sass = kern.asm["sass"]
        except Exception as err:  # cuobjdump missing: say so, keep the resource numbers
            sass = ""
            print(f"(no SASS for {variant}: {err})")
        counts = sass_counts(sass)
        ptx = kern.asm.get("ptx", "")
        wgmma = "wgmma" in ptx
        print(f"| {variant}{' (wgmma in PTX)' if wgmma else ''} | {cfg.block_m}x{cfg.block_n}x{cfg.block_k} "
              f"s{cfg.split_k} w{cfg.num_warps} st{cfg.num_stages} | {kern.n_regs} | {kern.n_spills} | "
              f"{kern.metadata.shared} | " + " | ".join(map(str, counts)) + " |")
    return 0


def patch_interpreter_bf16_dot() -> None:
    """Triton's interpreter multiplies bfloat16 bit patterns as integers in tl.dot: feed it float32."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it

    original = it.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, *args):  # type: ignore[no-untyped-def]
        def f32(h):  # type: ignore[no-untyped-def]
            if h.dtype.scalar == tl.bfloat16:
                return it.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
            return h

        return original(self, f32(a), f32(b), d, *args)

    it.InterpreterBuilder.create_dot = create_dot


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sass", action="store_true", help="report compiled resources and SASS instruction counts")
    ap.add_argument("--full", action="store_true", help="the whole bits x group x sym x act-order product")
    ap.add_argument("--budget", type=float, default=200, help="seconds after which no new layer starts")
    ap.add_argument("--bits", default="2,4,8", help="weight bits to check (GPTQ layers)")
    ap.add_argument("--out", help="write the full Markdown table of checks here")
    ap.add_argument("--variants", default="", help="only these variants (comma-separated; default: all)")
    ap.add_argument("--conformance", action="store_true",
                    help="every implemented CUDA kernel's declared combinations against float64 (the conformance "
                         "harness of tests/conformance, through benchmarks/conformance_report.py --device cuda)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="run the sweep as this many processes side by side (compilation is most of its time)")
    ap.add_argument("--forms", action="store_true",
                    help="the GGUF runtime forms (Q4_K two-level, Q4_0/Q4_1 float32) through the GPTQ kernels")
    ap.add_argument("--shard", default="0/1", help="i/n: only layers i, i + n, ... (set by --jobs)")
    ap.add_argument("--interpret-smoke", action="store_true",
                    help="tiny shapes on CPU under TRITON_INTERPRET=1 (checks this script, not the GPU)")
    args = ap.parse_args()
    if args.interpret_smoke:
        patch_interpreter_bf16_dot()
        return sweep(False, torch.device("cpu"), ((192, 40), (160, 37)), (128, 40), out=args.out)
    if not torch.cuda.is_available():
        print("no CUDA device: this script checks the GPU kernels")
        return 2
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} triton "
          f"{__import__('triton').__version__}")
    if args.conformance:
        report = Path(__file__).with_name("conformance_report.py")
        return subprocess.call([sys.executable, str(report), "--device", "cuda"])
    bits = tuple(int(b) for b in args.bits.split(","))
    variants = tuple(v for v in args.variants.split(",") if v)
    if args.sass:
        return sass_report()
    if args.forms:
        return forms_sweep(torch.device("cuda"), args.out)
    if args.jobs > 1:
        argv = [f"--bits={args.bits}", f"--budget={args.budget}", f"--variants={args.variants}"]
        return sharded(args.jobs, argv + (["--full"] if args.full else []), args.out)
    index, _, count = args.shard.partition("/")
    return sweep(args.full, torch.device("cuda"), budget=args.budget, out=args.out, bits=bits, variants=variants,
                 shard=(int(index), int(count)))


if __name__ == "__main__":
    sys.exit(main())
