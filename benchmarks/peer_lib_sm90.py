"""Thin vLLM's op library to what an sm_90 GPU loads, so it fits one device call's carry beside the repository.

    pip download --no-deps vllm==0.33.0 -d /tmp/vllm && cd /tmp/vllm && unzip -o vllm-*.whl 'vllm/_C_stable*'
    python3 benchmarks/peer_lib_sm90.py /tmp/vllm/vllm/_C_stable_libtorch.abi3.so   # -> .peers/<name>.xz

The library is 92.6 MB, 62 MB of it the ``.nv_fatbin`` section: one fat binary per translation unit, each holding
cubins and PTX for sm_75 .. sm_120. Compressed whole it is 63.7 MB, which with the tracked tree exceeds the
64 MiB a call carries. The CUDA runtime reads every entry's header but only the payload of the image it picks
for the device, so this zeroes, in place (no offset moves), the payloads an H100/H200 never picks: every entry
for an architecture above 90, and every non-90 entry of a fat binary that has a 90 one. Zeroes compress to
nothing: about 29 MB after xz. Symbols are stripped first (``strip --strip-unneeded``).
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
TARGET_ARCH = 90


def section(path: Path, name: str) -> tuple[int, int]:
    """File offset and size of an ELF section (``readelf -SW``)."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if f" {name} " in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    raise ValueError(f"{path}: no {name} section")


def entries(data: bytearray, start: int, end: int) -> list[list[tuple[int, int, int]]]:
    """Per fat binary in ``data[start:end]``: (architecture, payload offset, payload size) of each entry.

    Layout: a 16-byte header (magic, version, header size, size of what follows), then entries, each a header
    (kind u16, u16, header size u32, payload size u64, ..., architecture u32 at byte 28) and its payload."""
    found, pos = [], start
    while pos + 16 <= end:
        magic, _, head, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # alignment padding between fat binaries
            continue
        one, e, stop = [], pos + head, pos + head + size
        while e < stop:
            _, _, ehead, payload = struct.unpack_from("<HHIQ", data, e)
            one.append((struct.unpack_from("<I", data, e + 28)[0], e + ehead, payload))
            e += ehead + payload
        found.append(one)
        pos = stop
    return found


def thin(data: bytearray, start: int, end: int) -> int:
    """Zero the payloads an sm_90 device never loads; returns the bytes zeroed."""
    zeroed = 0
    for fatbin in entries(data, start, end):
        has_target = any(arch == TARGET_ARCH for arch, _, _ in fatbin)
        for arch, at, size in fatbin:
            if arch > TARGET_ARCH or (has_target and arch != TARGET_ARCH):
                data[at:at + size] = bytes(size)
                zeroed += size
    return zeroed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("library", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / ".peers")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stripped = Path(tmp) / args.library.name
        shutil.copy(args.library, stripped)
        subprocess.run(["strip", "--strip-unneeded", str(stripped)], check=True)
        off, size = section(stripped, ".nv_fatbin")
        data = bytearray(stripped.read_bytes())
        zeroed = thin(data, off, off + size)
        args.out.mkdir(parents=True, exist_ok=True)
        target = args.out / (args.library.name + ".xz")
        with lzma.open(target, "wb", preset=9) as dst:
            dst.write(data)
    print(f"zeroed {zeroed / 1e6:.1f} MB of {size / 1e6:.1f} MB fat binaries; wrote {target} "
          f"({target.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
