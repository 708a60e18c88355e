"""``qlinear inspect`` and ``qlinear convert``: real checkpoints from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .enums import BACKEND, FORMAT
from .spec import PACK_DTYPES


def _table(rows: list[list[str]], headers: list[str]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)) + "  " + headers[-1]]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    return out


def format_inspect(report: dict[str, Any]) -> str:
    """The inspect report as text: a header line, then one row per quantized module."""
    mods = report["modules"]
    lines = [f"{report['path']}: {len(mods)} quantized modules, {report['other_tensors']} other tensors "
             f"(config: {report['config_source']}; files: {', '.join(report['files'])})",
             f"kernels chosen for {report['dtype']} activations on {report['target']}"]
    if not mods:
        return "\n".join(lines)
    rows = [[m["module"], m["format"] + (f":{m['qtype']}" if m.get("qtype") else ""), str(m["bits"]),
             str(m["group_size"]),
             ("sym" if m["sym"] else "asym") + (" desc_act" if m["desc_act"] else "") + (" bias" if m["bias"] else "")
             + (f" {m['element']}" if m.get("element") else "") + (f" act={m['activations']}"
                                                                   if m.get("activations") else ""),
             f"[{m['out_features']}, {m['in_features']}]", m["backend"] or "none", m["why"]] for m in mods]
    return "\n".join(lines + _table(rows, ["module", "format", "bits", "group", "flags", "[out, in]", "backend",
                                           "why"]))


def cmd_inspect(args: argparse.Namespace) -> int:
    """Every quantized module of a checkpoint and the backend AUTO (or --backend) picks for it here."""
    from .checkpoint.inspect import inspect_checkpoint
    from .select import parse_dtype

    report = inspect_checkpoint(args.path, device=args.device, dtype=parse_dtype(args.dtype), backend=args.backend)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(format_inspect(report))
    return 0 if all(m["backend"] for m in report["modules"]) else 1


def cmd_convert(args: argparse.Namespace) -> int:
    """Re-encode a checkpoint in another format, losslessly or not at all."""
    from .checkpoint.save import convert_checkpoint
    from .spec import pack_dtype_of

    pack = pack_dtype_of(args.pack_dtype) if args.pack_dtype else None
    try:
        out = convert_checkpoint(args.src, args.dst, args.format, pack_dtype=pack, max_shard_size=args.max_shard_size,
                                 overwrite=args.overwrite)
    except FileExistsError as err:
        print(f"qlinear: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} as {FORMAT(args.format).value} (every module re-read and compared: lossless)")
    return 0


def add_checkpoint_commands(sub: Any) -> None:
    """Register ``inspect`` and ``convert`` on the main parser's subcommands."""
    p = sub.add_parser("inspect", help="quantized modules of a checkpoint and the backend picked for each here")
    p.add_argument("path", help="checkpoint directory or .safetensors file")
    p.add_argument("--device", default="cpu", help="device to choose kernels for (cpu, cuda:0, ...)")
    p.add_argument("--dtype", default="float16", help="activation dtype: float16, bfloat16, float32")
    p.add_argument("--backend", default="auto", help=f"auto or one of: {', '.join(b.value for b in BACKEND)}")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("convert", help="re-encode a checkpoint in another format (lossless or refused)")
    p.add_argument("src", help="checkpoint directory or .safetensors file")
    p.add_argument("dst", help="output directory (written atomically)")
    p.add_argument("--format", required=True,
                   help="gptq, gptq_v2, gptq_p, gemm, gemv, gemv_fast, llm-awq; compressed-tensors pack-quantized, "
                        "naive-quantized, int-quantized, float-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized; "
                        "fp8 (GPTQModel), hf_fp8 (transformers); bitblas (GPTQModel's BitBLAS layout); mlx (mlx-lm); "
                        "paroquant (same format only)")
    p.add_argument("--pack-dtype", default=None, choices=list(PACK_DTYPES),
                   help="storage word (default: the format's own, int16 for gemv_fast/llm-awq, else int32)")
    p.add_argument("--max-shard-size", default="4GB", help="split model.safetensors past this size (e.g. 4GB)")
    p.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=cmd_convert)
