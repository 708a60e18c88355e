"""``qlinear.vllm_plugin`` against a stub of vLLM's quantization-plugin interface (no vLLM install).

The stubs transcribe the contract read from vLLM's source (``quantization/base_config.py`` ``QuantizationConfig``
and ``QuantizeMethodBase``, ``layers/linear.py`` ``LinearMethodBase`` and the legacy ``weight_loader`` of
``MergedColumnParallelLinear`` / ``RowParallelLinear``, ``model_executor/utils.py`` ``set_weight_attrs``,
``quantization/__init__.py`` ``register_quantization_config``): a merged gate/up layer and a down layer are built
per tensor-parallel rank, the checkpoint's tensors are sliced into them by those loaders, and the ranks' outputs,
gathered (column) or summed (row), must give the product of GPTQModel 7.7.0's own dequantized weights
(tests/fixtures reference) in float64.
"""

from __future__ import annotations

import json
import subprocess
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from qlinear.vllm_plugin import ShardError, VllmInterface, register, shard_params

FIXTURES = Path(__file__).parent / "fixtures"


class QuantizationConfig(ABC):
    """vLLM's: abstract name / act dtypes / capability / config files / from_config / get_quant_method."""

    def __init__(self) -> None:
        super().__init__()
        self.packed_modules_mapping: dict[str, list[str]] = {}

    @classmethod
    @abstractmethod
    def get_name(cls) -> str: ...

    @classmethod
    @abstractmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]: ...

    @classmethod
    @abstractmethod
    def get_min_capability(cls) -> int: ...

    @staticmethod
    @abstractmethod
    def get_config_filenames() -> list[str]: ...

    @classmethod
    @abstractmethod
    def from_config(cls, config: dict[str, Any]) -> QuantizationConfig: ...

    @abstractmethod
    def get_quant_method(self, layer: nn.Module, prefix: str) -> Any: ...


class LinearMethodBase(ABC):
    """vLLM's: create_weights(layer, in/partition, output_partition_sizes, in, out, params_dtype, **attrs),
    apply(layer, x, bias); process_weights_after_loading defaults to nothing."""

    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size_per_partition: int, output_partition_sizes: list[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra: Any) -> None: ...

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor: ...

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        return None


def set_weight_attrs(weight: torch.Tensor, attrs: dict[str, Any] | None) -> None:
    """vLLM's: set each attribute, refusing to overwrite one."""
    for key, value in (attrs or {}).items():
        assert not hasattr(weight, key), f"overwriting existing tensor attribute: {key}"
        setattr(weight, key, value)


class UnquantizedLinearMethod(LinearMethodBase):
    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra):
        weight = nn.Parameter(torch.empty(sum(output_partition_sizes), input_size_per_partition,
                                          dtype=params_dtype), requires_grad=False)
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra)

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


class LinearBase(nn.Module):
    pass


