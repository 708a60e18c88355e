"""Faults in the middle of writing a checkpoint: the source is never touched, nothing incomplete ever sits at the
destination's name, and a rerun succeeds.

Two kinds of fault: ``qlinear convert`` killed with SIGKILL at spread-out moments of its run (a child process, so
the kill can land anywhere: imports, reading, packing, writing, renaming), and writers that fail part way
(``ENOSPC`` from the n-th safetensors file, from a config write, from the final rename) in process.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qlinear.checkpoint import load_checkpoint
from qlinear.checkpoint.save import convert_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "gptq_4bit_g32"


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def big_source(tmp_path: Path) -> Path:
    """The GPTQModel fixture with its tensors repeated under 24 more layer names: a source large enough that the
    write takes a visible share of the run."""
    from qlinear.checkpoint.safetensors_io import read_header, read_tensor, write_file

    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src)
    tensors = {k: read_tensor(v) for k, v in read_header(src / "model.safetensors")[0].items()}
    more = dict(tensors)
    for i in range(1, 25):
        more.update({k.replace("layers.0.", f"layers.{i}."): v for k, v in tensors.items() if "layers.0." in k})
    write_file(src / "model.safetensors", more)
    config = (src / "config.json").read_text().replace('"num_hidden_layers": 1', '"num_hidden_layers": 25')
    (src / "config.json").write_text(config)
    return src


def same_layers(a: Path, b: Path) -> None:
    la, lb = load_checkpoint(a), load_checkpoint(b)
    assert la.keys() == lb.keys()
    for name in la:
        for (ka, ta), (kb, tb) in zip(sorted(la[name].state_dict().items()), sorted(lb[name].state_dict().items()),
                                      strict=True):
            assert ka == kb and torch.equal(ta, tb), f"{name}.{ka}"


@pytest.mark.slow
def test_convert_killed_at_any_moment(tmp_path: Path) -> None:
    src = big_source(tmp_path)
    before = digest(src)
    reference = tmp_path / "reference"
    cmd = [sys.executable, "-m", "qlinear.cli", "convert", str(src), "--format", "gptq_v2", "--max-shard-size", "64KB"]
    t0 = time.perf_counter()
    subprocess.run([*cmd, str(reference)], check=True, capture_output=True)
    full = time.perf_counter() - t0
    killed_mid_run = 0
    for trial in range(8):
        dst = tmp_path / f"dst{trial}"
        proc = subprocess.Popen([*cmd, str(dst)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(full * (0.35 + 0.65 * trial / 8))  # from imports to the final rename
        proc.send_signal(signal.SIGKILL)
        killed_mid_run += proc.wait() == -signal.SIGKILL
        assert digest(src) == before, "the source changed"
        if dst.exists():  # it finished before the kill: then it is whole
            same_layers(dst, reference)
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(f".dst{trial}.")]
        assert all(p.endswith(".partial") for p in leftovers), leftovers
        subprocess.run([*cmd, "--overwrite", str(dst)], check=True, capture_output=True)  # the rerun succeeds
        same_layers(dst, reference)
    assert killed_mid_run >= 4  # most kills landed inside the run, not after it


class Disk:
    """Counts writes and fails the n-th with ENOSPC, as a full disk would."""

    def __init__(self, fail_at: int) -> None:
        self.calls, self.fail_at = 0, fail_at

    def hit(self) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("fail_at", [1, 2, 3, 5, 8])
def test_full_disk_while_writing_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    import qlinear.checkpoint.save as save

    src = big_source(tmp_path)
    reference = convert_checkpoint(src, tmp_path / "reference", "gptq_v2", max_shard_size="64KB")
    before = digest(src)
    disk = Disk(fail_at)
    real = save.write_file

    def failing_write(path, tensors, metadata=None):
        disk.hit()
        return real(path, tensors, metadata)

    monkeypatch.setattr(save, "write_file", failing_write)
    dst = tmp_path / "dst"
    with pytest.raises(OSError, match="No space left"):
        convert_checkpoint(src, dst, "gptq_v2", max_shard_size="64KB")
    assert not dst.exists() and digest(src) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dst.")], "the partial directory was left"
    monkeypatch.setattr(save, "write_file", real)
    convert_checkpoint(src, dst, "gptq_v2", max_shard_size="64KB")
    same_layers(dst, reference)


@pytest.mark.parametrize("where", ["config", "rename"])
def test_full_disk_at_config_or_rename_keeps_an_existing_destination(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     where: str) -> None:
    """With --overwrite, a failure before or during the swap leaves the previous destination as it was."""
    import qlinear.checkpoint.save as save

    src = big_source(tmp_path)
    dst = tmp_path / "dst"
    convert_checkpoint(src, dst, "gptq")
    previous = digest(dst)
    if where == "config":
        real_write_text = Path.write_text

        def failing_write_text(self: Path, *args: object, **kwargs: object) -> int:
            if self.name.endswith(".json") and ".partial" in str(self.parent):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "write_text", failing_write_text)
    else:
        real_replace = os.replace

        def failing_replace(a: object, b: object) -> None:
            if ".partial" in str(a):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_replace(a, b)

        monkeypatch.setattr(save.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space left"):
        convert_checkpoint(src, dst, "gptq_v2", overwrite=True)
    monkeypatch.undo()
    assert digest(dst) == previous
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".dst.")]
