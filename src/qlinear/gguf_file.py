"""Read GGUF files (through the ``gguf`` package: ``pip install 'qlinear[gguf]'``) into GGUF layers.

The header is parsed by ``gguf.GGUFReader``; the tensor table is checked here the way ggml's own loader checks
it (known type ids, whole blocks per row, tensors packed back to back at the file's alignment, data inside
the file), and every error names the tensor, what was expected and what was found. Tensor bytes stay
memory-mapped (copy-on-write numpy views) until a layer takes them; ``GGUFFile.linear`` builds a selected
kernel whose ``qweight`` can share the mapped bytes.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .gguf_header import GGUFFormatError, check_header
from .layouts import gguf as codecs

if TYPE_CHECKING:
    from .kernels.base import QuantLinear
    from .spec import Scheme

GGML_MAX_DIMS = 4
INSTALL = "pip install 'qlinear[gguf]' (gguf==0.19.0)"
__all__ = ["GGUFFile", "GGUFFormatError", "GGUFTensor", "read_gguf"]


def _gguf() -> Any:
    try:
        import gguf
    except ImportError as err:
        raise ImportError(f"reading GGUF files needs the gguf package: {INSTALL}") from err
    return gguf


def _header(path: Path) -> Any:
    """``gguf.GGUFReader`` for the key/value fields and the raw tensor table (views are built here instead)."""
    gguf = _gguf()
    check_header(path)  # gguf-py trusts the header's counts; a bad one can make it loop without end

    class Header(gguf.GGUFReader):
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            self.tensor_infos = fields

    try:
        return Header(path, "c")  # copy-on-write map: writable views for torch, the file is never modified
    except FileNotFoundError:
        raise
    except (ValueError, KeyError, IndexError, OverflowError, TypeError, OSError) as err:
        raise GGUFFormatError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from None


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor of a GGUF file: its GGML type, its shape in torch order (``[..., K]``: ggml's ``ne`` reversed)
    and where its bytes lie. Nothing is read until ``raw()`` or ``dequantize()`` touches the pages."""

    name: str
    type: codecs.GGMLType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    data: np.ndarray = field(repr=False)

    @property
    def info(self) -> codecs.TypeInfo:
        return codecs.TYPES[self.type]

    @property
    def layer(self) -> str:
        """The layer a tensor belongs to: ``blk.0.ffn_down.weight`` -> ``blk.0.ffn_down``."""
        return self.name.rsplit(".", 1)[0] if self.name.endswith((".weight", ".bias")) else self.name

    def raw(self) -> np.ndarray:
        """The GGML bytes as a memory-mapped ``uint8 [*shape[:-1], row_bytes]`` view (no copy)."""
        view = self.data[self.offset:self.offset + self.nbytes]
        return view.reshape(*self.shape[:-1], self.info.row_bytes(self.shape[-1]))

    def dequantize(self) -> torch.Tensor:
        """The tensor as float32 of ``shape`` (a fresh tensor)."""
        return codecs.dequantize(self.raw(), self.type, self.shape[-1])

    def scheme(self) -> Scheme:
        """The layer Scheme of a 2-D weight ``[out_features, in_features]``."""
        if len(self.shape) != 2:
            raise ValueError(f"tensor {self.name!r}: a linear layer needs a 2-D weight, this one is {list(self.shape)}")
        return codecs.scheme_for(self.type, in_features=self.shape[1], out_features=self.shape[0])


