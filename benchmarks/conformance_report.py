"""Conformance report (issue 23): every implemented kernel's declared combinations on one device, against float64.

    PYTHONPATH=src python benchmarks/conformance_report.py --device cpu            # every valid combination
    PYTHONPATH=src python benchmarks/conformance_report.py --device cuda           # H200: 12 per CUDA kernel

Same enumeration, builders and oracles as tests/conformance (the CPU test runs a covering sample of them): the
declared space is each kernel's ``Caps`` product; *valid* expands each family's sub-types (GGUF block type, FP8
scale layout, bitsandbytes code type) and drops what ``Scheme`` refuses; *sampled* is all of them or a
deterministic covering sample of ``--cap``; each sampled combination is built through the family's public
constructor, run at M = 1 and M = 5 and compared with a float64 oracle. Refused here: the selector (or a missing
oracle package) refused it on this machine, with the reason. A combination that raises or mismatches is a failure
(exit status 1). Prints the markdown; with ``$OUT`` set also writes ``$OUT/conformance_<device>.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def machine(device: str) -> str:
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    name = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        lines = info.read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        name = names[0] if names else name
    return f"{name} ({os.cpu_count()} cores), torch {torch.__version__}"


def table(tallies: list, device: str, cap: int | None, seconds: float) -> str:
    from tests.conformance.known import known

    lines = [f"## Conformance on {device}", "",
             f"`PYTHONPATH=src python benchmarks/conformance_report.py --device {device}"
             f"{'' if cap is None else f' --cap {cap}'}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{machine(device)}; {seconds:.0f} s.", "",
             "| kernel | family | declared | valid | sampled | executed | passed | failed | refused here |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    tot = [0] * 7
    for t in tallies:
        refused = "; ".join(f"{n}: {r}" for r, n in sorted(t.refused.items(), key=lambda kv: -kv[1])) or "0"
        valid = "no builder yet" if t.valid is None else str(t.valid)
        row = [t.declared, t.valid or 0, t.sampled, t.executed, t.passed, len(t.failures), t.refused_count]
        tot = [a + b for a, b in zip(tot, row)]
        lines.append(f"| {t.kernel} | {t.family} | {t.declared} | {valid} | {t.sampled} | {t.executed} | {t.passed} "
                     f"| {len(t.failures)} | {refused if t.refused_count else 0} |")
    lines.append("| **total** | | " + " | ".join(f"**{v}**" for v in tot[:6]) + f" | **{tot[6]}** |")
    failures = [(t.kernel, label, detail) for t in tallies for label, detail in t.failures]
    if failures:
        lines += ["", "### Failures (declared combinations that raised or mismatched)", ""]
        groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for kernel, label, detail in failures:  # a known defect is one line however many combinations hit it
            why = known(kernel, label, detail)
            key = (kernel, f"known defect: {why}" if why else detail[:200])
            groups.setdefault(key, []).append((label, detail))
        for (kernel, what), hits in groups.items():
            more = f" and {len(hits) - 3} more" if len(hits) > 3 else ""
            shown = ", ".join(f"`{label}`" for label, _ in hits[:3]) + more
            example = f" (e.g. {hits[0][1][:160]})" if what.startswith("known defect") else ""
            lines.append(f"- {kernel} ({len(hits)}): {what}{example} — {shown}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--cap", type=int, default=None,
                    help="combinations per kernel (default: every valid one on cpu, a covering sample of 12 on cuda, "
                         "where each new specialization compiles; 0: every valid one)")
    ap.add_argument("--kernel", action="append", default=[], help="only these kernel classes (repeatable)")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]  # tests.conformance and qlinear from this checkout
    if args.cap is None:
        args.cap = 12 if args.device == "cuda" else 0
    args.cap = args.cap or None

    import torch
    from tests.conformance.run import kernels_for, tally
    from tests.conformance.space import declares_device, implemented_kernels

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    out = os.environ.get("OUT")
    start = time.perf_counter()
    tallies = []
    for kernel in kernels_for(args.device):
        if args.kernel and kernel.__name__ not in args.kernel:
            continue
        t = tally(kernel, args.device, args.cap)
        print(t.line(), file=sys.stderr, flush=True)
        tallies.append(t)
        if out:  # the table so far, so that a run stopped by a time limit still leaves its counts
            Path(out, f"conformance_{args.device}.md").write_text(table(tallies, args.device, args.cap,
                                                                        time.perf_counter() - start))
    text = table(tallies, args.device, args.cap, time.perf_counter() - start)
    others = [k.__name__ for k in implemented_kernels() if not declares_device(k, args.device)]
    if others and not args.kernel:
        text += f"\nNot run here (they do not declare {args.device}): {', '.join(others)}.\n"
    print(text)
    if out:
        Path(out, f"conformance_{args.device}.md").write_text(text)
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
