"""Checkpoint buffers shared by the kernels that load bitsandbytes weights (4-bit NF4 / FP4, 8-bit LLM.int8).

The layer's state dict is the checkpoint's own module state: ``weight``, ``weight.absmax``,
``weight.quant_map``, ``weight.nested_absmax``, ``weight.nested_quant_map``,
``weight.quant_state.bitsandbytes__nf4`` (or ``SCB`` and ``weight_format`` for 8-bit), in their stored dtypes.
Module buffers cannot have dots in their names, so each is kept under an attribute name
(``weight_absmax``, ...) and ``_save_to_state_dict`` / ``_load_from_state_dict`` translate. The JSON blob's
length and the nested absmax count are taken from the loaded tensors.

``prepare()`` validates the buffers once (``layouts.bnb``) and keeps the float32 block absmax (decoded from
its nested form where double-quantized: small, one value per block) and the code table; ``decode_rows``
then gives a few output rows at a time, exactly as bitsandbytes dequantizes them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..bnb_weight import BnbInt8Weight, BnbWeight, code_table, int8_rows, scale_blocks
from ..layouts import bnb
from .base import QuantLinear, adopt_dtypes

#: Largest decoded tile (values): about 1 MiB of float32, as the other Torch kernels'.
TILE_ELEMENTS = 1 << 18
BIAS_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def attr_name(leaf: str) -> str:
    """The buffer attribute holding checkpoint leaf ``leaf`` (``weight.absmax`` -> ``weight_absmax``; the JSON
    blob -> ``weight_quant_state``)."""
    if leaf.startswith(bnb.bnb_state.PREFIX):
        return "weight_quant_state"
    return leaf.replace(".", "_")


class BnbQuantLinear(QuantLinear):
    """Base for kernels whose checkpoint is a bitsandbytes module (``layouts.bnb``)."""

    raw_packing = False  # built from a BnbWeight / BnbInt8Weight (load_bnb) or a checkpoint, never from GPTQ outputs

    def register_checkpoint_buffers(self, bias: bool) -> None:
        for leaf, (shape, dtypes) in bnb.checkpoint_shapes(self.scheme).items():
            self.register_buffer(attr_name(leaf), torch.zeros(shape, dtype=dtypes[0]))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float32) if bias else None)

    def leaves(self) -> dict[str, str]:
        """Checkpoint leaf -> buffer attribute, in checkpoint order (bias last when present)."""
        out = {leaf: attr_name(leaf) for leaf in bnb.tensor_names(self.scheme)}
        if self.bias is not None:
            out["bias"] = "bias"
        return out

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        for leaf, attr in self.leaves().items():
            t = getattr(self, attr)
            destination[prefix + leaf] = t if keep_vars else t.detach()

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: list[str], unexpected_keys: list[str], error_msgs: list[str]) -> None:
        # The checkpoint's dtypes and lengths are kept: bias as stored, the blob and nested absmax as long as given.
        adopt_dtypes(self, state_dict, prefix, ("bias",), BIAS_DTYPES)
        mine = self.leaves()
        for key in [k for k in state_dict if k.startswith(prefix)]:
            leaf = key[len(prefix):]
            if leaf not in mine:
                if leaf != "weight_format" or self.scheme.bits != 8:  # optional in 8-bit checkpoints
                    unexpected_keys.append(key)
                continue
            attr, value = mine[leaf], state_dict[key]
            if not isinstance(value, torch.Tensor):
                error_msgs.append(f"{key}: expected a tensor, got {type(value).__name__}")
                continue
            current = getattr(self, attr)
            resizable = attr in ("weight_quant_state", "weight_nested_absmax")
            if value.dtype != current.dtype or (tuple(value.shape) != tuple(current.shape) and not resizable):
                error_msgs.append(f"{key}: expected {current.dtype} shape {list(current.shape)}, got {value.dtype} "
                                  f"shape {list(value.shape)}")
                continue
            with torch.no_grad():
                if tuple(value.shape) != tuple(current.shape):
                    self._buffers[attr] = torch.empty_like(value, device=current.device)
                self._buffers[attr].copy_(value)
        for leaf in mine:
            if prefix + leaf not in state_dict and leaf != "weight_format":
                missing_keys.append(prefix + leaf)
        self._runtime_key = None

    # ------------------------------------------------------------------ canonical form
    def checkpoint_dict(self) -> dict[str, torch.Tensor]:
        """The module's checkpoint tensors (on their device), by leaf name, without bias."""
        return {leaf: getattr(self, attr) for leaf, attr in self.leaves().items() if leaf != "bias"}

    def bnb_weight(self) -> BnbWeight | BnbInt8Weight:
        """The canonical form of the buffers (validated; on the CPU)."""
        return bnb.from_checkpoint({k: v.cpu() for k, v in self.checkpoint_dict().items()}, self.scheme)

    def load_bnb(self, w: BnbWeight | BnbInt8Weight, bias: torch.Tensor | None = None) -> None:
        """Encode ``w`` into the checkpoint buffers, bit-exactly as bitsandbytes writes it."""
        state = bnb.to_checkpoint(w, self.scheme)
        if bias is not None:
            if self.bias is None:
                raise ValueError("bias given but the layer was built without one (bias=False)")
            if tuple(bias.shape) != (self.out_features,) or bias.dtype not in BIAS_DTYPES:
                raise ValueError(f"bias: expected a float16/bfloat16/float32 [{self.out_features}] tensor, got "
                                 f"{bias.dtype} shape {list(bias.shape)}")
            state["bias"] = bias.detach()
        self.load_state_dict(state, strict=True)

    def load_affine(self, q: object, bias: torch.Tensor | None = None) -> None:
        raise TypeError(f"{type(self).__name__} holds bitsandbytes codes; build it from a BnbWeight / BnbInt8Weight "
                        "(load_bnb)")

    def affine(self) -> object:
        raise TypeError(f"{type(self).__name__}: bitsandbytes weights have no integer-affine form; use bnb_weight()")

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [getattr(self, attr) for attr in self.leaves().values()]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight as bitsandbytes dequantizes it, rounded once to ``dtype`` (see ``BnbWeight.dequantize``)."""
        return self.bnb_weight().dequantize(dtype).to(self.weight.device)

    # ------------------------------------------------------------------ runtime
    def prepare(self) -> None:
        """Validate the buffers once; keep the float32 block absmax and the code table (4-bit)."""
        w = self.bnb_weight()
        device = self.weight.device
        if isinstance(w, BnbWeight):
            self._absmax = w.absmax_values().to(device)
            self._table = code_table(w.quant_type, device)
        super().prepare()

    def decode_rows(self, n0: int, n1: int, dtype: torch.dtype) -> torch.Tensor:
        """The weight of output rows ``n0:n1`` (``[n1 - n0, K]`` in ``dtype``) as bitsandbytes computes it: 4-bit,
        ``table[code] * absmax`` in float32 rounded once to ``dtype`` (as its ``matmul_4bit`` does); 8-bit,
        ``(q * SCB) * float32(1/127)`` in float32, then cast."""
        k = self.in_features
        if self.scheme.bits == 8:
            return int8_rows(self.weight[n0:n1], self.SCB[n0:n1]).to(dtype)
        start, stop = n0 * k, n1 * k
        values = self._table[bnb.unpack_flat(self.weight, start, stop).long()]
        bs = self.scheme.blocksize
        w = scale_blocks(values, self._absmax[start // bs:], bs, start)
        return w.reshape(n1 - n0, k).to(dtype)

    def tile_rows(self) -> int:
        return max(16, TILE_ELEMENTS // self.in_features // 16 * 16)
