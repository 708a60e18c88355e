"""GGUF layers in plain torch: ``GGUFTorchLinear`` runs native GGML block bytes on any device.

The checkpoint buffer is ``qweight`` uint8 ``[N, ceil(K/B) * T]`` (formats.md 2.14) and the GGML type comes
from ``Scheme.qtype`` (a ``GGMLType``, never an integer mode). Each forward decodes output-row tiles of about
``TILE_ELEMENTS`` values with the codecs of ``layouts/gguf`` and multiplies them; nothing dense is kept
between forwards. ``GGUFQuantLinear`` holds the buffers, loading and tile decoding that other GGUF kernels
(Triton, ggml bridge) share; a subclass lists the types it runs in ``qtypes``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch

from ..affine import AffineWeight
from ..caps import Problem
from ..enums import BACKEND, DEVICE, FORMAT
from ..layouts import gguf
from ..spec import Scheme
from ..target import Target
from . import gguf_int4pack, native_blocks, native_int4
from .base import QuantLinear
from .planned.gguf import GGUFTorchLinear as _Declared

#: Largest decoded tile (values) on CPU: 2**18 float32 = 1 MiB. Measured at M=1 on a 4096x4096 layer (one
#: thread): 2**15..2**17 tiles pay torch's per-op overhead, 2**20 and up gain nothing more.
TILE_ELEMENTS = 1 << 18
#: On accelerators each op is a kernel launch, so tiles are large: 2**24 float32 = 64 MiB within one forward.
TILE_ELEMENTS_DEVICE = 1 << 24


def _qtypes_for_bits(bits: frozenset[int]) -> frozenset[gguf.GGMLType]:
    return frozenset(t for t, info in gguf.TYPES.items() if info.bits in bits)


class GGUFQuantLinear(QuantLinear):
    """Base for kernels whose checkpoint is native GGML blocks; decoding helpers work on output-row tiles."""

    raw_packing: ClassVar[bool] = False  # GGML blocks are not integer-affine codes: load bytes or floats
    #: The GGML types this kernel runs (its declaration's ``bits`` are logical bits and cannot say it).
    qtypes: ClassVar[frozenset[gguf.GGMLType]] = frozenset()

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        s = problem.scheme
        out = cls.runtime_target_reasons(target)
        if s.format is not FORMAT.GGUF:
            return out
        if s.qtype is None:
            return [*out, "GGUF scheme names no qtype (Scheme(qtype='Q4_K', ...)): logical bits do not identify "
                          "a GGML block type"]
        if gguf.ggml_type(s.qtype) not in cls.qtypes:
            runs = ", ".join(t.name for t in sorted(cls.qtypes))
            out.append(f"qtype {s.qtype} not run by this kernel (runs {runs})")
        return out

    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16,
                 qtype: str | int | gguf.GGMLType | None = None) -> None:
        if qtype is not None:
            scheme = replace(scheme, qtype=gguf.ggml_type(qtype).name)
        if scheme.qtype is None:
            raise ValueError(f"{type(self).__name__}: a GGUF layer needs its GGML type (qtype=... or Scheme.qtype)")
        super().__init__(scheme, bias=bias, dtype=dtype)

    @property
    def qtype(self) -> gguf.GGMLType:
        return gguf.ggml_type(self.scheme.qtype)

    @property
    def type_info(self) -> gguf.TypeInfo:
        return gguf.TYPES[self.qtype]

    def extra_repr(self) -> str:
        s = self.scheme
        return (f"in_features={s.in_features}, out_features={s.out_features}, qtype={self.qtype.name}, "
                f"bits={s.bits}, format={s.format.value}, backend={self.backend.value}")

    # ---------------------------------------------------------------- buffers and loading
    def register_checkpoint_buffers(self, bias: bool) -> None:
        row = self.type_info.row_bytes(self.in_features)
        self.register_buffer("qweight", torch.zeros(self.out_features, row, dtype=torch.uint8))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float32) if bias else None)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [self.qweight, self.bias]

    def load_blocks(self, qweight: torch.Tensor | np.ndarray, bias: torch.Tensor | np.ndarray | None = None,
                    share: bool = False) -> None:
        """Take GGML bytes ``uint8 [N, ceil(K/B)*T]`` (a tensor, or a numpy / memory-mapped view). ``share``
        adopts the given CPU tensor as the buffer instead of copying it (a memory-mapped file stays mapped)."""
        t = torch.from_numpy(np.ascontiguousarray(qweight)) if isinstance(qweight, np.ndarray) else qweight
        want = tuple(self.qweight.shape)
        if t.dtype not in (torch.uint8, torch.int8) or tuple(t.shape) != want:
            raise ValueError(f"qweight ({self.qtype.name}): expected uint8 {list(want)} "
                             f"([out_features, ceil(in_features/{self.type_info.block_size})*"
                             f"{self.type_info.type_size}]), got {str(t.dtype).removeprefix('torch.')} "
                             f"{list(t.shape)}")
        b = None
        if bias is not None:
            b = torch.as_tensor(np.asarray(bias) if isinstance(bias, np.ndarray) else bias)
            if self.bias is None:
                raise ValueError("bias given but the layer was built without one (bias=False)")
            if tuple(b.shape) != (self.out_features,):
                raise ValueError(f"bias: expected shape [{self.out_features}], got {list(b.shape)}")
        with torch.no_grad():
            t = t.view(torch.uint8)
            if share and t.device == self.qweight.device and t.is_contiguous():
                self.qweight = t
            else:
                self.qweight.copy_(t)
            if b is not None:
                self.bias.copy_(b.detach().to(torch.float32))
        self._runtime_key = None

    def load_float(self, weight: torch.Tensor | np.ndarray, bias: torch.Tensor | None = None) -> None:
        """Quantize a float weight ``[N, K]`` with qlinear's ggml-exact encoder and load the bytes."""
        w = weight.detach().cpu().float().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
        if w.shape != (self.out_features, self.in_features):
            raise ValueError(f"weight: expected shape [{self.out_features}, {self.in_features}], got {list(w.shape)}")
        self.load_blocks(gguf.quantize(w, self.qtype), bias)

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        raise NotImplementedError(f"{type(self).__name__}: GGML blocks are not integer-affine codes; load the file's "
                                  "bytes with load_blocks() or quantize floats with load_float()")

    def affine(self) -> AffineWeight:
        raise NotImplementedError(f"{self.qtype.name} blocks have no integer-affine form; use dequantize()")

    # ---------------------------------------------------------------- decoding
    def blocks(self) -> torch.Tensor:
        """The GGML bytes ``uint8 [N, row_bytes]`` (a kernel that keeps another form rebuilds them here)."""
        return self.qweight

    def decode_rows(self, n0: int, n1: int) -> torch.Tensor:
        """Float32 weight rows ``n0:n1`` (output channels), ``[n1 - n0, in_features]``."""
        return gguf.dequantize(self.blocks()[n0:n1], self.qtype, self.in_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.decode_rows(0, self.out_features).to(dtype)

    def tile_rows(self) -> int:
        """Output rows decoded per tile: about TILE_ELEMENTS (CPU) or TILE_ELEMENTS_DEVICE values, at least one."""
        padded = self.type_info.blocks_per_row(self.in_features) * self.type_info.block_size
        budget = TILE_ELEMENTS if self.qweight.device.type == "cpu" else TILE_ELEMENTS_DEVICE
        return max(1, min(self.out_features, budget // padded))


class GGUFTorchLinear(GGUFQuantLinear):
    """Native GGML blocks of every quantized type qlinear decodes, decoded tile by tile in each forward.

    On a CPU with bfloat16 activations, the 32-value affine types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K)
    run torch's int4pack op for small M instead, or the native extra's kernels at any M where installed
    (``gguf_int4pack``: per-32 scales rounded to bfloat16, as the activations are); float32 and float16
    activations always take the exact decode.
    """

    backend = BACKEND.GGUF_TORCH
    caps = _Declared.caps
    qtypes = _qtypes_for_bits(_Declared.caps.bits)

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        name = str(problem.scheme.qtype or "")
        exact = "blocks decoded tile by tile in each forward (float32 GEMM on CPU: exact)"
        stored = ""  # the native extra's kernel on the blocks as stored
        top = native_blocks.max_m(name, problem.dtype)
        if top and any(d.kind is DEVICE.CPU for d in target.devices):
            stored = (f"the blocks as stored (native blocks kernel, exact float32 products) at M=1..{top}, then "
                      if native_blocks.native_blocks() is not None else
                      f"(the native extra, pip install ./native on an AVX-512 CPU, would multiply the stored blocks "
                      f"exactly up to M={top}) ")
            if problem.dtype != torch.bfloat16:
                return stored + exact
        if problem.dtype != torch.bfloat16 or not gguf_int4pack.supported(name) or all(
                d.kind is not DEVICE.CPU for d in target.devices):
            return exact
        planes, group = gguf_int4pack.planes_of(name), gguf_int4pack.AFFINE[name][1]
        fallback = ("the exact decode" if group < 32 else
                    f"the int4pack op up to M={gguf_int4pack.MAX_M[planes]}, the exact decode above")
        how = native_int4.describe(group, fallback)
        planes_txt = f"{name} as int4pack planes (per-{group} scales in bfloat16): {how}"
        return f"bfloat16 on CPU: {stored}{planes_txt}; otherwise {exact}"

    def prepare(self) -> None:
        self._int4pack: gguf_int4pack.GGUFInt4Pack | None = None  # built on the first call that uses it
        super().prepare()

    def int4pack_runtime(self) -> gguf_int4pack.GGUFInt4Pack:
        """The int4pack planes, built on the first call that needs them."""
        self.ensure_prepared()
        if self._int4pack is None:
            self._int4pack = gguf_int4pack.build(self.qweight, self.qtype.name, self.in_features, self.out_features)
        return self._int4pack

    def uses_int4pack(self, x2: torch.Tensor) -> bool:
        """Route this call to the int4pack planes? (CPU, bfloat16, an affine type, and M at most ``MAX_M`` for
        the op's groups of 32, or a kernel of the native extra for this M.)"""
        name = self.qtype.name
        if (x2.device.type != "cpu" or x2.dtype != torch.bfloat16 or not gguf_int4pack.supported(name)
                or (torch.is_grad_enabled() and x2.requires_grad) or self.out_features < 16
                or not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")):
            return False
        m, planes, group = x2.shape[0], gguf_int4pack.planes_of(name), gguf_int4pack.AFFINE[name][1]
        if group >= 32 and m <= gguf_int4pack.MAX_M[planes]:
            return True
        return native_int4.native_int4() is not None and self.int4pack_runtime().native_kernel(m) is not None

    def uses_native_blocks(self, x2: torch.Tensor) -> bool:
        """Route this call to the native blocks kernel? (CPU, a type of ``native_blocks.TYPES``, no gradient, M up to
        ``native_blocks.max_m`` for the activation dtype.)"""
        return (x2.device.type == "cpu" and self.qweight.device.type == "cpu"
                and not (torch.is_grad_enabled() and x2.requires_grad)
                and native_blocks.runs(self.qtype.name, x2.shape[0], x2.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        self.ensure_prepared()
        x2 = x.reshape(-1, self.in_features)
        y = None
        if x2.shape[0] and self.uses_native_blocks(x2):  # the file's blocks, float32 products (exact)
            y = native_blocks.matmul(x2, self.qweight, self.qtype.name, self.in_features)
        elif x2.shape[0] and self.uses_int4pack(x2):
            y = gguf_int4pack.matmul(self.int4pack_runtime(), x2, self.out_features)
        if y is not None:
            if self.bias is not None:
                y = y + self.bias.to(y.dtype)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        # On CPU the tiles multiply in float32 (the exact decode; faster there than casting every tile to
        # bf16/fp16), elsewhere in the activation dtype.
        work = torch.float32 if x.device.type == "cpu" else x.dtype
        x2 = x2.to(work)
        step = self.tile_rows()
        parts = [x2 @ self.decode_rows(n0, min(self.out_features, n0 + step)).to(work).t()
                 for n0 in range(0, self.out_features, step)]
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        if self.bias is not None:
            y = y + self.bias.to(work)
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


KERNELS = (GGUFTorchLinear,)
