"""Merge sweep results (``--json`` of the ``*_sweep.py`` scripts) into the shipped tuned table.

    python3 benchmarks/merge_table.py run1.json run2.json ... [--table src/qlinear/kernels/triton/tuned_h200.json]

A table may time several variants for one key (M bucket, N, K, bits, group) only from one run: times from two
runs differ by several percent, more than some margins they decide. So for every key a JSON times, the times
of all variants at that key are dropped first, then the JSON's are written: the swept variant's entry whole,
and the shipped variant's time beside it. Fields the JSON does not carry (gemv_tc's flags) stay as the table
has them; a field that changes is printed. Later files win.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: the fields a sweep's JSON states (a register cap and a tail split only when set): the rest are variant flags
TILE = ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages", "max_registers", "tail_split")
TABLE = Path(__file__).resolve().parents[1] / "src/qlinear/kernels/triton/tuned_h200.json"


def merge(table: dict, run: dict) -> list[str]:
    """Fold one sweep JSON into ``table`` in place; returns the keys written."""
    written = []
    for device, found in run.get("devices", {}).items():
        configs = table.setdefault("devices", {}).setdefault(device, {}).setdefault("configs", {})
        rests = {key.split(":", 2)[2] + ":" + key.split(":", 2)[1] for key in found.get("configs", {})}
        for key, entry in configs.items():
            _, bucket, rest = key.split(":", 2)
            if rest + ":" + bucket in rests:
                entry.pop("us", None)
        for key, entry in found.get("configs", {}).items():
            old = configs.get(key, {})
            changed = [f for f, v in entry.items() if f != "us" and f in old and old[f] != v]
            if changed:
                print(f"  {key}: {', '.join(f'{f} {old[f]} -> {entry[f]}' for f in changed)}")
            flags = {f: v for f, v in old.items() if f not in TILE and f != "us"}  # gemv_tc's, which sweeps omit
            configs[key] = flags | entry
            written.append(key)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="sweep JSON files, oldest first")
    ap.add_argument("--table", default=str(TABLE))
    args = ap.parse_args()
    table = json.loads(Path(args.table).read_text())
    for run in args.runs:
        keys = merge(table, json.loads(Path(run).read_text()))
        print(f"{run}: {len(keys)} entries")
    Path(args.table).write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
