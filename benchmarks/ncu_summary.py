"""A Markdown table of an Nsight Compute text report of ``profile_cells.py``: one row per profiled kernel.

    python benchmarks/ncu_summary.py ncu_cells.txt > summary.md

``profile_cells.py`` prints ``<cell>: <layer class>`` after each cell's kernels ran, and ncu reports the kernels in
launch order, so each kernel belongs to the first cell line printed after its ``==PROF== Profiling`` line.
Columns are ncu's own metrics (SpeedOfLight, ComputeWorkloadAnalysis, WarpStateStats, Occupancy, LaunchStats).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

METRICS = {"Duration": "us", "DRAM Throughput": "DRAM %", "Compute (SM) Throughput": "SM %",
           "Issue Slots Busy": "issue %", "Achieved Occupancy": "occupancy %", "Registers Per Thread": "regs",
           "Warp Cycles Per Issued Instruction": "cycles/issue"}
KERNEL = re.compile(r"^  (\S.*?) \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\), Context")
METRIC = re.compile(r"^    (.+?)\s{2,}(\S+)?\s+([\d,.]+)\s*$")


def cells_of(lines: list[str]) -> list[str]:
    """The cell of each profiled launch, in order."""
    out, pending = [], 0
    for line in lines:
        if line.startswith("==PROF== Profiling"):
            pending += 1
        elif re.match(r"^[a-z0-9_]+:\d+x\d+:\d+: ", line):
            out += [line.split(": ")[0]] * pending
            pending = 0
    return out


def rows(text: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    cells, found = cells_of(lines), []
    for line in lines:
        k = KERNEL.match(line)
        if k:
            found.append({"kernel": k.group(1)[:60], "grid": k.group(2), "block": k.group(3)})
            continue
        m = METRIC.match(line)
        if m and found and m.group(1).strip() in METRICS:
            unit, value = m.group(2) or "", m.group(3)
            if m.group(1).strip() == "Duration" and unit == "ms":
                value = f"{float(value.replace(',', '')) * 1e3:.1f}"
            found[-1].setdefault(METRICS[m.group(1).strip()], value)
    for i, row in enumerate(found):
        row["cell"] = cells[i] if i < len(cells) else "?"
    return found


def table(found: list[dict[str, str]]) -> str:
    cols = ["cell", "kernel", "grid", "block", *METRICS.values()]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(r.get(c, "") for c in cols) + " |" for r in found]
    return "\n".join(out)


if __name__ == "__main__":
    print(table(rows(Path(sys.argv[1]).read_text())))
