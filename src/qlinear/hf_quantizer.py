"""qlinear as a transformers quantizer: ``AutoModelForCausalLM.from_pretrained(path, quantization_config=
QlinearConfig(...))`` serves a GPTQ / AWQ / compressed-tensors / FP8 / bitsandbytes / QQQ ... checkpoint's
quantized linear layers with qlinear kernels.

``register()`` (an explicit call; importing this module changes nothing) adds the ``"qlinear"`` method to
transformers' quantizer and config registries, and lets a ``QlinearConfig`` passed by the caller take over a
checkpoint whose config.json names its own method (transformers otherwise refuses a config class other than the
one the checkpoint names); the checkpoint's own config is kept on ``QlinearConfig.checkpoint_config``.

Why the layers are built after transformers' weight loading, through ``checkpoint.load.load_plan``, rather than
filled by transformers' loader: a kernel's buffers are not always the stored tensors (layouts no kernel here runs
are re-encoded at load, e.g. AWQ gemv on a CPU), bitsandbytes' quantization-state leaves hold dots
(``weight.absmax``) that cannot be buffer names, transformers casts every floating tensor to the model dtype on
the way in (stored float16 scales must stay as stored), and the plan checks every tensor against the config and
names what does not fit before anything is read. So before loading, each quantized module becomes a stateless
placeholder and its tensors are declared expected-but-unused; transformers loads everything else (embeddings,
norms, a float head); after loading, the placeholders are replaced by prepared qlinear layers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

try:
    from transformers.quantizers import auto as _auto
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin
except ImportError as err:  # pragma: no cover - the hf extra is optional
    raise ImportError("qlinear.hf_quantizer needs transformers: pip install 'qlinear[hf]' and pip install "
                      "--no-deps -r requirements/nodeps-hf.txt") from err

from .enums import BACKEND
from .select import parse_dtype

METHOD_NAME = "qlinear"

__all__ = ["METHOD_NAME", "QlinearConfig", "QlinearHfQuantizer", "register", "registered", "unregister"]


class QlinearConfig(QuantizationConfigMixin):
    """Serve a quantized checkpoint's linear layers with qlinear kernels.

    ``backend``: a qlinear backend name or ``"auto"`` (the selector picks per layer). ``dtype``: the activation
    dtype of every kernel and of the float modules (None: transformers' own choice, ``dtype=`` or config.json's).
    ``device``: where the qlinear layers are built (None: the one device of ``from_pretrained``'s ``device_map``,
    else the CPU). ``checkpoint_config``: the checkpoint's own quantization_config, filled in on load (kept for
    reference; the layers are planned from the checkpoint's files). ``quant_method`` is there for ``from_dict``.
    """

    def __init__(self, backend: BACKEND | str = "auto", dtype: torch.dtype | str | None = None,
                 device: torch.device | str | None = None, checkpoint_config: Mapping[str, Any] | None = None,
                 quant_method: str = METHOD_NAME) -> None:
        if quant_method != METHOD_NAME:
            raise ValueError(f"quant_method: a QlinearConfig is {METHOD_NAME!r}, got {quant_method!r}")
        self.quant_method = METHOD_NAME
        self.backend = str(BACKEND(backend).value)  # an unknown name raises here, listing the known ones
        self.dtype = None if dtype is None else str(parse_dtype(dtype)).removeprefix("torch.")
        self.device = None if device is None else str(torch.device(device))
        self.checkpoint_config = None if checkpoint_config is None else dict(checkpoint_config)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        return None if self.dtype is None else getattr(torch, self.dtype)


class _Pending(nn.Module):
    """Stands where a quantized linear layer goes until ``_process_model_after_weight_loading`` builds it."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"{self.name}: its qlinear layer was never built (the model did not finish loading)")


