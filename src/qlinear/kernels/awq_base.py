"""Checkpoint buffers shared by every kernel that loads AWQ weights (gemm, gemv, gemv_fast, llm-awq).

The buffers hold exactly what the checkpoint holds, so a ``state_dict`` is always the checkpoint layout.
The decode helpers work on row tiles (input channels ``k0:k1``), so a kernel never has to build the
whole dense weight: codes ``[k1-k0, N]``, zero points ``[G, N]`` and scales ``[G, N]`` in float32.
"""

from __future__ import annotations

from typing import Any

import torch

from ..affine import AffineWeight
from ..enums import FORMAT
from ..layouts import awq
from ..layouts.bitpack import unpack_bits
from .base import QuantLinear


class AwqQuantLinear(QuantLinear):
    """Base for kernels whose checkpoint is an AWQ layout; decoding helpers work on row tiles."""

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtype) in awq.checkpoint_shapes(self.scheme).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float16) if bias else None)

    @property
    def zeros_buffer(self) -> torch.Tensor:
        """The zero-point buffer: packed integer zeros (gemm, gemv) or scaled negative zeros (gemv_fast, llm-awq)."""
        return getattr(self, awq.zeros_name(self.scheme.format))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        # AWQ GEMM checkpoints store scales (and bias) in float16 or bfloat16: adopt the incoming dtype
        # instead of letting load_state_dict round bfloat16 values into float16 (or back).
        if self.scheme.format is FORMAT.GEMM:
            for name in ("scales", "bias"):
                t, mine = state_dict.get(prefix + name), getattr(self, name)
                if (isinstance(t, torch.Tensor) and mine is not None and t.dtype in awq.SCALE_DTYPES
                        and t.dtype != mine.dtype):
                    setattr(self, name, torch.zeros_like(mine, dtype=t.dtype))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        self.check_fits(q)
        s = self.scheme
        self.write_checkpoint(awq.to_checkpoint(q, s.format, scale_dtype=self.scales.dtype), bias)

    def affine(self) -> AffineWeight:
        names = awq.checkpoint_shapes(self.scheme)
        return awq.from_checkpoint({n: getattr(self, n).cpu() for n in names}, self.scheme)

    def checkpoint_names(self) -> tuple[str, ...]:
        return ("qweight", awq.zeros_name(self.scheme.format), "scales", "bias")

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [getattr(self, n) for n in self.checkpoint_names()]

    def checkpoint_shapes(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return awq.checkpoint_shapes(self.scheme)

    def words_of(self, codes_nk: torch.Tensor) -> torch.Tensor:
        """Codes ``[N, K]`` -> this layer's ``qweight`` (the checkpoint's packing)."""
        return awq.qweight_of(codes_nk, self.scheme.format, self.scheme.bits)

    # ------------------------------------------------------------------ decoding for forward
    @property
    def code_block(self) -> int:
        """Input channels per self-contained run of packed words (tiles start on multiples of it)."""
        return {FORMAT.GEMM: 1, FORMAT.GEMV: 8}.get(self.scheme.format, awq.KSTRIDE)

    def slot_columns(self) -> torch.Tensor | None:
        """GEMM: the output column each unpacked word slot holds (the AWQ interleave), None when in order.

        A kernel can decode ``codes_rows(..., slot_order=True)`` (no gather), permute scales and zeros
        with this index once, and put the output columns back in order at the end.
        """
        s = self.scheme
        if s.format is not FORMAT.GEMM or awq.field_order(s.bits) == tuple(range(32 // s.bits)):
            return None
        return awq.gemm_slot_columns(s.out_features, s.bits).to(self.qweight.device)

    def codes_rows(self, k0: int, k1: int, slot_order: bool = False) -> torch.Tensor:
        """Codes ``[k1 - k0, N]`` (uint8) of input channels ``k0:k1``; ``k0`` a multiple of ``code_block``.

        ``slot_order`` (gemm): columns as the words hold them, ``slot_columns()`` says which is which.
        """
        s = self.scheme
        if k0 % self.code_block:
            raise ValueError(f"k0: {k0} is not a multiple of {self.code_block} ({s.format.value} code block)")
        if s.format is FORMAT.GEMM:
            if slot_order:
                return unpack_bits(self.qweight[k0:k1], s.bits, s.out_features, dim=1, name="qweight")
            return awq.unpack_gemm(self.qweight[k0:k1], s.bits, s.out_features)
        if s.format is FORMAT.GEMV:
            return unpack_bits(self.qweight[:, k0 // 8:], 4, k1 - k0, dim=1, name="qweight").t()
        c1 = min(-(-k1 // awq.KSTRIDE) * awq.KSTRIDE, s.in_features)
        return awq.unpack_fast(self.qweight[:, k0:c1], s.out_features)[:, :k1 - k0].t()

    def group_scales(self) -> torch.Tensor:
        """Scales ``[G, N]`` float32 (padding of the GEMV layouts dropped)."""
        g, fmt = self.scheme.num_groups, self.scheme.format
        if fmt is FORMAT.GEMM:
            return self.scales.float()
        return self.scales[:, :g].t().float() if fmt is FORMAT.GEMV else self.scales[:g].float()

    def true_zeros(self) -> torch.Tensor:
        """Zero points ``[G, N]`` as float32.

        gemv_fast / llm-awq: ``-zbuf / s`` (0 where ``s = 0``), which is the integer ``z`` for every
        checkpoint the packers write, and the buffer's own value otherwise (no rounding, no error).
        """
        s, g, n = self.scheme, self.scheme.num_groups, self.scheme.out_features
        if s.format is FORMAT.GEMM:
            return awq.unpack_gemm(self.qzeros, s.bits, n, "qzeros").float()
        if s.format is FORMAT.GEMV:
            return unpack_bits(self.qzeros, 4, g, dim=1, name="qzeros").t().float()
        scales = self.scales[:g].float()
        zbuf = self.zeros_buffer[:g].float()
        return torch.where(scales != 0, -zbuf / torch.where(scales != 0, scales, 1.0), 0.0)

    def group_index(self, k0: int, k1: int) -> torch.Tensor:
        """Group of each input channel ``k0:k1`` (AWQ has no g_idx: ``k // group_size``)."""
        return torch.arange(k0, k1, device=self.qweight.device) // self.scheme.group_size
