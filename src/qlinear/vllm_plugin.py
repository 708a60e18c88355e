"""qlinear kernels behind vLLM's quantization-plugin interface (a sketch: GPTQ and AWQ GEMM checkpoints).

vLLM builds each linear layer (``ReplicatedLinear``, ``ColumnParallelLinear``, ``MergedColumnParallelLinear``,
``QKVParallelLinear``, ``RowParallelLinear``) from its tensor-parallel shard sizes and asks the model's
``QuantizationConfig.get_quant_method(layer, prefix)`` for a ``LinearMethodBase``, which

* ``create_weights`` registers the shard's checkpoint tensors as parameters of the stored shape and dtype, each
  tagged with the dims vLLM's weight loaders slice (``input_dim``, ``output_dim``, ``packed_dim`` with
  ``pack_factor``) and the layer's ``weight_loader``;
* ``process_weights_after_loading`` turns the filled parameters into a prepared qlinear layer (the selector
  picks the kernel for the layer's device and dtype; its explain table is the error when none fits);
* ``apply`` runs that layer on the activations.

Nothing imports vLLM at import time: ``register()`` looks its base classes up (or takes a ``VllmInterface`` of
stand-ins, as the tests do) and registers the config under the name ``"qlinear"``. docs/serving.md has the
contract and the limits. vLLM slices the stored tensors itself here; ``qlinear.parallel`` is qlinear's own
tensor parallelism, which cuts built layers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .enums import BACKEND, FORMAT, METHOD
from .parallel.shard import ShardError
from .spec import QuantizeConfig, Scheme

NAME = "qlinear"
#: Stored layouts this plugin shards: the packed tensors split on whole words along vLLM's dims.
FORMATS = {METHOD.GPTQ: (FORMAT.GPTQ, FORMAT.GPTQ_V2), METHOD.AWQ: (FORMAT.GEMM,)}

__all__ = ["FORMATS", "NAME", "ParamSpec", "ShardError", "VllmInterface", "register", "shard_params",
           "vllm_interface"]


@dataclass(frozen=True)
class VllmInterface:
    """The parts of vLLM the plugin builds on (``vllm_interface()`` imports them)."""

    QuantizationConfig: type
    LinearMethodBase: type
    LinearBase: type
    UnquantizedLinearMethod: type
    set_weight_attrs: Callable[[torch.Tensor, Mapping[str, Any] | None], None]
    register_quantization_config: Callable[[str], Callable[[type], type]]


def vllm_interface() -> VllmInterface:
    """vLLM's own classes and helpers."""
    try:
        from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
        from vllm.model_executor.layers.quantization import register_quantization_config
        from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
        from vllm.model_executor.utils import set_weight_attrs
    except ImportError as err:
        raise ImportError(f"qlinear.vllm_plugin.register() needs vLLM ({err}); pass a VllmInterface to use "
                          "stand-ins") from err
    return VllmInterface(QuantizationConfig, LinearMethodBase, LinearBase, UnquantizedLinearMethod,
                         set_weight_attrs, register_quantization_config)