class QlinearHfQuantizer(HfQuantizer):
    """Replaces the checkpoint's quantized ``nn.Linear`` modules by prepared qlinear layers (see module doc)."""

    requires_calibration = False
    quantization_config: QlinearConfig

    def __init__(self, quantization_config: QlinearConfig, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self.plan: Any = None
        self.dtype: torch.dtype | None = quantization_config.torch_dtype
        self.device = torch.device("cpu")

    def update_dtype(self, dtype: torch.dtype) -> torch.dtype:
        self.dtype = self.quantization_config.torch_dtype or dtype
        return self.dtype

    def _process_model_before_weight_loading(self, model: nn.Module, checkpoint_files: list[str] | None = None,
                                             device_map: Mapping[str, Any] | None = None,
                                             **kwargs: Any) -> nn.Module:
        from .checkpoint.plan import plan_checkpoint
        from .checkpoint.safetensors_io import CheckpointError
        from .model import set_submodule

        if not checkpoint_files:
            raise CheckpointError("qlinear serves pre-quantized safetensors checkpoints: from_pretrained found no "
                                  "checkpoint files (a .gguf file goes through qlinear.hf_model.from_pretrained)")
        root = Path(checkpoint_files[0]).parent
        self.device = _layer_device(self.quantization_config.device, device_map)
        with torch.device("cpu"):  # transformers builds the skeleton under a meta-device context
            self.plan = plan = plan_checkpoint(root)
            _check_kernels(plan, self.dtype or torch.get_default_dtype(), self.device,
                           self.quantization_config.backend)
        modules = dict(model.named_modules())
        for name in plan.modules:
            if not isinstance(modules.get(name), nn.Linear):
                found = "no such module" if name not in modules else type(modules[name]).__name__
                raise CheckpointError(f"{root}: quantized module {name} is not an nn.Linear of the "
                                      f"{type(model).__name__} model ({found}); qlinear.hf_model.from_pretrained "
                                      "serves quantized embeddings dense")
        for name in plan.modules:
            set_submodule(model, name, _Pending(name))
        ignore = {rf"^{re.escape(name)}\." for name in plan.modules}  # their tensors are read after loading
        ignore |= {rf"^{re.escape(key)}$" for key in plan.unused}  # e.g. KV-cache scales no layer here uses
        model._keys_to_ignore_on_load_unexpected = set(model._keys_to_ignore_on_load_unexpected or ()) | ignore
        return model

    def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        from .checkpoint.load import load_plan
        from .model import set_submodule

        dtype = self.dtype or torch.get_default_dtype()
        for name, layer in load_plan(self.plan, self.device, dtype, self.quantization_config.backend).items():
            set_submodule(model, name, layer)
        self.plan = None  # headers only, but nothing to keep once built
        return model.eval()

    def is_serializable(self) -> bool:
        """qlinear layers are saved with ``qlinear.checkpoint.save_checkpoint``, not ``save_pretrained``."""
        return False

    @property
    def is_trainable(self) -> bool:
        return False


def _layer_device(device: str | None, device_map: Mapping[str, Any] | str | None) -> torch.device:
    """Where the qlinear layers go: ``QlinearConfig.device``, else the one device of ``device_map``, else the CPU
    (transformers' own default)."""
    if device is not None:
        return torch.device(device)
    if device_map is None:
        return torch.device("cpu")
    places = set(device_map.values()) if isinstance(device_map, Mapping) else {device_map}
    if len(places) != 1 or next(iter(places)) in ("auto", "balanced", "balanced_low_0", "sequential", "disk"):
        raise ValueError(f"device_map {device_map!r}: qlinear layers go on one device; name it with "
                         "QlinearConfig(device=...) or device_map={'': device}")
    place = next(iter(places))
    return torch.device(place) if not isinstance(place, int) else torch.device("cuda", place)


def _check_kernels(plan: Any, dtype: torch.dtype, device: torch.device, backend: str) -> None:
    """Fail before transformers reads any weight when a module has no kernel here (the selector's table)."""
    from .checkpoint.repack import choose
    from .checkpoint.safetensors_io import CheckpointError
    from .select import NoKernelError
    from .target import Target

    target = Target.here(device)
    for name, mp in plan.modules.items():
        try:
            choose(mp.scheme, dtype, target, backend)
        except NoKernelError as err:
            raise CheckpointError(f"{name}: {err}") from err


def _merge(cls: type, quantization_config: Any, quantization_config_from_args: Any) -> Any:
    """transformers' merge of config.json's quantization_config with the caller's, except that a caller's
    ``QlinearConfig`` wins (transformers would refuse its class), keeping the checkpoint's config on it."""
    if isinstance(quantization_config_from_args, QlinearConfig):
        stored = quantization_config if isinstance(quantization_config, Mapping) else quantization_config.to_dict()
        quantization_config_from_args.checkpoint_config = dict(stored)
        return quantization_config_from_args
    return _ORIGINAL_MERGE.__func__(cls, quantization_config, quantization_config_from_args)


_ORIGINAL_MERGE: Any = _auto.AutoHfQuantizer.__dict__["merge_quantization_configs"]


def registered() -> bool:
    """Whether ``register()`` is in effect."""
    return _auto.AUTO_QUANTIZER_MAPPING.get(METHOD_NAME) is QlinearHfQuantizer


def register() -> None:
    """Make ``quantization_config=QlinearConfig(...)`` work in transformers' ``from_pretrained`` (idempotent)."""
    if registered():
        return
    _auto.register_quantization_config(METHOD_NAME)(QlinearConfig)
    _auto.register_quantizer(METHOD_NAME)(QlinearHfQuantizer)
    _auto.AutoHfQuantizer.merge_quantization_configs = classmethod(_merge)


def unregister() -> None:
    """Undo ``register()``: transformers' registries and merge as they were."""
    if _auto.AUTO_QUANTIZER_MAPPING.get(METHOD_NAME) is QlinearHfQuantizer:
        del _auto.AUTO_QUANTIZER_MAPPING[METHOD_NAME]
    if _auto.AUTO_QUANTIZATION_CONFIG_MAPPING.get(METHOD_NAME) is QlinearConfig:
        del _auto.AUTO_QUANTIZATION_CONFIG_MAPPING[METHOD_NAME]
    _auto.AutoHfQuantizer.merge_quantization_configs = _ORIGINAL_MERGE
