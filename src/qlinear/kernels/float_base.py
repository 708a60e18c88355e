"""Checkpoint buffers shared by every kernel that loads float-quantized weights (FP8, NVFP4, MXFP4).

The buffers hold exactly what the checkpoint holds (FP8 codes in their torch dtype, FP4 bytes, block scales
in their stored dtype, the NVFP4 global scale), so a ``state_dict`` is always the checkpoint layout.
``prepare()`` validates them once (``FloatWeight``) and keeps the small per-block factors; ``decode_rows``
then yields the float weight of a few output rows at a time, computed as the producer's own
dequantization does, so a forward never builds the whole dense weight.
"""

from __future__ import annotations

import torch

from ..blockfloat import FloatWeight, ScaleRule
from ..caps import Problem
from ..floats import Element, value_table
from ..layouts import float_layouts
from .base import QuantLinear, adopt_dtypes

#: Largest decoded tile (values): about 1 MiB of float32, as ``TorchLinear``'s.
TILE_ELEMENTS = 1 << 18


def fp8_element_reasons(problem: Problem) -> list[str]:
    """An FP8 kernel's reason against a layer whose codes are not FP8 (naive-quantized holds either kind)."""
    e = problem.scheme.element
    if e not in (Element.E4M3, Element.E5M2):
        what = "integer codes (loaded as gptq_v2)" if e is None else f"{e.value} codes"
        return [f"{what}: runs FP8 (float8_e4m3fn / float8_e5m2) codes only"]
    return []


class FloatQuantLinear(QuantLinear):
    """Base for kernels whose checkpoint is a float-quantized layout (``layouts.float_layouts``)."""

    raw_packing = False  # hf_pack_layer packs integer GPTQ/AWQ weights; float layers come from load_float

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for name, (shape, dtypes) in float_layouts.checkpoint_shapes(self.scheme).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtypes[0]))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.bfloat16) if bias else None)

    @property
    def scale_name(self) -> str:
        return float_layouts.scale_name(self.scheme)

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        # Scales and bias keep the checkpoint's dtype (bfloat16 / float16 / float32), never rounded on load.
        allowed = float_layouts.checkpoint_shapes(self.scheme)[self.scale_name][1]
        adopt_dtypes(self, state_dict, prefix, (self.scale_name,), allowed)
        adopt_dtypes(self, state_dict, prefix, ("bias",), (torch.float16, torch.bfloat16, torch.float32))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def load_float(self, w: FloatWeight, bias: torch.Tensor | None = None) -> None:
        """Encode ``w`` into the checkpoint buffers, bit-exactly as the format writes it."""
        tensors = float_layouts.to_checkpoint(w, self.scheme)
        if bias is not None:
            if self.bias is None:
                raise ValueError("bias given but the layer was built without one (bias=False)")
            if tuple(bias.shape) != (self.out_features,):
                raise ValueError(f"bias: expected shape [{self.out_features}], got {tuple(bias.shape)}")
            tensors["bias"] = bias.detach()
        with torch.no_grad():
            for name, value in tensors.items():
                if getattr(self, name).dtype != value.dtype:
                    setattr(self, name, torch.zeros_like(getattr(self, name), dtype=value.dtype))
                getattr(self, name).copy_(value)
        self._runtime_key = None

    def load_affine(self, q: object, bias: torch.Tensor | None = None) -> None:
        raise TypeError(f"{type(self).__name__} holds float codes; build it from a FloatWeight (load_float)")

    def affine(self) -> object:
        raise TypeError(f"{type(self).__name__} holds float codes, which have no integer-affine form; "
                        "use float_weight()")

    def float_weight(self) -> FloatWeight:
        """The canonical float form of the checkpoint buffers (validated)."""
        names = float_layouts.checkpoint_shapes(self.scheme)
        return float_layouts.from_checkpoint({n: getattr(self, n).cpu() for n in names}, self.scheme)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [getattr(self, n) for n in float_layouts.checkpoint_shapes(self.scheme)] + [self.bias]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.float_weight().dequantize(dtype).to(self.checkpoint_tensors()[0].device)

    # ------------------------------------------------------------------ runtime
    def prepare(self) -> None:
        """Validate the buffers once and keep the per-block factors (float32, ``[Rb, Cb]``) and the code table."""
        w = self.float_weight()
        device = self.checkpoint_tensors()[0].device
        self._factors = w.scale_values().to(device)
        self._table = value_table(self.scheme.element, torch.float32, device)
        super().prepare()

    def codes_rows(self, n0: int, n1: int) -> torch.Tensor:
        """Codes of output rows ``n0:n1`` as uint8 ``[n1 - n0, K]``."""
        if "weight_packed" in self._buffers:
            p = self.weight_packed[n0:n1]
            return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(n1 - n0, -1)
        return self.weight[n0:n1].view(torch.uint8)

    def decode_rows(self, n0: int, n1: int, dtype: torch.dtype) -> torch.Tensor:
        """The float weight of output rows ``n0:n1`` (``[n1 - n0, K]`` in ``dtype``), computed in float32 as the
        producer dequantizes (``value * factor`` or ``value / factor``), then cast."""
        bn, bk = float_layouts.block_of(self.scheme)
        k = self.in_features
        v = self._table[self.codes_rows(n0, n1).long()]
        rows = torch.arange(n0, n1, device=v.device) // bn
        f = self._factors[rows]
        if f.shape[1] > 1 or bk < k:
            f = f.repeat_interleave(bk, dim=1)[:, :k]
        w = v / f if self.rule() is ScaleRule.DIVIDE else v * f
        return w.to(dtype)

    def rule(self) -> ScaleRule:
        return float_layouts.rule_of(self.scheme)

    def tile_rows(self) -> int:
        return max(16, TILE_ELEMENTS // self.in_features // 16 * 16)
