"""compressed-tensors configs: groups, target matching (exact > regex > class), ignore, presets, formats, errors."""

from __future__ import annotations

import pytest

from qlinear.activations import ActScales, ActStrategy
from qlinear.ct_config import CompressedTensorsConfig, infer_format
from qlinear.floats import Element
from qlinear.spec import ConfigError

W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
FP8W = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}
FP8A = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}


def cfg(groups: dict, **extra: object) -> CompressedTensorsConfig:
    raw = {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": groups,
           "ignore": ["lm_head", "re:.*mlp.down_proj$"], "version": "0.19.0", **extra}
    return CompressedTensorsConfig.from_hf_config({"quantization_config": raw})


def test_most_specific_target_wins_and_ignore_beats_everything() -> None:
    c = cfg({"group_0": {"targets": ["Linear"], "weights": W4},
             "group_1": {"targets": ["re:.*self_attn.*"], "weights": FP8W, "input_activations": FP8A},
             "group_2": {"targets": ["model.layers.0.self_attn.o_proj"], "weights": {**W4, "num_bits": 8}}})
    assert c.group_for("model.layers.1.mlp.up_proj").name == "group_0"
    assert c.group_for("model.layers.1.self_attn.q_proj").name == "group_1"
    assert c.group_for("model.layers.0.self_attn.o_proj").name == "group_2"
    assert c.group_for("model.layers.0.mlp.down_proj") is None and c.ignored("lm_head")
    assert c.version == (0, 19)


def test_schemes_per_strategy_and_inferred_formats() -> None:
    c = cfg({"int": {"targets": ["re:.*mlp.*"], "weights": W4},
             "fp8": {"targets": ["re:.*attn.*"], "weights": FP8W, "input_activations": FP8A}})
    s = c.scheme(c.groups[0], 256, 64)
    assert (s.format.value, s.bits, s.scale_block, s.group_size, s.activations) == ("pack-quantized", 4, (1, 32), 32,
                                                                                   None)
    f = c.scheme(c.groups[1], 256, 64)
    assert (f.format.value, f.element, f.scale_block) == ("float-quantized", Element.E4M3, (1, 256))
    a = f.activations
    assert (a.element, a.strategy, a.scales) == (Element.E4M3, ActStrategy.TOKEN, ActScales.DYNAMIC)
    block = cfg({"g": {"targets": ["Linear"], "weights": {**FP8W, "strategy": "block", "block_structure": [128, 128]},
                       "input_activations": {**FP8A, "strategy": "group", "group_size": 128}}})
    assert block.scheme(block.groups[0], 320, 200).scale_block == (128, 128)
    weight_only_fp8 = cfg({"g": {"targets": ["Linear"], "weights": FP8W}})
    assert infer_format(weight_only_fp8.groups[0]) == "naive-quantized"


def test_presets_and_own_group_formats() -> None:
    c = cfg({"NVFP4": ["Linear"]}, format="nvfp4-pack-quantized")
    s = c.scheme(c.groups[0], 64, 32)
    assert (s.format.value, s.element, s.scale_block) == ("nvfp4-pack-quantized", Element.E2M1, (1, 16))
    assert s.activations.scales is ActScales.LOCAL and s.activations.tensor_names == ("input_global_scale",)
    own = cfg({"g": {"targets": ["Linear"], "weights": W4, "format": "naive-quantized"}})
    assert own.scheme(own.groups[0], 64, 32).format.value == "naive-quantized"
    old = cfg({"g": {"targets": ["Linear"], "weights": {**W4, "num_bits": 3}}}, version="0.17.1",
              format="pack-quantized")
    assert old.scheme(old.groups[0], 64, 32).legacy_packing


@pytest.mark.parametrize(("groups", "extra", "needle"), [
    ({"g": {"targets": ["Linear"], "weights": W4}}, {"sparsity_config": {"format": "sparse-24-bitmask"}},
     "sparsity_config is set"),
    ({"g": {"targets": ["Linear"], "weights": W4}}, {"transform_config": {"config_groups": {}}}, "rotation"),
    ({"g": {"targets": [], "weights": W4}}, {}, r"g.targets: expected a non-empty list"),
    ({"g": {"targets": ["Linear"], "weights": {**W4, "num_bits": 12}}}, {}, "num_bits: expected an integer in 1..8"),
    ({"g": {"targets": ["Linear"], "weights": {**W4, "group_size": None}}}, {}, "strategy group needs a positive"),
    ({"g": {"targets": ["Linear"], "weights": {**FP8W, "strategy": "block"}}}, {}, "block_structure: strategy block"),
    ({"W9A9": ["Linear"]}, {}, "neither a scheme object nor a preset"),
    ({}, {}, "config_groups must be a non-empty object"),
])
def test_bad_configs_name_the_field(groups: dict, extra: dict, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        cfg(groups, **extra)


def test_scheme_refusals() -> None:
    c = cfg({"g": {"targets": ["Linear"], "weights": {**FP8W, "num_bits": 6}},
             "h": {"targets": ["x"], "weights": W4, "input_activations": {**FP8A, "type": "int", "num_bits": 4}}})
    with pytest.raises(ConfigError, match="float weights of 6 bits"):
        c.scheme(c.groups[0], 64, 32)
    with pytest.raises(ConfigError, match="integer activations of 4 bits are not implemented"):
        c.scheme(c.groups[1], 64, 32)
    sparse = cfg({"g": {"targets": ["Linear"], "weights": W4, "format": "marlin-24"}})
    with pytest.raises(ConfigError, match="format 'marlin-24' is not read"):
        sparse.scheme(sparse.groups[0], 64, 32)
