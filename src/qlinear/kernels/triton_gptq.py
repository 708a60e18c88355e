"""Triton GPU kernels for GPTQ (``TritonV2Linear``), and the runtime machinery the AWQ class shares.

``prepare()`` derives a kernel-private layout from the canonical weight (``self.affine()``), so any
family whose checkpoint decodes to AffineWeight runs the same kernels: codes sorted by group and
packed along K in int32 words, ``[G, N]`` scales, uint8 zeros (or a compile-time constant) and an
activation gather for act-order (see ``triton/layout.py``). It lives in non-persistent buffers, so
``state_dict`` stays the checkpoint layout. Each forward picks a variant and config from M (rows of
the flattened input): split-K GEMV, skinny split-K ``tl.dot``, tiled GEMM, or dequant + cuBLAS for
large M (``triton/configs.py``; a shipped table, else a heuristic, never a run-time autotune).

``release_checkpoint=True`` (or ``layer.release_checkpoint()``) drops the checkpoint tensors after
prepare to halve resident memory; the layer then refuses to save, repack or re-derive its weight.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable
from typing import Any

import torch

from ..affine import AffineWeight
from ..caps import Problem
from ..spec import Scheme
from ..target import Target
from .gptq_base import GPTQQuantLinear
from .planned.triton import TritonV2Linear as _Declared
from .triton.runtime import interpreting

RUNTIME = ("_rt_qweight", "_rt_scales", "_rt_zeros", "_rt_perm", "_rt_offsets", "_rt_supers", "_rt_xorder",
           "_rt_lock")
MIN_TRITON = (3, 2)


@functools.cache
def device_facts(index: int) -> tuple[str, int]:
    """(name, SM count) of one CUDA device: keys the tuned table and sizes split-K."""
    props = torch.cuda.get_device_properties(index)
    return props.name, props.multi_processor_count


#: variants with limits of their own (bits, field blocks, dtype, compute capability) beyond the layer's declaration
FITTED = ("gemv_tc", "skinny3", "gemm5", "gemm4", "gemm3")


def tc_unfit(p: Any, m: int, dtype: torch.dtype, device: torch.device) -> list[str]:
    """Why the tensor-core GEMV (``gemv_tc``) cannot take this call, which M alone would give it."""
    from .triton.qmv_tc import capability, tc_reasons

    return tc_reasons(p, m, dtype, capability(device))


def unfit_variants(p: Any, m: int, dtype: torch.dtype, device: torch.device) -> dict[str, str]:
    """The variants M alone could give a call on layout ``p`` that its words, dtype or device rule out, with why."""
    from .triton.gemm4_limits import gemm4_reasons
    from .triton.qmm3 import skinny3_reasons
    from .triton.qmv_tc import capability

    cap = capability(device)
    reasons = {"gemv_tc": tc_unfit(p, m, dtype, device)}
    reasons |= {v: gemm4_reasons(p, m, dtype, cap, v) for v in ("gemm5", "gemm4")}
    reasons |= {v: skinny3_reasons(p, m, dtype, v, cap) for v in ("skinny3", "gemm3")}
    return {v: "; ".join(why) for v, why in reasons.items() if why}


def fitted_config(p: Any, m: int, dtype: torch.dtype, device: torch.device, variant: str | None = None,
                  exclude: tuple[str, ...] = ()) -> Any:
    """The launch config for M rows of layout ``p`` on ``device``: the table's (or heuristic's) choice among the
    variants not in ``exclude``, the same choice among the rest where the layout cannot run it, legalised."""
    from .triton.configs import choose, legal

    name, sms = device_facts(device.index or 0) if device.type == "cuda" else ("interpreter", 4)
    cfg = choose(name, sms, m, p.n, p.k, p.bits, p.group, variant, exclude=exclude)
    if variant is None and cfg.variant in FITTED:  # chosen by M and shape; this layer may not fit it
        unfit = tuple(unfit_variants(p, m, dtype, device))
        if cfg.variant in unfit:  # the same choice among the rest (fastest timed, else the crossovers)
            cfg = choose(name, sms, m, p.n, p.k, p.bits, p.group, exclude=(*exclude, *unfit))
    return legal(cfg, m, p.kp, p.bits)


def triton_rows(layer: Any, x: torch.Tensor, weight: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``x`` as ``[M, K]`` rows with unit column stride for the Triton kernels: checked to be on CUDA (or on the CPU
    under the interpreter) and on the device of ``weight()`` (a runtime tensor, read after the layer is prepared)."""
    if x.device.type != "cuda" and not interpreting():
        raise ValueError(f"input: {type(layer).__name__} runs on CUDA tensors, got one on {x.device} "
                         "(TRITON_INTERPRET=1 runs the kernels on CPU tensors, for testing)")
    layer.ensure_prepared()
    if weight().device != x.device:
        raise ValueError(f"input on {x.device} but the layer is on {weight().device}")
    x2 = x.reshape(-1, layer.in_features)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def triton_version_reasons(target: Target) -> list[str]:
    """A too-old triton on the live machine (fake targets answer only whether it is importable)."""
    if target.modules is not None or not target.has_module("triton"):
        return []
    try:
        version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return []
    parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
    if parts < MIN_TRITON:
        return [f"triton {version} is older than {'.'.join(map(str, MIN_TRITON))}: pip install 'triton>=3.4'"]
    return []


