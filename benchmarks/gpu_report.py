"""The frame the per-format GPU benchmarks share (gpu_qqq, gpu_vptq, gpu_exl2, gpu_exl3, gpu_paroquant): the report
lines, the common arguments (shapes, Ms, repetitions, checks on or off, an extra output file), the header naming the
device and versions, and where the report goes (``--out`` and ``$OUT/<name>.md``)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

LINES: list[str] = []


def say(line: str = "") -> None:
    print(line, flush=True)
    LINES.append(line)


def parser(doc: str, shapes: Sequence[tuple[int, int]], ms: Sequence[int], reps: int = 30) -> argparse.ArgumentParser:
    """An argument parser with the common options; a script adds its own before ``parse``."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in shapes), help="K x N, comma separated")
    p.add_argument("--ms", default=",".join(map(str, ms)))
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--out", default=None, help="also write the report to this file")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str] | None, *int_lists: str) -> argparse.Namespace:
    """Parse, turning ``--shapes`` into (K, N) pairs and ``--ms`` plus each of ``int_lists`` into integer lists."""
    args = p.parse_args(argv)
    args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    for name in ("ms", *int_lists):
        setattr(args, name, [int(v) for v in getattr(args, name).split(",")])
    return args


def bf16_baseline(k: int, n: int, gen: torch.Generator) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """The bf16 ``F.linear`` calls every format is timed against: one per dense weight copy, enough copies that
    together they exceed L2 (``gpu_linear.copies``), so HBM is what is measured."""
    import torch.nn.functional as F

    from gpu_linear import copies

    weights = [torch.randn(n, k, device=gen.device, dtype=torch.bfloat16, generator=gen) * 0.02
               for _ in range(copies(n * k * 2))]
    return [lambda x, w=w: F.linear(x, w) for w in weights]


def checks_then_timing(name: str, title: str, argv: list[str] | None, args: argparse.Namespace,
                       checks: Callable[[], int], timing: Callable[[argparse.Namespace], int | None]) -> int:
    """A script's whole run: its checks (unless ``--no-check``), its timing table (which may check what it times
    and return its failures), the failure count; exit status 1 when a check failed."""
    failed: list[int] = []

    def body() -> None:
        failed.append(0 if args.no_check else checks())
        failed[0] += timing(args) or 0
        say(f"{failed[0]} check(s) failed")

    run(name, title, argv, args.out, body)
    return 1 if failed[0] else 0


def run(name: str, title: str, argv: list[str] | None, out: str | None, body: Callable[[], object]) -> str:
    """Write the header, run ``body``, then the footer; save the report; return its text."""
    import triton

    t0 = time.time()
    say(f"# {title} on {torch.cuda.get_device_name()} (torch {torch.__version__}, triton {triton.__version__})")
    say()
    say(f"command: python benchmarks/{name}.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    say()
    body()
    say(f"<!-- {time.time() - t0:.0f} s -->")
    text = "\n".join(LINES) + "\n"
    for dest in (out, os.path.join(os.environ["OUT"], f"{name}.md") if os.environ.get("OUT") else None):
        if dest:
            Path(dest).write_text(text)
    return text
