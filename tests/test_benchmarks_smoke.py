"""Smoke tests for the benchmark scripts: tiny shapes, a couple of repetitions, the report's shape only."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_cpu_linear_quick_table() -> None:
    threads = torch.get_num_threads()
    try:
        text = load("cpu_linear").main(["--quick", "--shapes", "256x128", "--ms", "1,3", "--reps", "2"])
    finally:
        torch.set_num_threads(threads)
    for needle in ("command: python benchmarks/cpu_linear.py --quick", "| dense bf16 |", "| TorchLinear |",
                   "| TorchAtenLinear |", "| TorchInt8Linear (8-bit) |", "| AUTO = ", "Targets:"):
        assert needle in text, needle


def test_cpu_linear_crossover() -> None:
    threads = torch.get_num_threads()
    try:
        text = load("cpu_linear").main(["--crossover", "--shapes", "256x128", "--ms", "1,40", "--reps", "2"])
    finally:
        torch.set_num_threads(threads)
    assert "| 256x128 | 40 |" in text and "INT8PACK_MAX_M = " in text
    assert "INT4PACK_MAX_M = " in text or "INT4PACK_MAX_M_NATIVE = " in text


def test_hbm_read_kernel_reads_every_word_once() -> None:
    """The roofline's read probe (``benchmarks/hbm_read.py``), interpreted: its per-program sums add up to the
    sum of all words (mod 2^32), for a size that is not a multiple of a program's share or block."""
    import os
    import subprocess
    import sys

    code = ("import sys, torch; sys.path.insert(0, 'benchmarks'); from hbm_read import flat_read; "
            "w = torch.randint(-2**30, 2**30, (3 * 2048 * 5 + 44,), dtype=torch.int32, generator=torch.Generator()"
            ".manual_seed(0)); o = flat_read(w, torch.empty(3, dtype=torch.int32), 2048, 4); "
            "want = sum(w.tolist()) % 2**32; got = sum(o.tolist()) % 2**32; "
            "assert got == want, (got, want); print('ok')")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=BENCHMARKS.parent, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_cpu_formats_table() -> None:
    threads = torch.get_num_threads()
    try:
        text = load("cpu_formats").main(["--shapes", "512x256", "--ms", "1,3", "--reps", "1"])
    finally:
        torch.set_num_threads(threads)
    for needle in ("| 512x256 | dense bf16 | F.linear |", "| MlxTorchLinear |", "| VPTQLinear |",
                   "| ExllamaV3TorchLinear |", "| Exl2TorchLinear |", "| Exl2CpuLinear |", "| ParoLinear |",
                   "| MlxCpuLinear |"):
        assert needle in text, needle


def test_e2e_decoder_small_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """The end-to-end decoder's model code on a 2-layer toy: every variant's layers match float64 of their own
    weights (exit status 0) and the table has a row per variant."""
    rc = load("e2e_decoder").main(["--small", "--device", "cpu", "--variants", "bf16,gptq4,q4_k", "--reps", "2",
                                   "--ctx", "16", "--prefill", "32", "--batches", "1,2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for row in ("| bf16 nn.Linear | ", "| GPTQ 4-bit g128 (AUTO) | ", "| GGUF Q4_K (AUTO) | "):
        assert row in out, out


def test_cpu_resident_counts_the_runtime_not_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    text = load("cpu_resident").main(["--shape", "1024x256"])
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| ") and "MiB" not in line]
    assert [r[1].strip() for r in rows] == ["GPTQ 4-bit g128", "GPTQ 4-bit g32", "AWQ GEMM 4-bit g128",
                                            "EXL2 ~3.9-bit", "MLX 4-bit g64"]
    for r in rows:
        assert r[8].strip() == "True"  # the words are not kept beside the runtime
        assert float(r[6]) < 2 * float(r[4])  # resident bits a weight under twice the file's


def test_cpu_decode_costs_table() -> None:
    threads = torch.get_num_threads()
    try:
        text = load("cpu_decode_costs").main(["--shape", "1024x256", "--ms", "4", "--reps", "1"])
    finally:
        torch.set_num_threads(threads)
    assert "| g128 | 4 |" in text and "| g32 | 4 |" in text and "| MLX 8-bit g64 |" in text
    rows = [r.split("|") for r in text.splitlines() if r.startswith("| 1024x256 |")]
    assert not rows or float(rows[0][-2]) < 1e-2  # the prototype computes the same product (bf16 rounding)


def test_producer_kernels_build_trims_exllamav3_gemv_instances(tmp_path: Path) -> None:
    """``gpu_producer_kernels.exl3_sources`` on the installed exllamav3's extension sources: the GEMV's instance
    list becomes exactly the forms the benchmark times (one-row and few-row modes, both grid configurations), so a
    changed exllamav3 fails here rather than in a device session."""
    spec = importlib.util.find_spec("exllamav3")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("exllamav3 is not installed (pip install --no-deps exllamav3; requirements/nodeps-*.txt)")
    src = Path(spec.submodule_search_locations[0]) / "exllamav3_ext"
    g = load("gpu_producer_kernels")
    files = g.exl3_sources(src, tmp_path, g.EXL3_FORMS)
    assert all(f.is_file() for f in files)
    text = files[0].read_text()
    import re

    sels = re.findall(r"^\s*SEL\((\d), (\d), false, (\d), (\d), false\)$", text, re.M)
    want = {(str(b), str(g.CB_INDEX[cb]), str(mm), str(cfg)) for b, cb in g.EXL3_FORMS for mm in (0, 1)
            for cfg in (0, 1)}
    assert set(sels) == want and len(sels) == len(want)
    assert not re.search(r"^\s*SEL_GRID\(\d", text, re.M)
    assert (src / "quant" / "exl3_gemv.cu").read_text() != text  # the installed sources are untouched
