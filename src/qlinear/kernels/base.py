"""The kernel base class: a declaration (``caps``), the reasons it cannot run a layer, and a lifecycle.

Lifecycle: checkpoint buffers are filled (by ``load_affine`` or by loading a state dict), then
``prepare()`` derives any kernel-private runtime tensors, then ``forward``. Runtime state is keyed
by the identity, version, device, dtype and shape of the checkpoint tensors it came from, so a
mutation, a move or a dtype change rebuilds it on the next forward instead of serving stale data.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import nn

from ..activations import ActQuant, quantize_dequantize
from ..affine import AffineWeight
from ..caps import Caps, Problem
from ..enums import BACKEND
from ..spec import Scheme
from ..target import Target

_PREPARE_LOCK = threading.RLock()


class RetiredKernelError(RuntimeError):
    """A backend the reference keeps only by name; its message says what to use instead."""


def tensor_key(t: torch.Tensor | None) -> tuple[object, ...]:
    """What identifies a tensor's current contents cheaply: storage, version, device, dtype, shape."""
    if t is None:
        return (None,)
    # Inference tensors keep no version counter; they cannot be mutated outside inference mode either.
    version = None if t.is_inference() else t._version
    return (t.untyped_storage().data_ptr(), version, t.device, t.dtype, tuple(t.shape))


