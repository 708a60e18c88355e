"""The ``weight.quant_state.bitsandbytes__{nf4,fp4}`` tensor of a 4-bit bitsandbytes module: a JSON object as bytes.

bitsandbytes (``QuantState.as_dict(packed=True)``) keeps the non-tensor parts of a 4-bit state there, as
``json.dumps`` of, in this order: ``quant_type``, ``blocksize``, ``dtype`` (the weight's dtype before
quantization, without ``torch.``), ``shape`` ([out_features, in_features]) and, with double quantization,
``nested_blocksize``, ``nested_dtype`` and ``nested_offset`` (a float32 value written as a Python float). The
bytes are a uint8 tensor ``[len]``. ``parse`` reads them with every field checked; ``serialize`` writes
the same bytes back (``parse`` refuses a blob that ``serialize`` would not reproduce, so a round trip is
byte for byte).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from ..bnb_weight import BLOCKSIZES, QUANT_TYPES, WEIGHT_DTYPES

PREFIX = "weight.quant_state.bitsandbytes__"
PLAIN_KEYS = ("quant_type", "blocksize", "dtype", "shape")
NESTED_KEYS = ("nested_blocksize", "nested_dtype", "nested_offset")


def blob_name(quant_type: str) -> str:
    """The checkpoint leaf holding the JSON blob of a ``quant_type`` module."""
    return PREFIX + quant_type


@dataclass(frozen=True)
class StateInfo:
    """The fields of one module's JSON blob."""

    quant_type: str
    blocksize: int
    dtype: torch.dtype
    shape: tuple[int, int]
    nested_blocksize: int | None = None  # None: no double quantization
    nested_offset: float | None = None

    @property
    def nested(self) -> bool:
        return self.nested_blocksize is not None

    def describe(self) -> str:
        dq = f", double-quantized absmax (nested blocks of {self.nested_blocksize})" if self.nested else ""
        return f"{self.quant_type} blocksize {self.blocksize}{dq}, weight {list(self.shape)} {_dtype_name(self.dtype)}"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def serialize(info: StateInfo) -> torch.Tensor:
    """The uint8 tensor bitsandbytes writes for ``info``."""
    fields: dict[str, object] = {"quant_type": info.quant_type, "blocksize": info.blocksize,
                                 "dtype": _dtype_name(info.dtype), "shape": list(info.shape)}
    if info.nested:
        fields.update(nested_blocksize=info.nested_blocksize, nested_dtype="float32", nested_offset=info.nested_offset)
    return torch.tensor(list(json.dumps(fields).encode("utf-8")), dtype=torch.uint8)


def _field(data: dict[str, object], key: str, name: str) -> object:
    if key not in data:
        raise ValueError(f"{name}: no {key!r} in the quant_state JSON (found {', '.join(data) or 'no keys'})")
    return data[key]


def _positive_int(data: dict[str, object], key: str, name: str) -> int:
    value = _field(data, key, name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}: {key} must be a positive integer, got {value!r}")
    return value


def parse(blob: torch.Tensor, name: str, quant_type: str | None = None) -> StateInfo:
    """Read a blob tensor (uint8 ``[len]``); ``name`` is its full checkpoint name, for the messages.

    ``quant_type``: the type its name says (``...bitsandbytes__nf4``); the JSON must agree."""
    if not isinstance(blob, torch.Tensor) or blob.dtype != torch.uint8 or blob.dim() != 1:
        found = f"{blob.dtype} shape {list(blob.shape)}" if isinstance(blob, torch.Tensor) else type(blob).__name__
        raise ValueError(f"{name}: expected a uint8 [len] tensor of JSON bytes, got {found}")
    raw = bytes(blob.cpu().tolist())
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{name}: not a JSON object ({err}); bytes begin {raw[:40]!r}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{name}: expected a JSON object, got {type(data).__name__}")
    nested = "nested_blocksize" in data or "nested_offset" in data or "nested_dtype" in data
    known = PLAIN_KEYS + (NESTED_KEYS if nested else ())
    unknown = [k for k in data if k not in known]
    if unknown:
        raise ValueError(f"{name}: unexpected key(s) {', '.join(map(repr, unknown))} in the quant_state JSON "
                         f"(bitsandbytes writes {', '.join(known)})")
    qt = _field(data, "quant_type", name)
    if qt not in QUANT_TYPES or (quant_type is not None and qt != quant_type):
        want = quant_type or " or ".join(QUANT_TYPES)
        raise ValueError(f"{name}: quant_type {qt!r} in the JSON; expected {want!r}")
    blocksize = _positive_int(data, "blocksize", name)
    if blocksize not in BLOCKSIZES:
        raise ValueError(f"{name}: blocksize {blocksize} is not one bitsandbytes uses "
                         f"({', '.join(map(str, BLOCKSIZES))})")
    dtype = getattr(torch, str(_field(data, "dtype", name)), None)
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"{name}: dtype {data['dtype']!r}; expected one of "
                         f"{', '.join(map(_dtype_name, WEIGHT_DTYPES))}")
    shape = _field(data, "shape", name)
    if not (isinstance(shape, list) and len(shape) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
        raise ValueError(f"{name}: shape must be [out_features, in_features] (2 positive integers), got {shape!r}")
    info = StateInfo(qt, blocksize, dtype, (shape[0], shape[1]))
    if nested:
        nbs = _positive_int(data, "nested_blocksize", name)
        if _field(data, "nested_dtype", name) != "float32":
            raise ValueError(f"{name}: nested_dtype {data['nested_dtype']!r}; bitsandbytes' nested absmax is float32")
        offset = _field(data, "nested_offset", name)
        if isinstance(offset, int) and not isinstance(offset, bool):
            offset = float(offset)
        if not isinstance(offset, float) or not math.isfinite(offset) or \
                float(torch.tensor(offset, dtype=torch.float32)) != offset:
            raise ValueError(f"{name}: nested_offset must be a finite float32 value, got {data['nested_offset']!r}")
        info = StateInfo(qt, blocksize, dtype, info.shape, nbs, offset)
    again = bytes(serialize(info).tolist())
    if again != raw:
        raise ValueError(f"{name}: the JSON is not in bitsandbytes' own serialization, so it could not be written "
                         f"back byte for byte: found {raw.decode('utf-8')!r}, expected {again.decode('utf-8')!r}")
    return info
