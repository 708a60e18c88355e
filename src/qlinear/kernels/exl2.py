"""``Exl2TorchLinear``: ExLlamaV2's EXL2 mixed-bit layers, decoded exactly in column tiles on any device.

The buffers are the checkpoint's tensors (``q_weight``, ``q_invperm``, ``q_scale``, ``q_scale_max``,
``q_groups``, optional ``q_perm`` and ``bias``) and stay packed; each forward gathers the input columns into
stored row order once (``x[:, q_perm]``, ``q_perm = argsort(q_invperm)`` as exllamav2's loader derives it),
then decodes a tile of output columns at a time exactly as exllamav2's ``reconstruct_kernel`` writes them
(float16, ``layouts/exl2.py``) and multiplies it in. exllamav2's own CUDA extension is not built or called.
"""

from __future__ import annotations

import torch

from ..affine import AffineWeight
from ..caps import Caps
from ..enums import ALL_DEVICES, BACKEND, FORMAT
from ..layouts import exl2
from ..spec import Scheme
from .base import QuantLinear

#: Decoded values per column tile: cache-sized on CPU; on a GPU larger tiles (fewer, bigger launches: a tile is
#: about 30 small kernels per run of one bit width).
TILE_ELEMENTS = 1 << 18
TILE_ELEMENTS_CUDA = 1 << 24


def exl2_params(scheme: Scheme) -> exl2.Exl2Params:
    """The scheme's ``Exl2Params``; raises ``ValueError`` naming what is there instead."""
    p = scheme.layout_params
    if not isinstance(p, exl2.Exl2Params):
        raise ValueError(f"layout_params: an EXL2 layer needs Exl2Params, got {type(p).__name__}")
    if p.in_features != scheme.in_features:
        raise ValueError(f"layout_params: groups cover {p.in_features} input rows but in_features is "
                         f"{scheme.in_features}")
    return p


class Exl2TorchLinear(QuantLinear):
    """EXL2 (2/3/4/5/6/8-bit row groups, 4-bit scale codes, act-order permutation), exact, any device."""

    backend = BACKEND.EXL2_TORCH
    caps = Caps(
        formats={FORMAT.EXL2: 10},
        bits=frozenset(exl2.BITS),  # Scheme.bits: the widest group; Exl2Params holds every group's width
        group_sizes=None,  # EXL2 groups vary in length per layer (Exl2Params.group_rows)
        desc_act=None,
        sym=None,
        devices=ALL_DEVICES,
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}),
        pack_dtypes=frozenset({torch.int32}),
        out_divisible=8,  # q_scale packs 8 scale codes per int32 along N
    )
    raw_packing = False

    def register_checkpoint_buffers(self, bias: bool) -> None:
        p = exl2_params(self.scheme)
        if self.out_features % 8:
            raise ValueError(f"out_features: {self.out_features} is not a multiple of 8 (q_scale packs 8 per word)")
        for name, (shape, dtype) in exl2.checkpoint_shapes(p, self.out_features).items():
            self.register_buffer(name, torch.zeros(shape, dtype=dtype))
        self.q_groups.copy_(p.q_groups())
        self.q_invperm.copy_(torch.arange(self.in_features, dtype=torch.int32))
        self.register_buffer("bias", torch.zeros(self.out_features, dtype=torch.float16) if bias else None)
        self.register_buffer("_perm", None, persistent=False)
        self.register_buffer("_scales", None, persistent=False)
        self.register_buffer("_groups", None, persistent=False)

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        for name in ("q_invperm", "q_perm"):  # exllamav2 writes int32; int16 copies (its loader's) are accepted
            t = state_dict.get(prefix + name)
            if isinstance(t, torch.Tensor) and t.dtype in (torch.int16, torch.int64) and hasattr(self, name):
                wide = t.to(torch.int64)
                state_dict[prefix + name] = (wide & 0xFFFF if t.dtype == torch.int16 else wide).to(torch.int32)
        t = state_dict.get(prefix + "bias")
        if isinstance(t, torch.Tensor) and self.bias is not None and t.dtype != self.bias.dtype:
            self.bias = torch.zeros_like(self.bias, dtype=t.dtype)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The checkpoint tensors of this layer (without bias)."""
        names = exl2.checkpoint_shapes(exl2_params(self.scheme), self.out_features)
        return {n: getattr(self, n) for n in names}

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        raise ValueError("EXL2 weights are not affine integer codes with free scales: load an EXL2 checkpoint")

    def affine(self) -> AffineWeight:
        raise ValueError("EXL2 layers have no exact AffineWeight form (float16 products of 4-bit scale codes); "
                         "use dequantize()")

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return exl2.dequantize(self.tensors(), exl2_params(self.scheme), self.out_features).to(dtype)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        return [*self.tensors().values(), self.bias]

    def prepare(self) -> None:
        """Check the tensors once, then keep ``q_perm`` (int64), the float16 group scales ``[G, N]`` and each stored
        row's group (so a forward makes no host round trip: it can be captured in a CUDA graph)."""
        p = exl2_params(self.scheme)
        t = self.tensors()
        exl2.check_tensors(t, p, self.out_features)
        self._perm = torch.argsort(self.q_invperm.to(torch.int64))
        self._scales = exl2.row_scales(self.q_scale, self.q_scale_max, self.out_features)
        self._groups = exl2.row_groups(p).to(t["q_weight"].device)
        super().prepare()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.in_features, self.out_features
        self.check_input(x)
        self.ensure_prepared()
        p = exl2_params(self.scheme)
        x2 = x.reshape(-1, k)[:, self._perm]
        y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
        tile = TILE_ELEMENTS_CUDA if x.device.type == "cuda" else TILE_ELEMENTS
        step = max(8, tile // k // 8 * 8)
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            w = exl2.decode_group_cols(self.q_weight, p, self._scales, n0, n1, self._groups).to(x.dtype)
            torch.matmul(x2, w, out=y[:, n0:n1])
        if self.bias is not None:
            y += self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], n)


KERNELS = (Exl2TorchLinear,)