class ParallelLinear(LinearBase):
    """One tensor-parallel rank of vLLM's MergedColumnParallelLinear (``row=False``, ``output_sizes`` fused
    along the output) or RowParallelLinear (``row=True``), with their legacy ``weight_loader``s."""

    def __init__(self, config: Any, prefix: str, input_size: int, output_sizes: list[int], row: bool,
                 tp_rank: int = 0, tp_size: int = 1, params_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.output_sizes, self.row, self.tp_rank, self.tp_size = output_sizes, row, tp_rank, tp_size
        self.quant_method = config.get_quant_method(self, prefix)
        in_part = input_size // tp_size if row else input_size
        parts = output_sizes if row else [s // tp_size for s in output_sizes]
        self.quant_method.create_weights(self, in_part, parts, input_size, sum(output_sizes), params_dtype,
                                         weight_loader=self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: int | None = None) -> None:
        data = param.data
        if self.row:
            input_dim = getattr(param, "input_dim", None)
            if input_dim is not None:
                size = data.shape[input_dim]
                loaded = loaded.narrow(input_dim, self.tp_rank * size, size)
        else:
            output_dim = getattr(param, "output_dim", None)
            if output_dim is not None:
                offset = sum(self.output_sizes[:shard_id]) // self.tp_size
                size = self.output_sizes[shard_id] // self.tp_size
                if getattr(param, "packed_dim", None) == output_dim:
                    offset, size = offset // param.pack_factor, size // param.pack_factor
                data = data.narrow(output_dim, offset, size)
                loaded = loaded.narrow(output_dim, self.tp_rank * size, size)
        assert data.shape == loaded.shape, (data.shape, loaded.shape)
        data.copy_(loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x)


REGISTRY: dict[str, type] = {}


def register_quantization_config(name: str):
    def wrap(cls: type) -> type:
        if name in REGISTRY:
            raise ValueError(f"The quantization method `{name}` is already exists.")
        if not issubclass(cls, QuantizationConfig):
            raise ValueError("The quantization config must be a subclass of `QuantizationConfig`.")
        REGISTRY[name] = cls
        return cls
    return wrap


STUB = VllmInterface(QuantizationConfig, LinearMethodBase, LinearBase, UnquantizedLinearMethod, set_weight_attrs,
                     register_quantization_config)


@pytest.fixture(scope="module")
def plugin() -> type:
    return register(STUB)


def checkpoint(name: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted((FIXTURES / name).glob("*.safetensors")):
        out |= load_file(str(f))
    return out


def producer(name: str) -> dict[str, torch.Tensor]:
    """GPTQModel's own dequantized weight [out, in] (float16) per module."""
    ref = load_file(str(FIXTURES / name / "reference" / "tool_outputs.safetensors"))
    return {k.removesuffix(".weight"): v for k, v in ref.items() if k.endswith(".weight")}


def quant_config(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "config.json").read_text())["quantization_config"]


def mlp_rank(plugin: type, config: Any, tensors: dict[str, torch.Tensor], rank: int, tp: int,
             prefix: str = "model.layers.0.mlp") -> tuple[ParallelLinear, ParallelLinear]:
    """gate_up_proj (merged column) and down_proj (row) of one rank, loaded and processed."""
    gate_up = ParallelLinear(config, f"{prefix}.gate_up_proj", 64, [128, 128], row=False, tp_rank=rank, tp_size=tp)
    down = ParallelLinear(config, f"{prefix}.down_proj", 128, [64], row=True, tp_rank=rank, tp_size=tp)
    for leaf in gate_up.qlinear_params:
        for shard, part in enumerate(("gate_proj", "up_proj")):
            getattr(gate_up, leaf).weight_loader(getattr(gate_up, leaf), tensors[f"{prefix}.{part}.{leaf}"], shard)
    for leaf in down.qlinear_params:
        getattr(down, leaf).weight_loader(getattr(down, leaf), tensors[f"{prefix}.down_proj.{leaf}"])
    for layer in (gate_up, down):
        layer.quant_method.process_weights_after_loading(layer)
    return gate_up, down


def make_config(plugin: type, name: str, **extra: Any) -> Any:
    config = plugin.from_config(quant_config(name) | extra)
    config.packed_modules_mapping.update(gate_up_proj=["gate_proj", "up_proj"], qkv_proj=["q_proj", "k_proj",
                                                                                          "v_proj"])
    return config


@pytest.mark.parametrize("name", ["gptq_4bit_g32", "gptq_v2_4bit_g32_asym_sharded", "awq_gemm_4bit_g32"])
@pytest.mark.parametrize("tp", [1, 2, 4])  # 4: a row shard of one group
def test_tensor_parallel_shards_give_the_producers_product(plugin: type, name: str, tp: int) -> None:
    config, tensors, w = make_config(plugin, name), checkpoint(name), producer(name)
    p = "model.layers.0.mlp"
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(tp))
    h = torch.randn(5, 128, generator=torch.Generator().manual_seed(7))
    ranks = [mlp_rank(plugin, config, tensors, r, tp) for r in range(tp)]
    outs = [gate_up(x) for gate_up, _ in ranks]  # each rank: [its gate rows, its up rows]
    gate = torch.cat([o[:, :128 // tp] for o in outs], 1)
    up = torch.cat([o[:, 128 // tp:] for o in outs], 1)
    down = sum(d(h[:, r * 128 // tp:(r + 1) * 128 // tp]) for r, (_, d) in enumerate(ranks))
    for got, module, inp in ((gate, "gate_proj", x), (up, "up_proj", x), (down, "down_proj", h)):
        want = inp.double() @ w[f"{p}.{module}"].double().t()
        # GPTQModel's weights are rounded to float16 once; the layers use the exact ones
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-3 * float(want.abs().max()), msg=module)
    for layer in ranks[0]:
        assert not any(n in dict(layer.named_parameters(recurse=False)) for n in ("qweight", "scales"))
        assert type(layer.qlinear).__name__ in ("TorchLinear", "AwqTorchLinear")


def test_one_rank_is_the_checkpoint_loaders_layer(plugin: type) -> None:
    """TP 1: the layer vLLM would run is the one ``load_checkpoint`` builds for the module, bit for bit."""
    from qlinear.checkpoint import load_checkpoint

    name = "gptq_4bit_g32"
    layers = load_checkpoint(FIXTURES / name, dtype=torch.float32)
    _, down = mlp_rank(plugin, make_config(plugin, name), checkpoint(name), 0, 1)
    h = torch.randn(3, 128)
    assert torch.equal(down(h), layers["model.layers.0.mlp.down_proj"](h))


def test_shard_dims_and_shapes() -> None:
    from qlinear.spec import QuantizeConfig

    gptq = QuantizeConfig(bits=4, group_size=32, sym=True, method="gptq", checkpoint_format="gptq")
    scheme, specs = shard_params(gptq, 64, [64, 64], 128, "down")  # row shard: half the inputs, 2 groups
    got = {s.name: (s.shape, s.dtype, s.attrs()) for s in specs}
    assert (scheme.in_features, scheme.out_features, scheme.num_groups) == (64, 128, 2)
    assert got == {
        "qweight": ((8, 128), torch.int32, {"input_dim": 0, "output_dim": 1, "packed_dim": 0, "pack_factor": 8}),
        "qzeros": ((2, 16), torch.int32, {"input_dim": 0, "output_dim": 1, "packed_dim": 1, "pack_factor": 8}),
        "scales": ((2, 128), torch.float16, {"input_dim": 0, "output_dim": 1}),
        "g_idx": ((64,), torch.int32, {"input_dim": 0})}
    channel = QuantizeConfig(bits=8, group_size=-1, sym=True, method="gptq", checkpoint_format="gptq_v2")
    _, specs = shard_params(channel, 64, [32], 128, "down")  # one group per row: replicated on every shard
    assert {s.name: (s.shape, s.input_dim) for s in specs if s.name in ("qzeros", "scales")} == {
        "qzeros": ((1, 8), None), "scales": ((1, 32), None)}
    awq = QuantizeConfig(bits=4, group_size=32, sym=False, method="awq", checkpoint_format="gemm")
    _, specs = shard_params(awq, 64, [32, 32], 64, "gate_up")
    assert {s.name: (s.shape, s.packed_dim) for s in specs} == {
        "qweight": ((64, 8), 1), "qzeros": ((2, 8), 1), "scales": ((2, 64), None)}


def test_shards_that_cannot_be_laid_out_are_refused() -> None:
    from qlinear.spec import QuantizeConfig

    act = QuantizeConfig(bits=4, group_size=32, sym=True, desc_act=True, method="gptq", checkpoint_format="gptq")
    with pytest.raises(ShardError, match=r"down: act-order .* row-parallel shard of 64 of 128 inputs"):
        shard_params(act, 64, [64], 128, "down")
    shard_params(act, 128, [64], 128, "down")  # unsharded act-order is fine
    with pytest.raises(ShardError, match=r"qkv: act-order .* fused layer of 3"):
        shard_params(act, 64, [64, 32, 32], 64, "qkv")
    three = QuantizeConfig(bits=3, group_size=32, sym=True, method="gptq", checkpoint_format="gptq")
    with pytest.raises(ShardError, match=r"3-bit words straddle int32 words"):
        shard_params(three, 64, [64], 64)
    four = QuantizeConfig(bits=4, group_size=32, sym=True, method="gptq", checkpoint_format="gptq")
    with pytest.raises(ShardError, match=r"output shards \[12, 12\] must be multiples of 8"):
        shard_params(four, 64, [12, 12], 64)
    with pytest.raises(ShardError, match=r"row shard of 48 inputs is not a whole number of groups of 32"):
        shard_params(four, 48, [64], 96)


def test_which_layers_get_a_qlinear_method(plugin: type) -> None:
    config = make_config(plugin, "gptq_4bit_g32", dynamic={r"-:.*down_proj": {}, r".*k_proj": {"bits": 8}})
    assert config.get_quant_method(nn.Linear(2, 2), "lm_head") is None  # not a vLLM linear layer
    layer = LinearBase()
    assert isinstance(config.get_quant_method(layer, "model.layers.0.mlp.down_proj"), UnquantizedLinearMethod)
    assert type(config.get_quant_method(layer, "model.layers.0.mlp.gate_up_proj")).__name__ == "QlinearLinearMethod"
    assert config.checkpoint_names("model.layers.0.self_attn.qkv_proj") == [
        "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"]
    with pytest.raises(ShardError, match=r"qkv_proj: fuses .*q_proj.* quantizes differently \(4-bit g32, 8-bit g32"):
        config.get_quant_method(layer, "model.layers.0.self_attn.qkv_proj")


def test_config_contract_and_refusals(plugin: type) -> None:
    from qlinear.checkpoint.safetensors_io import CheckpointError

    again = VllmInterface(*(getattr(STUB, f) for f in STUB.__dataclass_fields__))  # vLLM may run plugins twice
    assert REGISTRY["qlinear"] is plugin and register(again) is plugin
    assert plugin.get_name() == "qlinear" and plugin.get_min_capability() == 0
    assert plugin.override_quantization_method({"quant_method": "gptq"}, "qlinear") == "qlinear"
    assert plugin.override_quantization_method({"quant_method": "gptq"}, None) is None
    assert plugin.override_quantization_method({"quant_method": "compressed-tensors"}, "qlinear") is None
    with pytest.raises(ShardError, match=r"gptq marlin is not served by the qlinear vLLM plugin"):
        plugin.from_config(quant_config("gptq_4bit_g32") | {"checkpoint_format": "marlin"})
    with pytest.raises(ValueError, match=r"unknown BACKEND 'nope'"):
        plugin.from_config(quant_config("gptq_4bit_g32") | {"qlinear_backend": "nope"})
    config = make_config(plugin, "gptq_4bit_g32", qlinear_backend="awq_torch")  # a backend for another format
    with pytest.raises(CheckpointError, match=r"model.layers.0.mlp.gate_up_proj: no kernel can run this layer"):
        mlp_rank(plugin, config, checkpoint("gptq_4bit_g32"), 0, 1)


def test_importing_the_plugin_needs_no_vllm() -> None:
    script = ("import sys, qlinear.vllm_plugin as p\nassert 'vllm' not in sys.modules\n"
              "try:\n    p.register()\nexcept ImportError as err:\n    print('refused:', err)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    if "refused" in out.stdout:  # vLLM is not installed here
        assert "pass a VllmInterface" in out.stdout