class _QuantMatmul(torch.autograd.Function):
    """Gradient for the activations only (weights are packed buffers): ``dx = dy @ W`` via a transient W."""

    @staticmethod
    def forward(ctx: Any, x2: torch.Tensor, layer: TritonQuantMixin) -> torch.Tensor:
        ctx.layer = layer
        return layer.matmul(x2)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[torch.Tensor, None]:
        from .triton.dequant import dense_t

        w_t = dense_t(ctx.layer.packed(), gy.dtype)
        return gy @ w_t.t(), None


class TritonQuantMixin:
    """Runtime layout, variant dispatch, checkpoint release; mixed in before a checkpoint-layout base."""

    checkpoint_released: bool = False
    release_on_prepare: bool = False

    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16,
                 release_checkpoint: bool = False) -> None:
        super().__init__(scheme, bias=bias, dtype=dtype)  # type: ignore[call-arg]
        self.release_on_prepare = release_checkpoint
        self._rt_meta: tuple[int, ...] | None = None
        for name in RUNTIME:
            self.register_buffer(name, None, persistent=False)

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        return triton_version_reasons(target)

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        return cls.runtime_target_reasons(target)

    # ------------------------------------------------------------------ checkpoint <-> runtime
    def checkpoint_names(self) -> list[str]:
        """Persistent buffers other than bias: what the checkpoint layout holds and release drops."""
        return [n for n in self._buffers if n not in self._non_persistent_buffers_set and n != "bias"]

    def affine(self) -> AffineWeight:
        if self.checkpoint_released:
            raise RuntimeError(f"{type(self).__name__}: checkpoint tensors were released after prepare; "
                               "reload the layer from its checkpoint to read its weight")
        return super().affine()  # type: ignore[misc]

    def prepare(self) -> None:
        """Build the runtime layout from the canonical weight, on the checkpoint tensors' device."""
        if self.checkpoint_released:
            return
        from .triton.layout import build
        from .triton.qmm import lock_slots

        q = self.affine()
        device = self.scales.device
        p = build(q.codes, q.scales, q.zeros, q.g_idx, q.bits, scale_dtype=self.scales.dtype)
        for name, t in p.tensors().items():
            self.register_buffer(f"_rt_{name}", None if t is None else t.to(device), persistent=False)
        self.register_buffer("_rt_lock", torch.zeros(lock_slots(p.n), dtype=torch.int32, device=device),
                             persistent=False)
        self._rt_meta = p.meta()
        super().prepare()  # type: ignore[misc]
        if self.release_on_prepare:
            self.release_checkpoint()

    def ensure_prepared(self) -> None:
        if not self.checkpoint_released:
            super().ensure_prepared()  # type: ignore[misc]

    def release_checkpoint(self) -> None:
        """Drop the checkpoint tensors, keeping only the runtime layout (and bias)."""
        self.ensure_prepared()
        for name in self.checkpoint_names():
            setattr(self, name, None)
        self.checkpoint_released = True

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        if self.checkpoint_released:
            raise RuntimeError(f"{type(self).__name__} ({prefix or 'layer'}): checkpoint tensors were released "
                               "after prepare and the runtime layout is private; saving would not be a "
                               "checkpoint. Reload the layer from its checkpoint (without release_checkpoint)")
        super()._save_to_state_dict(destination, prefix, keep_vars)  # type: ignore[misc]

    def packed(self) -> Any:
        """The runtime layout as the launchers take it (views of this module's buffers)."""
        from .triton.layout import Packed

        if self._rt_meta is None:
            raise RuntimeError(f"{type(self).__name__}: prepare() has not run")
        return Packed(self._rt_qweight, self._rt_scales, self._rt_zeros, self._rt_perm, *self._rt_meta,
                      offsets=self._rt_offsets, xorder=self._rt_xorder)

    # ------------------------------------------------------------------ forward
    def unfit_variants(self, m: int, device: torch.device) -> dict[str, str]:
        """The variants M alone could give this call that this layer, dtype or device cannot run, with why."""
        return unfit_variants(self.packed(), m, self.dtype, device)

    def explain_call(self, m: int, device: torch.device | str = "cuda") -> str:
        """Which Triton variant and config a forward of M rows runs on ``device``, on what evidence, and why
        each other variant does not (``cpu``: the interpreter's view, without the device's table)."""
        from .triton.why import explain_choice

        self.ensure_prepared()
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("explain_call: no CUDA device here; device='cpu' gives the interpreter's view")
        name, sms = device_facts(device.index or 0) if device.type == "cuda" else ("interpreter", 4)
        bits, k, n, group = self._rt_meta[:4]  # type: ignore[index]
        return "\n".join(explain_choice(name, sms, m, n, k, self.packed().kp, bits, group,
                                         self.unfit_variants(m, device)))

    def config_for(self, m: int, device: torch.device, variant: str | None = None) -> Any:
        """The launch config for M rows on ``device`` (table entry or heuristic, then legalised)."""
        return fitted_config(self.packed(), m, self.dtype, device, variant)

    def matmul(self, x2: torch.Tensor, variant: str | None = None, config: Any = None) -> torch.Tensor:
        """``x2 [M, K] @ W^T + bias`` with the chosen (or given) variant/config."""
        from .triton.dequant import dense_mm
        from .triton.qmm import qmm

        cfg = config or self.config_for(x2.shape[0], x2.device, variant)
        if cfg.variant == "dense":
            return dense_mm(x2, self.packed(), cfg, self.bias)
        return qmm(x2, self.packed(), cfg, self.bias, self._rt_lock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, n = self.in_features, self.out_features  # type: ignore[attr-defined]
        if x.shape[-1] != k:
            raise ValueError(f"input: expected last dimension {k} (in_features), got shape {tuple(x.shape)}")
        if x.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"input: dtype {x.dtype} not supported; expected float16 or bfloat16")
        x2 = triton_rows(self, x, lambda: self._rt_qweight)
        y = _QuantMatmul.apply(x2, self) if torch.is_grad_enabled() and x2.requires_grad else self.matmul(x2)
        return y.reshape(*x.shape[:-1], n)


class TritonV2Linear(TritonQuantMixin, GPTQQuantLinear):
    """GPTQ packed qweight/qzeros/scales/g_idx run by Triton kernels; the runtime layout is private."""

    backend = _Declared.backend
    caps = _Declared.caps


KERNELS = (TritonV2Linear,)