class QuantLinear(nn.Module):
    """Base of every kernel. Subclasses set ``backend`` and ``caps`` and implement the layout hooks."""

    backend: ClassVar[BACKEND]
    caps: ClassVar[Caps]
    #: False for backends registered from the reference but not built yet; the selector says so.
    implemented: ClassVar[bool] = True
    #: A migration message for retired backends; construction and validation raise or report it.
    retired: ClassVar[str | None] = None
    #: Can hf_pack_layer pack raw quantizer outputs into this kernel (False: load or repack only).
    raw_packing: ClassVar[bool] = True
    #: Set by kernels that drop their checkpoint tensors after prepare(); such a layer cannot be repacked.
    checkpoint_released: bool = False

    # ---------------------------------------------------------------- declaration and validation
    @classmethod
    def reasons(cls, problem: Problem, target: Target) -> list[str]:
        """Every reason this kernel cannot run ``problem`` on ``target``; ``[]`` when it can."""
        if cls.retired:
            return [f"retired: {cls.retired}"]
        out = [] if cls.implemented else ["not implemented yet"]
        out += cls.caps.reasons(problem, target)
        out += cls.runtime_reasons(problem, target)
        return out

    @classmethod
    def target_reasons(cls, target: Target) -> list[str]:
        """Reasons this kernel cannot run any layer on ``target`` (for ``qlinear backends``)."""
        if cls.retired:
            return [f"retired: {cls.retired}"]
        out = [] if cls.implemented else ["not implemented yet"]
        return out + cls.caps.target_reasons(target) + cls.runtime_target_reasons(target)

    @classmethod
    def auto_reasons(cls, problem: Problem, target: Target) -> list[str]:
        """Reasons AUTO passes this kernel over although an explicit request may use it (e.g. it would
        silently compute a float32 layer in bfloat16)."""
        return []

    @classmethod
    def realises(cls, act: ActQuant) -> bool:
        """Does this kernel multiply activations quantized as ``act`` natively? Those it does not get
        ``activations.quantize_dequantize`` on their inputs first (a forward pre-hook), so every kernel
        computes what a W8A8 / W4A4 checkpoint means."""
        return False

    @classmethod
    def describe_runs(cls, problem: Problem, target: Target) -> str:
        """How this kernel would run ``problem`` on ``target`` (its paths by batch size, what an optional
        extra would change), for ``explain()``; empty when there is one path and nothing to add."""
        return ""

    @classmethod
    def runtime_target_reasons(cls, target: Target) -> list[str]:
        """Kernel-specific facts about the target alone (CPU flags, exact device checks); also part of
        ``runtime_reasons`` by default."""
        return []

    @classmethod
    def runtime_reasons(cls, problem: Problem, target: Target) -> list[str]:
        """Kernel-specific checks beyond the declaration (shape rules, exact-device facts)."""
        return cls.runtime_target_reasons(target)

    # ---------------------------------------------------------------- construction
    def __init__(self, scheme: Scheme, bias: bool = False, dtype: torch.dtype = torch.float16) -> None:
        if self.retired:
            raise RetiredKernelError(f"{type(self).__name__}: {self.retired}")
        if not self.implemented:
            raise NotImplementedError(f"{type(self).__name__} ({self.backend.value}) is declared but not implemented "
                                      "yet; `qlinear explain` lists the backends that can run this layer")
        super().__init__()
        self.scheme = scheme
        self.dtype = dtype
        self.choice = None  # set by build.create_layer(): the selector's Choice, for explain()
        self._runtime_key: tuple[object, ...] | None = None
        self.register_checkpoint_buffers(bias)
        act = scheme.activations
        if act is not None:
            for name in act.tensor_names:  # calibrated activation scales the checkpoint stores with the layer
                self.register_buffer(name, torch.ones(1, dtype=torch.float32))
            if not self.realises(act):
                self.register_forward_pre_hook(_quantize_inputs)

    @property
    def in_features(self) -> int:
        return self.scheme.in_features

    @property
    def out_features(self) -> int:
        return self.scheme.out_features

    def extra_repr(self) -> str:
        s = self.scheme
        return (f"in_features={s.in_features}, out_features={s.out_features}, bits={s.bits}, "
                f"group_size={-1 if s.channelwise else s.group_size}, sym={s.sym}, desc_act={s.desc_act}, "
                f"format={s.format.value}, backend={self.backend.value}")

    # ---------------------------------------------------------------- layout hooks (subclasses)
    def register_checkpoint_buffers(self, bias: bool) -> None:
        """Register the checkpoint-layout buffers (zero-filled) for ``self.scheme``."""
        raise NotImplementedError

    def load_affine(self, q: AffineWeight, bias: torch.Tensor | None = None) -> None:
        """Encode the canonical weight into the checkpoint buffers, bit-exactly as the format writes it."""
        raise NotImplementedError

    def check_fits(self, q: AffineWeight) -> None:
        """Raise ``ValueError`` unless ``q`` has this layer's shape, bit width and group size."""
        s = self.scheme
        if (q.out_features, q.in_features) != (s.out_features, s.in_features):
            raise ValueError(f"weight: expected shape [{s.out_features}, {s.in_features}] for this layer, "
                             f"got [{q.out_features}, {q.in_features}]")
        if q.bits != s.bits:
            raise ValueError(f"weight: layer is {s.bits}-bit but the codes are {q.bits}-bit")
        if min(q.group_size, s.in_features) != s.group_size:
            raise ValueError(f"weight: layer has group size {s.group_size} but the weight {q.group_size}")

    def write_checkpoint(self, values: Mapping[str, torch.Tensor], bias: torch.Tensor | None = None) -> None:
        """Copy checkpoint-named ``values`` into their buffers (dotted names reach sub-modules) and ``bias`` into
        ``bias``, every shape checked before anything is written; the runtime state is rebuilt at the next forward."""
        targets = {name: self.get_buffer(name) for name in values}
        for name, buf in targets.items():
            if tuple(buf.shape) != tuple(values[name].shape):
                raise ValueError(f"{name}: expected shape {tuple(buf.shape)}, got {tuple(values[name].shape)}")
        if bias is not None:
            if self.bias is None:
                raise ValueError("bias given but the layer was built without one (bias=False)")
            if tuple(bias.shape) != (self.out_features,):
                raise ValueError(f"bias: expected shape [{self.out_features}], got {tuple(bias.shape)}")
        with torch.no_grad():
            for name, buf in targets.items():
                buf.copy_(values[name])
            if bias is not None:
                self.bias.copy_(bias.detach().to(self.bias.dtype))
        self._runtime_key = None

    def affine(self) -> AffineWeight:
        """Decode the checkpoint buffers to the canonical form (true zeros, ``[N, G]`` scales)."""
        raise NotImplementedError

    def _load_from_state_dict(self, state_dict: dict[str, object], prefix: str, *args: object,
                              **kwargs: object) -> None:
        act = self.scheme.activations
        if act is not None:
            adopt_dtypes(self, state_dict, prefix, act.tensor_names, (torch.float32, torch.bfloat16, torch.float16))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def checkpoint_tensors(self) -> list[torch.Tensor | None]:
        """The tensors runtime state is derived from (their identity keys the runtime cache)."""
        return [b for _, b in self.named_buffers(recurse=False)]

    # ---------------------------------------------------------------- lifecycle
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight ``[out_features, in_features]`` (a fresh tensor; nothing is kept)."""
        return self.affine().dequantize(dtype).to(self.checkpoint_tensors()[0].device)

    def prepare(self) -> None:
        """Derive kernel-private runtime tensors from the checkpoint buffers (the reference's post_init)."""
        self._runtime_key = self._current_key()

    def _current_key(self) -> tuple[object, ...]:
        return tuple(tensor_key(t) for t in self.checkpoint_tensors())

    def ensure_prepared(self) -> None:
        """Re-run ``prepare()`` if the checkpoint tensors changed, moved or changed dtype since the last one.

        Threads that meet a stale layer together prepare it once: the check is repeated under a lock (one for the
        process: preparation is rare, and a lock on the module would not survive ``copy.deepcopy``)."""
        if self._runtime_key != self._current_key():
            with _PREPARE_LOCK:
                if self._runtime_key != self._current_key():
                    self.prepare()

    def check_input(self, x: torch.Tensor, device_type: str | None = None) -> None:
        """Raise ``ValueError`` unless ``x`` has ``in_features`` last, a declared dtype (and the device type)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input: expected last dimension {self.in_features} (in_features), "
                             f"got shape {tuple(x.shape)}")
        if x.dtype not in self.caps.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.caps.dtypes))
            raise ValueError(f"input: dtype {x.dtype} not supported; expected {names}")
        if device_type is not None and x.device.type != device_type:
            raise ValueError(f"input: on {x.device}; {type(self).__name__} runs on {device_type} tensors only")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _quantize_inputs(layer: QuantLinear, args: tuple[object, ...]) -> tuple[object, ...]:
    """Forward pre-hook: the layer's inputs as its checkpoint's activation quantization sees them."""
    x, *rest = args
    act = layer.scheme.activations
    return (quantize_dequantize(x, act, getattr(layer, "input_scale", None),
                                getattr(layer, "input_global_scale", None)), *rest)


def adopt_dtypes(module: nn.Module, state_dict: dict[str, object], prefix: str, names: tuple[str, ...],
                 allowed: tuple[torch.dtype, ...]) -> None:
    """Before a state-dict load: let buffers ``names`` take the incoming tensor's dtype where it is in ``allowed``,
    so loading keeps a checkpoint's bfloat16 / float32 values instead of rounding them into the default dtype."""
    for name in names:
        t, mine = state_dict.get(prefix + name), getattr(module, name, None)
        if isinstance(t, torch.Tensor) and isinstance(mine, torch.Tensor) and t.dtype in allowed \
                and t.dtype != mine.dtype:
            setattr(module, name, torch.zeros_like(mine, dtype=t.dtype))


class PlannedKernel(QuantLinear):
    """A backend the reference has and qlinear declares, but has not built yet."""

    implemented: ClassVar[bool] = False
