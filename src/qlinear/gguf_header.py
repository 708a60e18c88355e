"""Walk a GGUF header with every count and length checked against the bytes left, before any parser trusts it.

gguf-py's reader takes the header's counts at their word: an array that claims 2^40 elements near the end of the
file makes it loop on empty reads without end, growing a list each turn. llama.cpp's loader checks each length
against the file first; this walk does the same (magic, version, tensor and key counts, each key, string, array
and tensor record), refusing nested arrays as llama.cpp does, in time linear in the header's size and with no
allocation sized by a field. Only a header that passes is handed to gguf-py.
"""

from __future__ import annotations

import struct
from pathlib import Path

#: GGUF value type id -> (name, fixed size in bytes, or 0 for strings and arrays).
VALUE_TYPES: dict[int, tuple[str, int]] = {
    0: ("uint8", 1), 1: ("int8", 1), 2: ("uint16", 2), 3: ("int16", 2), 4: ("uint32", 4), 5: ("int32", 4),
    6: ("float32", 4), 7: ("bool", 1), 8: ("string", 0), 9: ("array", 0), 10: ("uint64", 8), 11: ("int64", 8),
    12: ("float64", 8),
}
STRING, ARRAY = 8, 9
VERSIONS = (2, 3)
MAX_DIMS = 4
#: Smallest possible record sizes, used to bound counts before walking them.
MIN_KV = 8 + 4 + 1  # empty key, type, a one-byte value
MIN_TENSOR_INFO = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset


class GGUFFormatError(ValueError):
    """A GGUF file qlinear cannot read; the message names the file, the tensor, the expected and the found."""


class _Cursor:
    """Reads little-endian fields from ``data`` and refuses any read past its end, naming the field."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def fail(self, what: str) -> GGUFFormatError:
        return GGUFFormatError(f"{self.path}: corrupt GGUF header at byte {self.pos}: {what}")

    def need(self, n: int, what: str) -> None:
        if n > len(self.data) - self.pos:
            raise self.fail(f"{what} needs {n} bytes but {len(self.data) - self.pos} are left (truncated file, or "
                            "a length/count field is wrong)")

    def unpack(self, fmt: str, what: str) -> int:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"the length of {what}")
        self.need(n, f"{what} ({n} bytes)")
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def value(self, type_id: int, what: str, in_array: bool = False) -> None:
        if type_id not in VALUE_TYPES:
            raise self.fail(f"{what} has value type {type_id}; GGUF defines types 0..12")
        name, size = VALUE_TYPES[type_id]
        if type_id == STRING:
            self.string(what)
        elif type_id == ARRAY:
            if in_array:
                raise self.fail(f"{what} is an array of arrays, which GGUF readers (llama.cpp) do not accept")
            elem = self.unpack("<I", f"the element type of {what}")
            count = self.unpack("<Q", f"the element count of {what}")
            if elem not in VALUE_TYPES:
                raise self.fail(f"{what} has element type {elem}; GGUF defines types 0..12")
            smallest = VALUE_TYPES[elem][1] or 8  # a string element is at least its 8-byte length
            if count * smallest > len(self.data) - self.pos:
                raise self.fail(f"{what} claims {count} {VALUE_TYPES[elem][0]} elements, at least "
                                f"{count * smallest} bytes, but {len(self.data) - self.pos} are left")
            if VALUE_TYPES[elem][1]:
                self.pos += count * VALUE_TYPES[elem][1]
            else:
                for i in range(count):
                    self.value(elem, f"{what}[{i}]", in_array=True)
        else:
            self.need(size, f"{what} ({name})")
            self.pos += size


def check_header(path: str | Path) -> None:
    """Raise ``GGUFFormatError`` naming the field if ``path``'s GGUF header is malformed or overruns the file."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(24)
        c = _Cursor(head, path)
        magic = head[:4]
        if magic != b"GGUF":
            raise GGUFFormatError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        c.pos = 4
        version = c.unpack("<I", "the version")
        if version not in VERSIONS:
            if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
                raise GGUFFormatError(f"{path}: big-endian GGUF files are not supported")
            raise GGUFFormatError(f"{path}: GGUF version {version}; qlinear reads versions 2 and 3")
        n_tensors = c.unpack("<Q", "the tensor count")
        n_kv = c.unpack("<Q", "the key/value count")
        left = size - 24
        if n_kv * MIN_KV > left or n_tensors * MIN_TENSOR_INFO > left:
            raise GGUFFormatError(f"{path}: corrupt GGUF header: {n_kv} keys and {n_tensors} tensors cannot fit in "
                                  f"the {left} bytes after the counts")
        f.seek(0)
        data = f.read()
    c = _Cursor(data, path)
    c.pos = 24
    for i in range(n_kv):
        key = c.string(f"key #{i}")
        c.value(c.unpack("<I", f"the type of key {key!r}"), f"key {key!r}")
    for i in range(n_tensors):
        name = c.string(f"the name of tensor #{i}")
        n_dims = c.unpack("<I", f"the dimension count of tensor {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.fail(f"tensor {name!r} has {n_dims} dimensions (expected 1 to {MAX_DIMS})")
        c.need(8 * n_dims + 12, f"the dimensions, type and offset of tensor {name!r}")
        c.pos += 8 * n_dims + 12
