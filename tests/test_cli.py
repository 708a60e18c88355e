"""`qlinear backends` and `qlinear explain`: every reference backend listed, readable and JSON output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from qlinear.cli import main
from qlinear.enums import BACKEND

TABLE = Path(__file__).parent / "data" / "reference_tables" / "backend_classes.tsv"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_backends_lists_every_reference_class_and_backend(capsys) -> None:
    code, out, _ = run(capsys, "backends", "--json")
    assert code == 0
    rows = json.loads(out)["kernels"]
    names = {r["class"] for r in rows}
    reference = {line.split("\t")[1].split()[0] for line in TABLE.read_text().splitlines()[1:] if line.strip()}
    assert reference <= names, reference - names
    assert {r["backend"] for r in rows} == {b.value for b in BACKEND if b is not BACKEND.AUTO}
    torch_row = next(r for r in rows if r["class"] == "TorchLinear")
    assert torch_row["here"] == {"ok": True, "reasons": []}
    swordfish = next(r for r in rows if r["class"] == "SwordfishLinear")
    assert "not implemented yet" in swordfish["here"]["reasons"]
    marlin = next(r for r in rows if r["class"] == "MarlinLinear")
    assert marlin["here"]["reasons"] == ["device cpu not supported (declares cuda)"]


def test_backends_table_is_readable(capsys) -> None:
    code, out, _ = run(capsys, "backends")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("target: cpu")
    assert any(line.startswith("TorchLinear ") and line.rstrip().endswith("yes") for line in lines)
    assert any(line.startswith("TorchInt8AwqLinear") and "retired" in line for line in lines)


def test_explain_text_and_exit_code(capsys) -> None:
    code, out, _ = run(capsys, "explain", "--format", "gptq", "--bits", "4", "--group-size", "128", "--in", "4096",
                       "--out", "11008", "--device", "cpu", "--dtype", "bfloat16")
    assert code == 0
    assert out.startswith("gptq 4-bit g128 sym pack=int32 in=4096 out=11008 dtype=bfloat16 on cpu")
    chosen = next(line for line in out.splitlines() if line.startswith("chosen: "))
    assert chosen != "chosen: none (no kernel can run this layer here)"
    assert any(line.startswith("  * ") and line.rstrip().endswith("ok") for line in out.splitlines())


def test_explain_for_a_hypothetical_gpu_and_no_fit(capsys) -> None:
    code, out, _ = run(capsys, "explain", "--in", "4096", "--out", "4096", "--gpu-arch", "9.0",
                       "--backend", "gptq_machete", "--json")
    data = json.loads(out)
    assert code == 1 and data["chosen"] is None
    assert data["candidates"][0]["class"] == "MacheteLinear"
    assert any("pip install vllm==0.33.0" in r for r in data["candidates"][0]["reasons"])


def test_cli_errors_are_one_line(capsys) -> None:
    code, _, err = run(capsys, "explain", "--in", "4096", "--out", "4096", "--format", "gptq9")
    assert code == 2 and err.startswith("qlinear: error: unknown FORMAT 'gptq9'; expected one of:")
    code, _, err = run(capsys, "explain", "--in", "4096", "--out", "4096", "--bits", "5")
    assert code == 2 and "gptq_p" in err


def test_console_script_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "qlinear.cli", "explain", "--in", "64", "--out", "64"],
                         capture_output=True, text=True, check=True).stdout
    assert "chosen: " in out and "TorchLinear" in out


def test_docs_backends_table_is_current(capsys) -> None:
    code, out, _ = run(capsys, "backends", "--markdown")
    doc = Path(__file__).parents[1] / "docs" / "backends.md"
    assert code == 0
    assert out.strip() in doc.read_text(), "docs/backends.md is stale: run `make docs`"