@dataclass(frozen=True)
class ParamSpec:
    """One checkpoint tensor of a layer shard: vLLM's loaders slice it along ``input_dim`` (row parallel) or
    ``output_dim`` (column parallel), dividing offsets by ``pack_factor`` where ``packed_dim`` is that dim."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    input_dim: int | None
    output_dim: int | None
    packed_dim: int | None = None
    pack_factor: int = 1

    def attrs(self) -> dict[str, int]:
        out = {k: v for k, v in (("input_dim", self.input_dim), ("output_dim", self.output_dim),
                                 ("packed_dim", self.packed_dim)) if v is not None}
        if self.packed_dim is not None:
            out["pack_factor"] = self.pack_factor
        return out


def shard_params(config: QuantizeConfig, input_size_per_partition: int, output_partition_sizes: Sequence[int],
                 input_size: int, layer: str = "layer") -> tuple[Scheme, list[ParamSpec]]:
    """The Scheme of one layer shard and its checkpoint tensors with their tensor-parallel dims.

    ``output_partition_sizes``: this rank's rows of each fused matrix (q, k, v or gate, up), concatenated.
    """
    allowed = FORMATS.get(config.method, ())
    if config.checkpoint_format not in allowed:
        raise ShardError(f"{layer}: {config.method.value} {config.checkpoint_format.value} is not sharded by this "
                         f"plugin; it lays out {_formats()}")
    bits, k, n = config.bits, input_size_per_partition, sum(output_partition_sizes)
    if 32 % bits:
        raise ShardError(f"{layer}: {bits}-bit words straddle int32 words, so shards cannot split them; "
                         "bits must be 2, 4 or 8")
    pf = 32 // bits
    row_split = input_size_per_partition != input_size
    grouped = 0 < config.group_size < input_size
    if row_split and config.desc_act:
        raise ShardError(f"{layer}: act-order (desc_act) groups index the whole input; a row-parallel shard of "
                         f"{k} of {input_size} inputs cannot be served (run this layer unsharded)")
    if config.desc_act and len(output_partition_sizes) > 1:
        raise ShardError(f"{layer}: act-order (desc_act) checkpoints keep one g_idx per fused matrix, and a "
                         f"fused layer of {len(output_partition_sizes)} has room for one; serve them unfused")
    if row_split and grouped and k % config.group_size:
        raise ShardError(f"{layer}: row shard of {k} inputs is not a whole number of groups of "
                         f"{config.group_size}")
    if any(size % pf for size in output_partition_sizes):  # both layouts pack output columns in qzeros
        raise ShardError(f"{layer}: output shards {list(output_partition_sizes)} must be multiples of {pf} "
                         f"({pf} {bits}-bit zero points per int32 word)")
    if k % pf and config.method is METHOD.GPTQ:
        raise ShardError(f"{layer}: input shard {k} must be a multiple of {pf} ({pf} {bits}-bit codes per word)")
    if not grouped:  # one group per row: the shard's scheme covers its own inputs with it
        config = _channelwise(config)
    scheme = config.scheme(k, n)
    group_dim = 0 if grouped else None  # channelwise scales/zeros are the same on every row shard
    if config.method is METHOD.GPTQ:
        from .layouts.gptq import checkpoint_shapes

        shapes = checkpoint_shapes(scheme)
        specs = [ParamSpec("qweight", *shapes["qweight"], input_dim=0, output_dim=1, packed_dim=0, pack_factor=pf),
                 ParamSpec("qzeros", *shapes["qzeros"], input_dim=group_dim, output_dim=1, packed_dim=1,
                           pack_factor=pf),
                 ParamSpec("scales", *shapes["scales"], input_dim=group_dim, output_dim=1),
                 ParamSpec("g_idx", *shapes["g_idx"], input_dim=0, output_dim=None)]
    else:
        from .layouts.awq import checkpoint_shapes

        shapes = checkpoint_shapes(scheme)
        specs = [ParamSpec("qweight", *shapes["qweight"], input_dim=0, output_dim=1, packed_dim=1, pack_factor=pf),
                 ParamSpec("qzeros", *shapes["qzeros"], input_dim=group_dim, output_dim=1, packed_dim=1,
                           pack_factor=pf),
                 ParamSpec("scales", *shapes["scales"], input_dim=group_dim, output_dim=1)]
    return scheme, specs


def _channelwise(config: QuantizeConfig) -> QuantizeConfig:
    import dataclasses

    return config if config.group_size == -1 else dataclasses.replace(config, group_size=-1)


def _formats() -> str:
    return "; ".join(f"{m.value}: {', '.join(f.value for f in fs)}" for m, fs in FORMATS.items())


class _MethodLogic:
    """``LinearMethodBase`` for one layer: stored tensors in, a prepared qlinear layer out."""

    def __init__(self, config: Any, quantize_config: QuantizeConfig, prefix: str) -> None:
        self.config, self.quantize_config, self.prefix = config, quantize_config, prefix

    def create_weights(self, layer: nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype,
                       **extra_weight_attrs: Any) -> None:
        scheme, specs = shard_params(self.quantize_config, input_size_per_partition, output_partition_sizes,
                                     input_size, self.prefix or type(layer).__name__)
        set_attrs = self.config.interface.set_weight_attrs
        for spec in specs:
            data = torch.empty(spec.shape, dtype=spec.dtype)
            if spec.name == "g_idx":  # checkpoints without act-order may leave it out: the plain order
                data = torch.arange(spec.shape[0], dtype=spec.dtype) // scheme.group_size
            param = nn.Parameter(data, requires_grad=False)
            set_attrs(param, spec.attrs())
            set_attrs(param, extra_weight_attrs)
            layer.register_parameter(spec.name, param)
        layer.qlinear_scheme = scheme
        layer.qlinear_params = tuple(spec.name for spec in specs)
        layer.qlinear_dtype = params_dtype
        # a row shard's g_idx holds the whole layer's group ids; its scales and zeros hold its own groups only
        layer.qlinear_local_groups = (input_size_per_partition != input_size
                                      and 0 < self.quantize_config.group_size < input_size)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        from .checkpoint.load import build_layer
        from .target import Target

        tensors = {name: getattr(layer, name).data for name in layer.qlinear_params}
        if "g_idx" in tensors and layer.qlinear_local_groups and tensors["g_idx"].numel():
            tensors["g_idx"] = tensors["g_idx"] - tensors["g_idx"].min()  # no act-order here: groups are in order
        device = tensors["qweight"].device
        built = build_layer(self.prefix or type(layer).__name__, layer.qlinear_scheme, tensors, Target.here(device),
                            layer.qlinear_dtype, self.config.backend)
        for name in layer.qlinear_params:  # the packed tensors now live in the qlinear layer only
            delattr(layer, name)
        layer.qlinear = built

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = layer.qlinear(x)
        return y if bias is None else y + bias


class _ConfigLogic:
    """``QuantizationConfig``: the checkpoint's GPTQ / AWQ config, and which layers get a qlinear method."""

    interface: VllmInterface
    method_class: type

    def __init__(self, quantize_config: QuantizeConfig, backend: BACKEND | str = "auto") -> None:
        super().__init__()
        self.quantize_config = quantize_config
        self.backend = str(BACKEND(backend).value)

    def __repr__(self) -> str:
        return f"QlinearVllmConfig({self.quantize_config!r}, backend={self.backend!r})"

    @classmethod
    def get_name(cls) -> str:
        return NAME

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # qlinear's selector decides per layer and device, and says why when nothing fits

    @staticmethod
    def get_config_filenames() -> list[str]:
        return ["quantize_config.json", "quant_config.json"]

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        """The checkpoint's quantization config; an optional ``qlinear_backend`` entry names the backend."""
        quantize_config = QuantizeConfig.from_hf_config(config)
        if quantize_config.checkpoint_format not in FORMATS.get(quantize_config.method, ()):
            raise ShardError(f"quantization config: {quantize_config.method.value} "
                             f"{quantize_config.checkpoint_format.value} is not served by the qlinear vLLM plugin; "
                             f"it serves {_formats()}")
        return cls(quantize_config, config.get("qlinear_backend", "auto"))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg: dict[str, Any], user_quant: str | None,
                                     hf_config: Any = None) -> str | None:
        """Claim a GPTQ / AWQ checkpoint when the user asked for ``quantization="qlinear"``."""
        return NAME if user_quant == NAME and hf_quant_cfg.get("quant_method") in ("gptq", "awq") else None

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Any:
        from .checkpoint.plan_gptq import module_config

        if not isinstance(layer, self.interface.LinearBase):
            return None
        names = self.checkpoint_names(prefix)
        configs = [module_config(self.quantize_config, name) for name in names]
        if all(c is None for c in configs):
            return self.interface.UnquantizedLinearMethod()
        if any(c != configs[0] for c in configs):
            kinds = ", ".join("float" if c is None else f"{c.bits}-bit g{c.group_size}" for c in configs)
            raise ShardError(f"{prefix}: fuses {', '.join(names)}, which the checkpoint quantizes differently "
                             f"({kinds}); one layer needs one scheme")
        return self.method_class(self, configs[0], prefix)

    def checkpoint_names(self, prefix: str) -> list[str]:
        """The checkpoint modules behind a vLLM layer (``qkv_proj`` -> ``q_proj``, ``k_proj``, ``v_proj``)."""
        parent, _, leaf = prefix.rpartition(".")
        parts = getattr(self, "packed_modules_mapping", {}).get(leaf)
        if not parts:
            return [prefix]
        return [f"{parent}.{p}" if parent else p for p in parts]


_REGISTERED: dict[VllmInterface, type] = {}


def register(interface: VllmInterface | None = None) -> type:
    """Build the plugin's classes on vLLM's bases and register the config as ``"qlinear"`` (once per interface);
    returns the config class. vLLM then serves a GPTQ / AWQ checkpoint with ``quantization="qlinear"``.
    vLLM may run its plugins more than once per process; a second call returns the first registration."""
    interface = interface or vllm_interface()
    if interface in _REGISTERED:
        return _REGISTERED[interface]
    method = type("QlinearLinearMethod", (_MethodLogic, interface.LinearMethodBase), {"__module__": __name__})
    config = type("QlinearVllmConfig", (_ConfigLogic, interface.QuantizationConfig),
                  {"__module__": __name__, "interface": interface, "method_class": method})
    interface.register_quantization_config(NAME)(config)
    _REGISTERED[interface] = config
    return config
