"""GGML block types as GGUF files name them: ids, llama.cpp's spellings, and each type's block geometry.

Facts only (no codecs), so ``Scheme`` can check a GGUF ``qtype`` without importing the block codecs of
``layouts/gguf``, which build their type table (``TYPES``, with decoders and encoders) on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import NamedTuple

import numpy as np


class GGMLType(IntEnum):
    """GGML type ids as GGUF files store them (the subset qlinear reads)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ4_NL = 20
    IQ4_XS = 23
    BF16 = 30
    Q1_0 = 40  # the reference's 32-value Q1_0; upstream ggml gives id 40 to NVFP4
    Q1_0_G128 = 41  # the reference's "PRISM" id; upstream ggml's Q1_0 has exactly this layout


class Geometry(NamedTuple):
    """A block of ``block_size`` values in ``type_size`` bytes; ``bits``: the logical width that ``Scheme.bits``
    and kernel declarations speak of."""

    block_size: int
    type_size: int
    bits: int


T = GGMLType
GEOMETRY: Mapping[GGMLType, Geometry] = {
    T.F32: Geometry(1, 4, 32), T.F16: Geometry(1, 2, 16), T.BF16: Geometry(1, 2, 16),
    T.Q4_0: Geometry(32, 18, 4), T.Q4_1: Geometry(32, 20, 4), T.Q5_0: Geometry(32, 22, 5),
    T.Q5_1: Geometry(32, 24, 5), T.Q8_0: Geometry(32, 34, 8),
    T.Q2_K: Geometry(256, 84, 2), T.Q3_K: Geometry(256, 110, 3), T.Q4_K: Geometry(256, 144, 4),
    T.Q5_K: Geometry(256, 176, 5), T.Q6_K: Geometry(256, 210, 6),
    T.IQ4_NL: Geometry(32, 18, 4), T.IQ4_XS: Geometry(256, 136, 4),
    T.Q1_0: Geometry(32, 6, 1), T.Q1_0_G128: Geometry(128, 18, 1),
}
del T

#: Spellings the reference and llama.cpp use for file types (``q4_k_m`` is a mix; its typical weight is Q4_K).
ALIASES: Mapping[str, GGMLType] = {
    "q4_k_s": GGMLType.Q4_K, "q4_k_m": GGMLType.Q4_K, "q5_k_s": GGMLType.Q5_K, "q5_k_m": GGMLType.Q5_K,
    "q3_k_s": GGMLType.Q3_K, "q3_k_m": GGMLType.Q3_K, "q3_k_l": GGMLType.Q3_K, "q1_0_g128": GGMLType.Q1_0_G128,
}


def ggml_type(value: str | int | GGMLType) -> GGMLType:
    """Parse a GGML type by name (any case, llama.cpp aliases too) or id; a clear error lists the known ones."""
    if isinstance(value, GGMLType):
        return value
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        if key in ALIASES:
            return ALIASES[key]
        for t in GGMLType:
            if t.name.lower() == key:
                return t
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) in set(GGMLType):
        return GGMLType(int(value))
    known = ", ".join(f"{t.name} ({t.value})" for t in GGMLType)
    raise ValueError(f"unknown GGML type {value!r}; qlinear knows: {known}")
