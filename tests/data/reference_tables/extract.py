"""Regenerate the reference's three declaration tables as TSV files next to this script.

Usage: python tests/data/reference_tables/extract.py PATH/TO/kernel-backends-reference.txt

The reference page is plain text whose tables are tab-separated lines under a header line; a table ends at the
first line with a different number of columns (usually the blank line after it). Cells are written verbatim.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: output file -> the first cells of the table's header line on the reference page
TABLES: dict[str, tuple[str, ...]] = {
    "backend_classes.tsv": ("BACKEND", "Class and qlinear source"),
    "contracts.tsv": ("Class", "Format: AUTO priority"),
    "operands.tsv": ("Class", "Activation dtypes"),
}


def extract(lines: list[str], head: tuple[str, ...]) -> list[list[str]]:
    """The rows (header first) of the table whose header line starts with ``head``."""
    for i, line in enumerate(lines):
        cells = line.split("\t")
        if tuple(cells[: len(head)]) == head:
            rows = [cells]
            for nxt in lines[i + 1:]:
                row = nxt.split("\t")
                if len(row) != len(cells):
                    break
                rows.append([c.strip() for c in row])
            return rows
    raise SystemExit(f"no table with header {head!r} in the reference page")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    lines = Path(argv[1]).read_text(encoding="utf-8").splitlines()
    out_dir = Path(__file__).resolve().parent
    for name, head in TABLES.items():
        rows = extract(lines, head)
        (out_dir / name).write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
        print(f"{name}: {len(rows) - 1} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