class GGUFFile:
    """A GGUF file's metadata and tensors, validated; tensors by name, 2-D weights by layer name."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        reader = _header(self.path)
        if reader.byte_order != "I" or sys.byteorder != "little":
            raise GGUFFormatError(f"{self.path}: big-endian GGUF files are not supported")
        self.fields = reader.fields
        self.alignment = int(reader.alignment)
        self.data_offset = int(reader.data_offset)
        self.tensors: dict[str, GGUFTensor] = {}
        size, expected = len(reader.data), 0
        for info in reader.tensor_infos:
            t = self._tensor(reader, info, expected)
            if t.name in self.tensors:
                raise GGUFFormatError(f"{self.path}: tensor {t.name!r} appears twice in the tensor table")
            if t.offset + t.nbytes > size:
                raise GGUFFormatError(f"{self.path}: tensor {t.name!r} ({t.type.name} {list(t.shape)}) needs bytes "
                                      f"{t.offset}..{t.offset + t.nbytes} but the file has {size}: truncated")
            self.tensors[t.name] = t
            expected += -(-t.nbytes // self.alignment) * self.alignment

    def _tensor(self, reader: Any, info: Any, expected: int) -> GGUFTensor:
        _, name_data, _, dims, raw_type, rel = info.parts
        name = bytes(name_data).decode("utf-8", errors="replace")
        where = f"{self.path}: tensor {name!r}"
        ne = [int(d) for d in dims]
        if not 1 <= len(ne) <= GGML_MAX_DIMS or min(ne) < 1:
            raise GGUFFormatError(f"{where}: dimensions {ne} (expected 1 to {GGML_MAX_DIMS} positive sizes)")
        type_id = int(raw_type[0])
        if type_id not in set(codecs.GGMLType):
            upstream = _gguf().GGMLQuantizationType
            known = upstream(type_id).name if type_id in set(upstream) else "unknown to gguf-py too"
            raise GGUFFormatError(f"{where}: GGML type id {type_id} ({known}) is not one qlinear reads; expected one "
                                  f"of {', '.join(f'{t.name} ({t.value})' for t in codecs.GGMLType)}")
        t = codecs.GGMLType(type_id)
        block = codecs.TYPES[t].block_size
        if ne[0] % block:
            raise GGUFFormatError(f"{where} ({t.name}): {ne[0]} values per row is not a whole number of "
                                  f"{block}-value blocks")
        nbytes = math.prod(ne) // block * codecs.TYPES[t].type_size
        if int(rel[0]) != expected:
            prev = list(self.tensors.values())[-1:]
            culprit = "".join(f" or in {p.name!r} ({p.type.name} {list(p.shape)})" for p in prev)
            hint = ("; type id 40 is the reference's Q1_0 here (upstream ggml uses 40 for NVFP4, which qlinear does "
                    "not read)" if codecs.GGMLType.Q1_0 in {t, *(p.type for p in prev)} else "")
            raise GGUFFormatError(f"{where} ({t.name} {ne[::-1]}): data at offset {int(rel[0])}, expected {expected} "
                                  f"(the padded sizes of the tensors before it): a type or shape is wrong here"
                                  f"{culprit}{hint}")
        return GGUFTensor(name, t, tuple(ne[::-1]), self.data_offset + expected, nbytes, reader.data)

    # ---------------------------------------------------------------- access
    def value(self, key: str, default: Any = None) -> Any:
        """A metadata value (``general.architecture``, ``llama.block_count``, ...), or ``default``."""
        f = self.fields.get(key)
        return default if f is None else f.contents()

    @property
    def architecture(self) -> str | None:
        return self.value("general.architecture")

    def __getitem__(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r} ({len(self.tensors)} tensors)") from None

    def __iter__(self) -> Iterator[GGUFTensor]:
        return iter(self.tensors.values())

    def layers(self) -> dict[str, GGUFTensor]:
        """Every 2-D ``*.weight`` tensor by layer name (``blk.0.ffn_down``): the candidates for a linear kernel."""
        return {t.layer: t for t in self if t.name.endswith(".weight") and len(t.shape) == 2}

    def linear(self, layer: str, backend: str = "auto", device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float16, share: bool = True, affine_runtime: bool | None = None,
               rows: torch.Tensor | None = None) -> QuantLinear:
        """A prepared GGUF kernel for ``layer`` (selected like any layer; ``layer.choice.explain()`` says why).
        ``share``: on CPU the layer's ``qweight`` is the memory-mapped bytes themselves (no copy).
        ``rows``: the output rows in this order (each with its blocks; a copy, not the mapped bytes), as
        transformers orders q/k rows.
        ``affine_runtime`` (where the Triton GGUF kernel is chosen; other kernels have no such runtime; docs/gguf.md):
        None, the default, runs Q4_K and Q8_0 layers of whole blocks on their lossless runtime forms in place of the
        blocks (``GGUFTritonKernel.replaces_blocks``); True also builds the larger float32 affine
        runtime of Q4_0/Q4_1 beside their blocks; False keeps every layer on its blocks."""
        from .caps import Problem
        from .kernels.gguf_triton import GGUFTritonKernel
        from .select import select
        from .target import Target

        weights = self.layers()
        if layer not in weights:
            raise KeyError(f"{self.path}: no 2-D weight for layer {layer!r}; layers: {', '.join(list(weights)[:8])}...")
        w = weights[layer]
        bias = self.tensors.get(f"{layer}.bias")
        target = Target.here(device)
        choice = select(Problem(w.scheme(), dtype), target, backend)
        options = ({"affine_runtime": affine_runtime}
                   if affine_runtime is not None and issubclass(choice.kernel, GGUFTritonKernel) else {})
        lay = choice.kernel(w.scheme(), bias=bias is not None, dtype=dtype, **options)
        raw = w.raw() if rows is None else torch.from_numpy(w.raw().copy())[rows].contiguous()
        b = None if bias is None else bias.dequantize()
        lay.load_blocks(raw, b if rows is None or b is None else torch.as_tensor(b)[rows], share=share)
        lay = lay.to(target.devices[0].torch_device)
        lay.prepare()
        lay.choice = choice
        return lay


def read_gguf(path: str | Path) -> GGUFFile:
    """Open and validate a GGUF file (tensor bytes stay memory-mapped)."""
    return GGUFFile(path)
