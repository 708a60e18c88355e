"""GGUF / GGML block codecs: the type table and row-level ``dequantize`` / ``quantize``. Pure functions.

A GGML row of K values is ``ceil(K / B)`` blocks of ``T`` bytes (K zero-padded to a multiple of B). Decoding
is vectorised torch (any device; fast enough to decode tiles inside a forward) and bit-identical to
``gguf.quants.dequantize``. Encoding is numpy and byte-identical to ggml's reference quantizers (what
llama.cpp writes without an importance matrix). The bytes never depend on an optional package: qlinear's
encoder is always its own code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...ggml_types import GEOMETRY, GGMLType, ggml_type
from . import float as flt
from . import iq, kquants, kquants_encode, legacy, q1

if TYPE_CHECKING:
    from ...spec import Scheme


@dataclass(frozen=True)
class TypeInfo:
    """One GGML type: block of ``block_size`` values in ``type_size`` bytes, its logical bit width (what
    ``Scheme.bits`` and kernel declarations speak of), and its codecs (``encode`` None: decode only)."""

    type: GGMLType
    block_size: int
    type_size: int
    bits: int
    decode: Callable[[torch.Tensor], torch.Tensor]
    encode: Callable[[np.ndarray], np.ndarray] | None

    @property
    def name(self) -> str:
        return self.type.name

    def blocks_per_row(self, k: int) -> int:
        return -(-k // self.block_size)

    def row_bytes(self, k: int) -> int:
        """Bytes of one row of ``k`` values (zero-padded to whole blocks)."""
        return self.blocks_per_row(k) * self.type_size


def _info(t: GGMLType, dec: Callable, enc: Callable | None) -> TypeInfo:
    return TypeInfo(t, *GEOMETRY[t], dec, enc)


T = GGMLType
TYPES: Mapping[GGMLType, TypeInfo] = {i.type: i for i in (
    _info(T.F32, flt.decode_f32, flt.encode_f32),
    _info(T.F16, flt.decode_f16, flt.encode_f16),
    _info(T.BF16, flt.decode_bf16, flt.encode_bf16),
    _info(T.Q4_0, legacy.decode_q4_0, legacy.encode_q4_0),
    _info(T.Q4_1, legacy.decode_q4_1, legacy.encode_q4_1),
    _info(T.Q5_0, legacy.decode_q5_0, legacy.encode_q5_0),
    _info(T.Q5_1, legacy.decode_q5_1, legacy.encode_q5_1),
    _info(T.Q8_0, legacy.decode_q8_0, legacy.encode_q8_0),
    _info(T.Q2_K, kquants.decode_q2_k, kquants_encode.encode_q2_k),
    _info(T.Q3_K, kquants.decode_q3_k, kquants_encode.encode_q3_k),
    _info(T.Q4_K, kquants.decode_q4_k, kquants_encode.encode_q4_k),
    _info(T.Q5_K, kquants.decode_q5_k, kquants_encode.encode_q5_k),
    _info(T.Q6_K, kquants.decode_q6_k, kquants_encode.encode_q6_k),
    _info(T.IQ4_NL, iq.decode_iq4_nl, None),
    _info(T.IQ4_XS, iq.decode_iq4_xs, None),
    _info(T.Q1_0, q1.decode_q1, q1.encode_q1),
    _info(T.Q1_0_G128, q1.decode_q1, q1.encode_q1),
)}
del T


def type_info(value: str | int | GGMLType) -> TypeInfo:
    return TYPES[ggml_type(value)]


def dequantize(data: torch.Tensor | np.ndarray, qtype: str | int | GGMLType, k: int | None = None) -> torch.Tensor:
    """GGML rows ``uint8 [..., nb * T]`` -> float32 ``[..., nb * B]`` on the same device (cropped to ``k``)."""
    info = type_info(qtype)
    if isinstance(data, np.ndarray):
        data = torch.from_numpy(data if data.flags.writeable else data.copy())
    if data.dtype != torch.uint8:
        raise ValueError(f"{info.name} data: expected uint8 bytes, got {data.dtype}")
    if data.ndim == 0 or data.shape[-1] % info.type_size:
        raise ValueError(f"{info.name} data: last dimension must be a multiple of {info.type_size} bytes "
                         f"(one block); got shape {tuple(data.shape)}")
    lead, nb = tuple(data.shape[:-1]), data.shape[-1] // info.type_size
    values = info.decode(data.reshape(-1, info.type_size)).reshape(*lead, nb * info.block_size)
    return values if k is None else values[..., :k]


def quantize(w: torch.Tensor | np.ndarray, qtype: str | int | GGMLType) -> np.ndarray:
    """Float rows ``[..., K]`` -> GGML bytes ``uint8 [..., ceil(K/B) * T]`` (K zero-padded), as ggml writes them."""
    info = type_info(qtype)
    if info.encode is None:
        raise NotImplementedError(f"qlinear decodes {info.name} but has no encoder for it (it needs ggml's "
                                  "importance-matrix search); encodable: "
                                  + ", ".join(t.name for t, i in TYPES.items() if i.encode))
    x = w.detach().cpu().float().numpy() if isinstance(w, torch.Tensor) else np.asarray(w, dtype=np.float32)
    if x.ndim == 0:
        raise ValueError(f"{info.name}: cannot quantize a scalar")
    lead, k = x.shape[:-1], x.shape[-1]
    pad = info.blocks_per_row(k) * info.block_size - k
    x = np.pad(x.astype(np.float32), [(0, 0)] * len(lead) + [(0, pad)]) if pad else x.astype(np.float32)
    with np.errstate(all="ignore"):
        out = info.encode(np.ascontiguousarray(x.reshape(-1, info.block_size)))
    return out.astype(np.uint8, copy=False).reshape(*lead, info.row_bytes(k))


def scheme_for(qtype: str | int | GGMLType, in_features: int, out_features: int) -> Scheme:
    """The layer Scheme of a GGUF weight ``[out_features, in_features]`` of this type."""
    from ...enums import FORMAT, METHOD
    from ...spec import Scheme

    info = type_info(qtype)
    return Scheme(bits=info.bits, group_size=info.block_size, in_features=in_features, out_features=out_features,
                  method=METHOD.GGUF, format=FORMAT.GGUF, qtype=info.name)
