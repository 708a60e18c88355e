"""Read and write safetensors files without executing anything and without the safetensors package.

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
data_offsets) and raw little-endian tensor bytes. Every field is checked against the file size
before a byte of data is read, so a truncated file or a bad length is reported as such, naming the
file and the tensor, instead of surfacing as an opaque error deep inside a loader.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or written as asked (names the file, module and tensor)."""


#: safetensors dtype code -> torch dtype
DTYPES: Mapping[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
CODES: Mapping[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
#: The safetensors library's dtype order (its Rust ``Dtype`` enum). It lays tensors out widest-ranked first, then by
#: name; writing in the same order makes qlinear's files byte-identical to the library's for the same tensors.
RANK: Mapping[str, int] = {c: i for i, c in enumerate(
    ("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
     "I32", "U32", "F32", "C64", "F64", "I64", "U64"))}
MAX_HEADER = 100 << 20  # the safetensors reference refuses headers past 100 MB too


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, dtype (torch, or None for a dtype this reader does not know), shape."""

    file: Path
    name: str
    code: str
    shape: tuple[int, ...]
    begin: int  # absolute byte offset in the file
    end: int

    @property
    def dtype(self) -> torch.dtype | None:
        return DTYPES.get(self.code)

    def describe(self) -> str:
        return f"shape {list(self.shape)} dtype {self.dtype or self.code}"


def _itemsize(code: str) -> int | None:
    dtype = DTYPES.get(code)
    return None if dtype is None else torch.empty((), dtype=dtype).element_size()


def read_header(path: str | Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The tensors listed in a safetensors file (validated against the file size) and its metadata."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: corrupt safetensors file: {size} bytes, too short to hold the 8-byte "
                                  "header length (truncated file?)")
        n = int.from_bytes(head, "little")
        if n > size - 8 or n > MAX_HEADER:
            raise CheckpointError(f"{path}: corrupt safetensors header: the header length field says {n} bytes but "
                                  f"only {size - 8} bytes follow it (truncated file, or not a safetensors file)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: corrupt safetensors header: the {n}-byte header is not valid JSON "
                              f"({err}); bad header length or damaged file") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: expected a JSON object, "
                              f"got {type(header).__name__}")
    meta = header.pop("__metadata__", None) or {}
    data_len = size - 8 - n
    out: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        where = f"{path}: tensor {name!r}"
        try:
            code, shape, (b, e) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            b, e = int(b), int(e)
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{where}: corrupt safetensors header entry {entry!r} (expected dtype, shape and "
                                  "data_offsets [begin, end])") from None
        if min(shape, default=0) < 0 or not 0 <= b <= e:
            raise CheckpointError(f"{where}: corrupt safetensors header: shape {list(shape)}, offsets [{b}, {e}]")
        if e > data_len:
            raise CheckpointError(f"{where}: data_offsets [{b}, {e}] run past the end of the data ({data_len} bytes): "
                                  "truncated file")
        item = _itemsize(code)
        numel = 1
        for d in shape:
            numel *= d
        if item is not None and numel * item != e - b:
            raise CheckpointError(f"{where}: {code} shape {list(shape)} needs {numel * item} bytes but its "
                                  f"data_offsets [{b}, {e}] hold {e - b}")
        out[name] = TensorInfo(path, name, code, shape, 8 + n + b, 8 + n + e)
    return out, {str(k): str(v) for k, v in meta.items()}


def read_tensor(info: TensorInfo) -> torch.Tensor:
    """Load one tensor's bytes (a fresh, writable CPU tensor)."""
    if info.dtype is None:
        raise CheckpointError(f"{info.file}: tensor {info.name!r}: dtype {info.code} is not one qlinear reads")
    if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
        raise CheckpointError("safetensors data is little-endian; this machine is not")
    with open(info.file, "rb") as f:
        f.seek(info.begin)
        data = bytearray(f.read(info.end - info.begin))
    if len(data) != info.end - info.begin:
        raise CheckpointError(f"{info.file}: tensor {info.name!r}: file shrank while reading (truncated)")
    if not data:
        return torch.empty(info.shape, dtype=info.dtype)
    return torch.frombuffer(data, dtype=info.dtype).reshape(info.shape)


def write_file(path: str | Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> int:
    """Write ``tensors`` as one safetensors file (fsynced); returns the bytes of tensor data written."""
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs: list[bytes] = []
    offset = 0
    bad = [n for n, t in tensors.items() if t.dtype not in CODES]
    if bad:
        raise CheckpointError(f"{bad[0]}: dtype {tensors[bad[0]].dtype} has no safetensors code")
    for name in sorted(tensors, key=lambda n: (-RANK[CODES[tensors[n].dtype]], n)):
        t = tensors[name].detach().cpu().contiguous()
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)
        f.flush()
        os.fsync(f.fileno())
    return offset
