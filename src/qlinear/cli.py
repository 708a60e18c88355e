"""``qlinear`` on the command line: ``backends``, ``explain``, ``demo``, ``inspect`` and ``convert``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .activations import ActQuant
from .caps import KNOWN_ARCHS, Problem, caps_table_row
from .cli_checkpoint import add_checkpoint_commands
from .cli_run import add_run_command
from .enums import BACKEND, FORMAT
from .floats import Element
from .kernels.registry import all_kernels
from .select import explain, parse_dtype
from .spec import PACK_DTYPES, ConfigError, Scheme, method_of
from .target import DeviceError, Target


def _target(args: argparse.Namespace) -> Target:
    if args.gpu_arch:
        major, _, minor = args.gpu_arch.removeprefix("sm_").partition(".")
        if not minor and len(major) >= 2:
            major, minor = major[:-1], major[-1]
        arch = (int(major), int(minor or 0))
        if arch not in KNOWN_ARCHS:
            raise ConfigError(f"--gpu-arch {args.gpu_arch}: unknown architecture; known: "
                              + ", ".join(f"{a[0]}.{a[1]}" for a in KNOWN_ARCHS))
        return Target.fake_cuda(arch, name=f"hypothetical sm_{arch[0]}{arch[1]} GPU")
    return Target.here([d.strip() for d in args.device.split(",")])


def _short(values: object) -> str:
    if values is None:
        return "-"
    if isinstance(values, dict):
        return ", ".join(f"{k}:{v}" for k, v in values.items())
    if isinstance(values, list):
        return ",".join(str(v) for v in values)
    return str(values)


def cmd_backends(args: argparse.Namespace) -> int:
    """Every backend of the reference: what it declares and whether it can run on this machine."""
    target = _target(args)
    rows = []
    for kernel in all_kernels():
        row = caps_table_row(kernel.backend, kernel.__name__, kernel.caps)
        reasons = kernel.target_reasons(target)
        row["here"] = {"ok": not reasons, "reasons": reasons}
        row["runs"] = runs_summary(kernel)
        rows.append(row)
    if args.json:
        json.dump({"target": str(target), "kernels": rows}, sys.stdout, indent=2)
        print()
        return 0
    cols = ("class", "backend", "formats", "bits", "group_sizes", "devices", "dtypes")
    if args.markdown:
        print(markdown_table(rows, cols))
        return 0
    print(f"target: {target}")
    table = [[_short(r[c]) for c in cols] + ["yes" if r["here"]["ok"] else "no: " + "; ".join(r["here"]["reasons"])]
             for r in rows]
    headers = [*cols, "runs here"]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(headers[:-1])]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)) + "  " + headers[-1])
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)) + "  " + t[-1])
    return 0


def runs_summary(kernel: type) -> str:
    """What a kernel runs, and where: the first sentence of its class docstring."""
    text = " ".join((kernel.__doc__ or "").split("\n\n")[0].split()).replace("``", "")
    head = text.partition(". ")[0]
    return head if not head or head.endswith(".") else head + "."


def markdown_table(rows: list[dict[str, object]], cols: Sequence[str]) -> str:
    """The declarations as a Markdown table (docs/backends.md is generated from this)."""
    extra = ("desc_act", "sym", "pack_dtypes", "in_divisible", "out_divisible", "gpu_archs", "requires")
    head = [*cols, *extra, "status"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        reasons = r["here"]["reasons"]
        status = "not implemented yet" if "not implemented yet" in reasons else (
            next((x for x in reasons if x.startswith("retired")), f"implemented: {r['runs']}"))
        cells = [_short(r[c]) for c in (*cols, *extra)] + [status]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out)


def cmd_explain(args: argparse.Namespace) -> int:
    """Which kernel runs this layer here, and why each other one cannot."""
    fmt = FORMAT(args.format)
    element = Element(args.element) if args.element else None
    bits = element.bits if element else args.bits
    block = _block(args.scale_block, args.in_features) if args.scale_block else None
    scheme = Scheme(bits=bits, group_size=block[1] if block else args.group_size, in_features=args.in_features,
                    out_features=args.out_features, sym=not args.asym, desc_act=args.desc_act,
                    method=method_of(fmt), format=fmt, pack_dtype=args.pack_dtype, element=element,
                    scale_block=block, activations=ACTIVATIONS[args.activations] if args.activations else None)
    problem = Problem(scheme, parse_dtype(args.dtype), training=args.training)
    choice = explain(problem, _target(args), args.backend)
    if args.json:
        json.dump(choice.to_dict(), sys.stdout, indent=2)
        print()
    else:
        print(choice.explain())
    return 0 if choice.kernel is not None else 1


#: ``--activations`` spellings: the activation quantizations checkpoints name most.
ACTIVATIONS = {
    "fp8-token": ActQuant(bits=8, element=Element.E4M3, strategy="token", scales="dynamic"),
    "fp8-tensor-static": ActQuant(bits=8, element=Element.E4M3, strategy="tensor", scales="static"),
    "fp8-group128": ActQuant(bits=8, element=Element.E4M3, strategy="group", scales="dynamic", group_size=128),
    "int8-token": ActQuant(bits=8, element=None, strategy="token", scales="dynamic"),
    "nvfp4": ActQuant(bits=4, element=Element.E2M1, strategy="tensor_group", scales="local", group_size=16),
}


def _block(text: str, in_features: int) -> tuple[int, int]:
    """``RxC`` -> (R, C); ``C`` alone is one row by C columns; ``-1`` columns is the whole row."""
    rows, _, cols = text.lower().rpartition("x")
    c = int(cols)
    return int(rows or 1), in_features if c == -1 else c


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo.__main__ import main as demo_main

    return demo_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qlinear", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def add_target(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default="cpu", help="device(s) of this machine, comma-separated (cpu, cuda:0,...)")
        p.add_argument("--gpu-arch", help="ask about a hypothetical CUDA GPU instead, e.g. 9.0 or sm_90")
        p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("backends", help="every backend: declarations and whether it runs here")
    add_target(p)
    p.add_argument("--markdown", action="store_true", help="the declarations as a Markdown table (for the docs)")
    p.set_defaults(func=cmd_backends)

    p = sub.add_parser("explain", help="which backend runs a layer, and why the others cannot")
    add_target(p)
    p.add_argument("--format", default="gptq_v2", help=f"one of: {', '.join(f.value for f in FORMAT)}")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--in", dest="in_features", type=int, required=True, help="in_features (K)")
    p.add_argument("--out", dest="out_features", type=int, required=True, help="out_features (N)")
    p.add_argument("--asym", action="store_true", help="asymmetric (zero points); default symmetric")
    p.add_argument("--desc-act", action="store_true", help="act-order grouping (g_idx)")
    p.add_argument("--training", action="store_true")
    p.add_argument("--dtype", default="float16", help="activation dtype: float16, bfloat16, float32")
    p.add_argument("--pack-dtype", default=None, choices=list(PACK_DTYPES),
                   help="storage word (default: the format's own, int16 for gemv_fast/llm-awq, else int32)")
    p.add_argument("--element", default=None, help="float formats: float8_e4m3fn (e4m3), float8_e5m2, float4_e2m1")
    p.add_argument("--scale-block", default=None, help="rows x cols one scale covers, e.g. 128x128, 1x16, 1x-1")
    p.add_argument("--activations", default=None, choices=list(ACTIVATIONS),
                   help="the checkpoint's activation quantization (W8A8, W4A4)")
    p.add_argument("--backend", default="auto", help=f"auto or one of: {', '.join(b.value for b in BACKEND)}")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("demo", help="quantize MiniLM-L6 and run it through qlinear kernels")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options passed to the demo (see qlinear demo -- -h)")
    p.set_defaults(func=cmd_demo)
    add_checkpoint_commands(sub)
    add_run_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, DeviceError, ValueError) as err:
        print(f"qlinear: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
