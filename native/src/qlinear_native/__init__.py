"""Optional native helpers for qlinear's CPU kernels; qlinear uses them when this package is installed.

``decode_int4_bf16`` turns int4pack CPU bytes into a bfloat16 weight tile with group scales (the decode
half of qlinear's decode + bf16 GEMM path), in one pass. Built at ``pip install`` for the installing CPU.
"""

from ._decode import decode_int4_bf16, simd

__all__ = ["decode_int4_bf16", "simd"]
