"""Fuzz the safetensors reader and ``load_checkpoint`` with mutated producer-made files.

Every input must be accepted or refused with a qlinear error naming the file, tensor or field, within the time and
memory bounds of ``harness.run``. Seeds: ``corpus/checkpoint/*`` (one module of each producer fixture). Mutations
land in the header (length field, JSON: names, dtypes, shapes, offsets) seven times in ten, anywhere otherwise;
``load_checkpoint`` inputs mutate the safetensors file or the config JSON.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from .conftest import CORPUS, report_and_check
from .harness import run
from .mutate import mutate_bytes, mutate_json

SEEDS = sorted(p for p in (CORPUS / "checkpoint").iterdir() if p.is_dir())


def mutate_safetensors(data: bytes, rng: random.Random) -> bytes:
    """Mostly the 8-byte length and the JSON header; sometimes the whole file."""
    n = int.from_bytes(data[:8], "little")
    if rng.random() < 0.7 and 8 + n <= len(data):
        return mutate_bytes(data[:8 + n], rng) + data[8 + n:]
    return mutate_bytes(data, rng)


def read_everything(path: Path) -> None:
    from qlinear.checkpoint.safetensors_io import read_header, read_tensor

    tensors, _ = read_header(path)
    for info in tensors.values():
        if info.dtype is not None:
            read_tensor(info)


def test_fuzz_safetensors_reader(fuzz_inputs: int, scratch: Path) -> None:
    rng = random.Random(20261205)
    seeds = [(s / "model.safetensors").read_bytes() for s in SEEDS]
    target = scratch / "x.safetensors"

    def inputs() -> Iterator[tuple[Path, int]]:
        for seed in seeds:  # the corpus itself, unmutated
            target.write_bytes(seed)
            yield target, len(seed)
        for _ in range(fuzz_inputs):
            data = mutate_safetensors(rng.choice(seeds), rng)
            target.write_bytes(data)
            yield target, len(data)

    report = run("safetensors read_header + read_tensor", inputs(), read_everything)
    report_and_check(report)
    assert report.refused > fuzz_inputs // 4  # the mutations reach the checks (not all benign)


def test_fuzz_load_checkpoint(fuzz_inputs: int, scratch: Path) -> None:
    from qlinear.checkpoint.load import load_checkpoint

    torch.set_num_threads(1)
    rng = random.Random(5)
    dirs = []
    for seed in SEEDS:
        d = scratch / seed.name
        shutil.copytree(seed, d)
        dirs.append(d)
    originals = {p: p.read_bytes() for d in dirs for p in d.iterdir()}
    for d in dirs:  # first loads import kernel families; the bounds are for reading, not importing
        load_checkpoint(d)

    def inputs() -> Iterator[tuple[Path, int]]:
        for d in dirs:
            yield d, sum(p.stat().st_size for p in d.iterdir())
        for _ in range(fuzz_inputs):
            d = rng.choice(dirs)
            for p in d.iterdir():
                p.write_bytes(originals[p])
            victim = rng.choice(sorted(d.iterdir()))
            data = originals[victim]
            if victim.suffix == ".json" and rng.random() < 0.8:
                obj = json.loads(data)
                new = json.dumps(mutate_json(obj, rng)).encode()
            elif victim.suffix == ".json":
                new = mutate_bytes(data, rng)
            else:
                new = mutate_safetensors(data, rng)
            victim.write_bytes(new)
            yield d, sum(len(originals[p]) for p in d.iterdir()) + len(new)

    report = run("load_checkpoint", inputs(), load_checkpoint)
    report_and_check(report)
    assert report.accepted >= len(dirs)  # the unmutated corpus loads
