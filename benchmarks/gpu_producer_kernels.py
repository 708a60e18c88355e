"""EXL3 and VPTQ at small M against their own projects' CUDA kernels, built here from the producers' sources and
run side by side with qlinear's layers and bf16 ``F.linear`` (issue 24: "faster than their own project's kernel").

    # sources: exllamav3's extension ships in its wheel (exllamav3/exllamav3_ext); VPTQ's in its repository (csrc)
    PYTHONPATH=src:benchmarks python benchmarks/gpu_producer_kernels.py \\
        --exl3-src .peers/exllamav3_ext --vptq-src .peers/vptq/csrc

Builds (``torch.utils.cpp_extension.load``, sm of this GPU only, about a minute each): exllamav3's small-m GEMV
(``quant/exl3_gemv.cu`` with its ``exl3_devctx.cu``, the instances this run times: its dispatch lists 88, and one
translation unit of them all takes minutes) through its own direct entry point ``exl3_gemv``, which runs the whole
layer in one cooperative launch (input sign flips and Hadamard, trellis product, output Hadamard and sign flips);
and VPTQ's ``WqA16WithOutliers_PackIndice``, the kernel VPTQ's ``quant_gemm`` runs below 3 rows, launched by
``peers/vptq_gemv.cu`` with VPTQ's grid for the two configurations timed (its own host dispatch instantiates about
a thousand).

Checks first: each producer kernel's output against qlinear's layer on the same checkpoint tensors and against
float64 (``x @ W`` from qlinear's exact decode, itself bit-exact with the producers' Python decoders in the CPU
tests). Timing as the other GPU reports (``gpu_linear.timed``: CUDA graph over weight copies exceeding 4x L2,
median per call). The producers' kernels take float16 activations (VPTQ: the codebook's dtype; exllamav3: float16
only); qlinear's layers take bfloat16, as a bf16 model feeds them. ``$OUT`` receives ``gpu_producer_kernels.md``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_report import bf16_baseline, checks_then_timing, parser, say
from gpu_report import parse as parse_args

HERE = Path(__file__).resolve().parent / "peers"
SHAPES = ((4096, 14336), (14336, 4096))
MS = (1,)
# (bits, codebook) pairs exllamav3's GEMV takes: widths 2-4, and 3inst only at 4 bits (exl3_gemv_try_launch)
EXL3_FORMS = ((4, "3inst"), (4, "mcg"), (2, "mcg"), (2, "mul1"), (3, "mcg"))
CB_INDEX = {"3inst": 0, "mcg": 1, "mul1": 2}
VPTQ_CONFIGS = ("v8-k65536", "v8-k65536-256")
DEV = torch.device("cuda")


def _arch_flags() -> list[str]:
    major, minor = torch.cuda.get_device_capability()
    suffix = "a" if major == 9 else ""  # sm_90a: exllamav3 uses Hopper-only PTX where the arch allows it
    return [f"-gencode=arch=compute_{major}{minor}{suffix},code=sm_{major}{minor}{suffix}"]


def exl3_sources(src: Path, build: Path, forms: tuple[tuple[int, str], ...]) -> list[Path]:
    """Copy exllamav3's extension sources to ``build``, cut the GEMV's instance list to ``forms`` (one-row and
    few-row modes, both grid configurations, float16 output, shuffle extraction: what its dispatcher picks up to
    M = 8), and return the translation units to compile."""
    dst = build / "exllamav3_ext"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    gemv = dst / "quant" / "exl3_gemv.cu"
    text = gemv.read_text()
    grids = re.compile(r"^\s*SEL_GRID\(\d.*\n", re.M)
    if len(grids.findall(text)) < 2 or "#undef SEL_GRID" not in text:
        raise RuntimeError(f"{gemv}: the SEL_GRID instance list this build trims is not there (exllamav3 changed)")
    sels = "".join(f"    SEL({b}, {CB_INDEX[cb]}, false, {mm}, {cfg}, false)\n"
                   for b, cb in forms for mm in (0, 1) for cfg in (0, 1))
    text = grids.sub("", text).replace("    #undef SEL_GRID", sels + "    #undef SEL_GRID", 1)
    gemv.write_text(text)
    return [gemv, dst / "quant" / "exl3_devctx.cu", HERE / "exl3_gemv_half_stub.cu", HERE / "exl3_gemv_bind.cpp"]


def build_exl3(src: Path, build: Path) -> ModuleType:
    from torch.utils.cpp_extension import load

    sources = exl3_sources(src, build, EXL3_FORMS)
    return load(name="peer_exl3_gemv", sources=[str(s) for s in sources], build_directory=str(build),
                extra_include_paths=[str(build / "exllamav3_ext")], extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3", "--use_fast_math", *_arch_flags()], verbose=False)


def build_vptq(src: Path, build: Path) -> ModuleType:
    from torch.utils.cpp_extension import load

    # VPTQ builds without torch's no-half-operator defines (its CMake file); its kernels use the operators
    undef = [f"-U__CUDA_NO_{n}__" for n in ("HALF_OPERATORS", "HALF_CONVERSIONS", "HALF2_OPERATORS",
                                            "BFLOAT16_CONVERSIONS")]
    return load(name="peer_vptq_gemv", sources=[str(HERE / "vptq_gemv.cu")], build_directory=str(build),
                extra_include_paths=[str(src)], extra_cuda_cflags=["-O3", "--use_fast_math", "-std=c++17", *undef,
                                                                   *_arch_flags()], verbose=False)


def timed_any(fns: list[Callable[[torch.Tensor], torch.Tensor]], x: torch.Tensor, reps: int) -> tuple[float, str]:
    """``gpu_linear.timed`` (CUDA graph replays); where a kernel cannot be captured, events around plain launches
    (launch cost included), marked ``*``."""
    import statistics

    from gpu_linear import timed

    try:
        return timed(fns, x, reps), ""
    except RuntimeError:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for f in fns:
            f(x)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / len(fns))
    return statistics.median(times), "*"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# ---- EXL3 ---------------------------------------------------------------------------------------------------------


def exl3_layer(k: int, n: int, bits: int, cb: str, gen: torch.Generator):
    from gpu_exl3 import random_tensors
    from qlinear.kernels.exl3 import ExllamaV3Linear
    from qlinear.layouts.exl3 import Exl3Params
    from qlinear.spec import Scheme

    s = Scheme(bits=bits, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
               pack_dtype=torch.int16, layout_params=Exl3Params(bits, cb))
    layer = ExllamaV3Linear(s).to(DEV)
    layer.load_exl3(random_tensors(k, n, bits, cb, gen, DEV))
    return layer


# exllamav3's GEMV launch choices: its shape heuristic (what exl3_gemm runs), or one grid configuration forced
# through the EXL3_GEMV variable its launcher reads at each launch
EXL3_MODES = {"heuristic": "1", "narrow": "3", "wide": "4"}


def exl3_call(ext: ModuleType, layer, cb: str, ran: list[bool]) -> Callable[[torch.Tensor], torch.Tensor]:
    """exllamav3's GEMV on ``layer``'s checkpoint tensors, launched as its exl3_gemm launches it (``ran`` gets
    False where its heuristic declines); scratch and output allocated once, as its own module keeps them."""
    t = layer.tensors()
    k, n = layer.in_features, layer.out_features
    scratch: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def call(x: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        if m not in scratch:
            scratch[m] = (torch.empty(m, k, dtype=torch.half, device=DEV),
                          torch.empty(m, n, dtype=torch.half, device=DEV))
        had, out = scratch[m]
        ran.append(ext.gemv_as_gemm(x, t["trellis"], out, t["suh"], had, t["svh"], cb == "mcg", cb == "mul1"))
        return out

    return call


def exl3_mode(mode: str) -> None:
    os.environ["EXL3_GEMV"] = EXL3_MODES[mode]


def exl3_checks(ext: ModuleType, gen: torch.Generator) -> int:
    from qlinear.kernels.exl3 import ExllamaV3TorchLinear

    say("### EXL3: exllamav3's GEMV vs ExllamaV3Linear (qlinear, Triton) and float64")
    say()
    say("| K x N | bits | codebook | M | exllamav3 grid | rel diff exllamav3 vs qlinear | exllamav3 vs fp64 | "
        "qlinear vs fp64 |")
    say("|---|---|---|---|---|---|---|---|")
    failed = 0
    for k, n in ((4096, 1024), (1024, 4096)):
        for bits, cb in EXL3_FORMS:
            layer = exl3_layer(k, n, bits, cb, gen)
            cpu = ExllamaV3TorchLinear(layer.scheme, bias=False)
            cpu.load_state_dict({key: v.cpu() for key, v in layer.state_dict().items()})
            w = cpu.dequantize(torch.float64).t()  # [K, N]
            ran: list[bool] = []
            theirs = exl3_call(ext, layer, cb, ran)
            for m, mode in ((1, "narrow"), (1, "wide"), (4, "narrow"), (4, "wide")):
                exl3_mode(mode)
                x = torch.randn(m, k, device=DEV, generator=gen).half()
                ref = x.double().cpu() @ w
                got_t, got_q = theirs(x).cpu(), layer(x).cpu()
                e_tq, e_t, e_q = rel(got_t, got_q), rel(got_t, ref), rel(got_q, ref)
                bad = not (ran[-1] and e_t < 5e-3 and e_q < 5e-3)
                failed += bad
                say(f"| {k}x{n} | {bits} | {cb} | {m} | {mode} | {e_tq:.2e} | {e_t:.2e} | {e_q:.2e} |"
                    + (" **FAILED**" if bad else ""))
    say()
    return failed


def exl3_timing(ext: ModuleType, args: argparse.Namespace, gen: torch.Generator) -> None:
    from gpu_linear import copies, timed

    say("### EXL3 at small M: us per call (ratio to bf16 F.linear)")
    say()
    say("exllamav3: its GEMV as its exl3_gemm launches it (\"declines\": its heuristic sends the call to its block "
        "GEMM kernel, not built here), and with each grid configuration forced; best = the faster forced one.")
    say()
    say("| K x N | M | bits | codebook | bf16 | exllamav3 (its choice) | narrow | wide | best | ratio | qlinear layer "
        "| ratio | qlinear / exllamav3 best |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, gen)
        for bits, cb in EXL3_FORMS:
            layers = [exl3_layer(k, n, bits, cb, gen) for _ in range(copies(n * k * bits // 8))]
            ours = [lambda x, lay=lay: lay(x) for lay in layers]
            ran: list[bool] = []
            theirs = [exl3_call(ext, lay, cb, ran) for lay in layers]
            for m in args.ms:
                x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
                tb, tq = timed(wb, x, args.reps), timed(ours, x, args.reps)
                times = {}
                for mode in EXL3_MODES:
                    exl3_mode(mode)
                    ran.clear()
                    theirs[0](x.half())
                    times[mode] = timed_any(theirs, x.half(), args.reps) if ran[-1] else None
                exl3_mode("heuristic")
                best = min(t[0] for mode, t in times.items() if mode != "heuristic" and t is not None)
                cells = " | ".join("declines" if t is None else f"{t[0]:.1f}{t[1]}" for t in times.values())
                say(f"| {k}x{n} | {m} | {bits} | {cb} | {tb:.1f} | {cells} | {best:.1f} | {best / tb:.2f} | "
                    f"{tq:.1f} | {tq / tb:.2f} | {tq / best:.2f} |")
            del layers, ours, theirs
            torch.cuda.empty_cache()
        del wb
    say()


# ---- VPTQ ---------------------------------------------------------------------------------------------------------


def vptq_call(ext: ModuleType, layer) -> Callable[[torch.Tensor], torch.Tensor]:
    t = layer.tensors()
    p = layer.params
    cents = t["centroids.weight"].view(p.group_num, p.num_centroids, p.vector_len)
    res = t.get("res_centroids.weight")
    res = None if res is None else res.view(p.group_num, p.num_res_centroids, p.vector_len)
    n = layer.out_features
    return lambda x: ext.gemv(x, t["indices"], cents, res, t["perm"], t["weight_scale"], t["weight_bias"], n)


def vptq_checks(ext: ModuleType, gen: torch.Generator) -> int:
    from gpu_vptq import random_layer
    from qlinear.kernels.vptq import VPTQLinear

    say("### VPTQ: VPTQ's GEMV kernel vs VPTQCudaLinear (qlinear) and float64")
    say()
    say("| K x N | config | M | rel diff VPTQ vs qlinear | VPTQ vs fp64 | qlinear vs fp64 |")
    say("|---|---|---|---|---|---|")
    failed = 0
    for (k, n), cfg in (((4096, 1024), "v8-k65536"), ((2048, 4096), "v8-k65536-256")):
        ours = random_layer(k, n, cfg, gen)
        ref = VPTQLinear(ours.scheme, bias=False, dtype=torch.float16).to(DEV)
        ref.load_state_dict(ours.state_dict())
        ref.prepare()
        w = ref.dequantize().double()  # [N, K], exact decode
        theirs = vptq_call(ext, ours)
        for m in (1, 2):
            x = torch.randn(m, k, device=DEV, generator=gen).half()
            want = x.double() @ w.t()
            got_t, got_q = theirs(x), ours(x.to(torch.bfloat16))
            e_tq, e_t, e_q = rel(got_t, got_q), rel(got_t, want), rel(got_q, want)
            bad = not (e_t < 1e-2 and e_q < 1e-2)
            failed += bad
            say(f"| {k}x{n} | {cfg} | {m} | {e_tq:.2e} | {e_t:.2e} | {e_q:.2e} |" + (" **FAILED**" if bad else ""))
    say()
    return failed


def vptq_timing(ext: ModuleType, args: argparse.Namespace, gen: torch.Generator) -> None:
    from gpu_linear import copies, timed
    from gpu_vptq import random_layer

    say("### VPTQ at small M: us per call (ratio to bf16 F.linear)")
    say()
    say("| K x N | M | config | bf16 | VPTQ kernel | ratio | qlinear layer | ratio | qlinear / VPTQ |")
    say("|---|---|---|---|---|---|---|---|---|")
    for k, n in args.shapes:
        wb = bf16_baseline(k, n, gen)
        for cfg in VPTQ_CONFIGS:
            one = random_layer(k, n, cfg, gen)
            nbytes = sum(t.numel() * t.element_size() for t in one.tensors().values())
            layers = [one] + [random_layer(k, n, cfg, gen) for _ in range(copies(nbytes) - 1)]
            ours = [lambda x, lay=lay: lay(x) for lay in layers]
            theirs = [vptq_call(ext, lay) for lay in layers]
            for m in sorted({min(m, 2) for m in args.ms}):
                x = torch.randn(m, k, device=DEV, dtype=torch.bfloat16, generator=gen)
                tb, tq = timed(wb, x, args.reps), timed(ours, x, args.reps)
                tt, mark = timed_any(theirs, x.half(), args.reps)
                say(f"| {k}x{n} | {m} | {cfg} | {tb:.1f} | {tt:.1f}{mark} | {tt / tb:.2f} | {tq:.1f} | {tq / tb:.2f} | "
                    f"{tq / tt:.2f} |")
            del layers, ours, theirs
            torch.cuda.empty_cache()
        del wb
    say()


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, SHAPES, MS, reps=30)
    p.add_argument("--exl3-src", type=Path, default=None, help="exllamav3's exllamav3_ext folder")
    p.add_argument("--vptq-src", type=Path, default=None, help="VPTQ's csrc folder")
    p.add_argument("--build", type=Path, default=None, help="build folder (default: a temporary one)")
    args = parse_args(p, argv)
    for name in ("exl3_src", "vptq_src"):
        path = getattr(args, name)
        if path is not None and not path.is_dir():
            p.error(f"--{name.replace('_', '-')}: {path} is not a folder")
    if args.exl3_src is None and args.vptq_src is None:
        p.error("give --exl3-src and/or --vptq-src")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    build = args.build or Path(tempfile.mkdtemp(prefix="peer_build_"))
    exts: dict[str, ModuleType] = {}
    for name, src, make in (("exl3", args.exl3_src, build_exl3), ("vptq", args.vptq_src, build_vptq)):
        if src is not None:
            sub = build / name
            sub.mkdir(parents=True, exist_ok=True)
            exts[name] = make(src, sub)
    gen = torch.Generator(device=DEV).manual_seed(0)

    def checks() -> int:
        return sum(f(exts[name], gen) for name, f in (("exl3", exl3_checks), ("vptq", vptq_checks)) if name in exts)

    def timing(a: argparse.Namespace) -> None:
        for name, f in (("exl3", exl3_timing), ("vptq", vptq_timing)):
            if name in exts:
                f(exts[name], a, gen)

    return checks_then_timing("gpu_producer_kernels", "EXL3 and VPTQ against their producers' kernels", argv, args,
                              checks, timing)


if __name__ == "__main__":
    sys.exit(main())
