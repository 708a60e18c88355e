"""Fuzz the GGUF reader, ``QuantizeConfig.from_hf_config`` and ``CompressedTensorsConfig.from_hf_config``.

GGUF seeds are files written by gguf-py's ``GGUFWriter`` (``corpus/gguf``); an input is read, and every tensor it
lists is decoded. Config seeds are the producers' own config files from ``corpus/checkpoint`` (GPTQModel, AutoAWQ,
llm-compressor, transformers), mutated as JSON (types, missing keys, absurd numbers) and as bytes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import CORPUS, report_and_check
from .harness import run
from .mutate import mutate_bytes, mutate_json


def read_gguf_everything(path: Path) -> None:
    from qlinear.gguf_file import read_gguf

    f = read_gguf(path)
    for t in f:
        t.dequantize()
    f.layers()


def test_fuzz_gguf_reader(fuzz_inputs: int, scratch: Path) -> None:
    pytest.importorskip("gguf", reason="pip install gguf==0.19.0 (requirements/nodeps-gguf.txt)")
    rng = random.Random(1)
    seeds = [p.read_bytes() for p in sorted((CORPUS / "gguf").glob("*.gguf"))]
    target = scratch / "x.gguf"
    for seed in seeds:  # warm the imports outside the bounds
        target.write_bytes(seed)
        read_gguf_everything(target)

    def inputs() -> Iterator[tuple[Path, int]]:
        for seed in seeds:
            target.write_bytes(seed)
            yield target, len(seed)
        for _ in range(fuzz_inputs):
            data = mutate_bytes(rng.choice(seeds), rng)
            target.write_bytes(data)
            yield target, len(data)

    report = run("GGUF reader (read_gguf + every tensor decoded)", inputs(), read_gguf_everything)
    report_and_check(report)
    assert report.accepted >= len(seeds) and report.refused > fuzz_inputs // 4


def config_seeds() -> list[dict]:
    seeds = []
    for path in sorted((CORPUS / "checkpoint").rglob("*.json")):
        data = json.loads(path.read_text())
        seeds.append(data)
    return seeds


def read_config(data: object) -> None:
    from qlinear.ct_config import CompressedTensorsConfig
    from qlinear.spec import QuantizeConfig

    raw = data.get("quantization_config", data) if isinstance(data, dict) else data
    if isinstance(raw, dict) and raw.get("quant_method") == "compressed-tensors":
        CompressedTensorsConfig.from_hf_config(raw, "config.json")
    else:
        QuantizeConfig.from_hf_config(data)


def test_fuzz_configs(fuzz_inputs: int, scratch: Path) -> None:
    rng = random.Random(2)
    seeds = config_seeds()
    target = scratch / "config.json"

    def inputs() -> Iterator[tuple[object, int]]:
        for seed in seeds:
            yield seed, len(json.dumps(seed))
        for i in range(fuzz_inputs):
            seed = rng.choice(seeds)
            if i % 5:  # as a parsed object
                data = mutate_json(seed, rng)
                yield data, len(json.dumps(data))
            else:  # as a file whose bytes are damaged
                raw = mutate_bytes(json.dumps(seed).encode(), rng)
                target.write_bytes(raw)
                yield target, len(raw)

    report = run("QuantizeConfig / CompressedTensorsConfig.from_hf_config", inputs(), read_config)
    report_and_check(report)
    assert report.accepted >= len(seeds)
