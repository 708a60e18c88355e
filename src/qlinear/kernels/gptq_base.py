"""Checkpoint buffers shared by every kernel that loads GPTQ-family weights (gptq, gptq_v2, gptq_p).

The buffers hold exactly what the checkpoint holds (v1 zero points stay v1 on the module), so a
``state_dict`` is always the checkpoint layout; the v1 offset is undone per field when decoding.
"""

from __future__ import annotations

import torch

from ..affine import AffineWeight
from ..enums import FORMAT
from ..layouts import gptq, planar
from ..spec import word_bits
from .base import QuantLinear, adopt_dtypes


class GPTQQuantLinear(QuantLinear):
    """Base for kernels whose checkpoint is a GPTQ layout; decoding helpers work on row tiles."""

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtype) in gptq.checkpoint_shapes(self.scheme).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        self.g_idx.copy_(torch.arange(self.in_features, dtype=torch.int32) // self.scheme.group_size)
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float16) if bias else None)

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        # GPTQ checkpoints store float16 scales; a layout re-encoded in memory at load (compressed-tensors'
        # bfloat16 scales) keeps its own: adopt the incoming dtype instead of rounding into float16.
        adopt_dtypes(self, state_dict, prefix, ("scales",), gptq.SCALE_DTYPES)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        self.check_fits(q)
        s = self.scheme
        self.write_checkpoint(gptq.to_checkpoint(q, s.format, s.pack_dtype), bias)

    def affine(self) -> AffineWeight:
        tensors = {n: getattr(self, n) for n in ("qweight", "qzeros", "scales", "g_idx")}
        return gptq.from_checkpoint({n: t.cpu() for n, t in tensors.items()}, self.scheme)

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("qweight", "qzeros", "scales", "g_idx", "bias")

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [getattr(self, n) for n in self.checkpoint_names()]

    def checkpoint_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return gptq.checkpoint_shapes(self.scheme)

    def words_of(self, codes_nk: torch.Tensor) -> torch.Tensor:
        """Codes ``[N, K]`` -> this layer's ``qweight`` (the checkpoint's packing)."""
        s = self.scheme
        return gptq.qweight_of(codes_nk, s.format, s.bits, s.pack_dtype)

    # ------------------------------------------------------------------ decoding for forward
    @property
    def code_block(self) -> int:
        """Input channels per self-contained block of packed words (tiles start on these)."""
        return 32 if self.scheme.format is FORMAT.GPTQ_P else 64

    def true_zeros(self) -> torch.Tensor:
        """Zero points ``[G, N]`` as float32, v1 offset undone per field."""
        v1 = self.scheme.format is FORMAT.GPTQ
        if self.scheme.format is FORMAT.GPTQ_P:
            z = planar.planar_unpack_cols(self.qzeros, self.scheme.bits, self.out_features)
        else:
            z = gptq.unpack_qzeros(self.qzeros, self.scheme.bits, self.out_features, v1=v1)
        return z.to(torch.float32)

    def codes_cols(self, n0: int, n1: int) -> torch.Tensor:
        """Codes ``[K, n1 - n0]`` (uint8) of output channels ``n0:n1`` (qweight packs along K)."""
        words = self.qweight[:, n0:n1]
        if self.scheme.format is FORMAT.GPTQ_P:
            return planar.planar_unpack_rows(words, self.scheme.bits, self.in_features)
        return gptq.unpack_qweight(words, self.scheme.bits, self.in_features)

    def codes_rows(self, k0: int, k1: int) -> torch.Tensor:
        """Codes ``[k1 - k0, N]`` (uint8) of input channels ``k0:k1``; ``k0`` a multiple of ``code_block``."""
        b = self.scheme.bits
        w = word_bits(self.scheme.pack_dtype)
        r0, r1 = k0 * b // w, -(-k1 * b // w)
        if self.scheme.format is FORMAT.GPTQ_P:
            return planar.planar_unpack_rows(self.qweight[r0:r1], b, k1 - k0)
        return gptq.unpack_qweight(self.qweight[r0:r1], b, k1 - k0)
