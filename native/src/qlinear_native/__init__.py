"""Optional native helpers for qlinear's CPU kernels; qlinear uses them when this package is installed.

``decode_int4_bf16`` turns int4pack CPU bytes into a bfloat16 weight tile with group scales (the decode
half of qlinear's decode + bf16 GEMM path), in one pass. ``_amx`` multiplies bfloat16 activations by the
int4pack weight on AMX tiles (``int4_mm_codes``, ``int4_mm_weights``; ``available()`` says whether this CPU
and kernel allow it); qlinear calls it through ``qlinear.kernels.cpu_amx``. Built at ``pip install`` for the
installing CPU.
"""

from ._decode import decode_int4_bf16, simd

__all__ = ["decode_int4_bf16", "simd"]
