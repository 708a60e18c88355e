"""Enums parse leniently and list the valid names; configs validate and read the files real tools write."""

from __future__ import annotations

import json

import pytest
import torch

from qlinear import BACKEND, FORMAT, METHOD, QuantizeConfig, Scheme
from qlinear.spec import ConfigError


def test_enums_are_case_insensitive_by_name_or_value() -> None:
    assert FORMAT("GPTQ_V2") is FORMAT.GPTQ_V2
    assert FORMAT("gptq_v2") is FORMAT.GPTQ_V2
    assert FORMAT("LLM_AWQ") is FORMAT.LLM_AWQ
    assert FORMAT("llm-awq") is FORMAT.LLM_AWQ
    assert BACKEND("Gptq_Torch") is BACKEND.GPTQ_TORCH
    assert METHOD(" AWQ ") is METHOD.AWQ


def test_unknown_enum_value_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown FORMAT 'gptq3'; expected one of: gptq, gptq_v2, gptq_p"):
        FORMAT("gptq3")
    with pytest.raises(ValueError, match="gptq_marlin"):
        BACKEND("marlin_v9")


def test_reference_members_exist() -> None:
    for name in ("GPTQ", "GPTQ_V2", "GPTQ_P", "MARLIN", "BITBLAS", "GEMM", "GEMV", "GEMV_FAST", "LLM_AWQ", "QQQ",
                 "GGUF", "FP8", "BITSANDBYTES", "VPTQ", "PAROQUANT", "EXL3"):
        assert FORMAT[name].name == name
    assert BACKEND.AUTO.value == "auto"


def test_group_size_minus_one_is_resolved_once() -> None:
    s = Scheme(bits=4, group_size=-1, in_features=4096, out_features=11008)
    assert s.group_size == 4096 and s.channelwise and s.num_groups == 1
    s = Scheme(bits=4, group_size=128, in_features=4096, out_features=11008)
    assert s.num_groups == 32 and not s.channelwise
    s = Scheme(bits=4, group_size=128, in_features=100, out_features=8)
    assert s.group_size == 100 and s.num_groups == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"bits": 5, "checkpoint_format": "gptq_v2"}, "5, 6 and 7 bits exist only as checkpoint_format='gptq_p'"),
    ({"bits": 9}, r"bits must be an integer in 1\.\.8; got 9"),
    ({"group_size": 0}, "group_size must be -1"),
    ({"group_size": -2}, "group_size must be -1"),
    ({"pack_dtype": "int128"}, "pack_dtype must be one of int8, int16, int32, int64; got 'int128'"),
    ({"bits": 3, "pack_dtype": "int16"}, "3-bit GPTQ is packed in int32 words only"),
    ({"checkpoint_format": "gptq_p", "pack_dtype": "int8"}, "planar gptq_p is packed in int32 words only"),
    ({"method": "awq", "desc_act": True}, "AWQ never reorders input channels"),
    ({"method": "gptq", "checkpoint_format": "gemm"}, "checkpoint_format 'gemm' is not a gptq format"),
    ({"checkpoint_format": "nope"}, "unknown FORMAT 'nope'"),
])
def test_invalid_configs_raise_clearly(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QuantizeConfig(**kwargs)


def test_bad_layer_shape_is_named() -> None:
    with pytest.raises(ConfigError, match="in_features must be a positive integer; got 0"):
        Scheme(bits=4, group_size=128, in_features=0, out_features=8)


def test_from_hf_config_gptqmodel_quantize_config(tmp_path) -> None:
    (tmp_path / "quantize_config.json").write_text(json.dumps({
        "bits": 4, "group_size": 128, "desc_act": True, "sym": False, "lm_head": False,
        "quant_method": "gptq", "checkpoint_format": "gptq_v2", "pack_dtype": "int32",
        "meta": {"quantizer": ["gptqmodel:7.7.0"]}}))
    cfg = QuantizeConfig.from_hf_config(tmp_path)
    assert (cfg.bits, cfg.group_size, cfg.desc_act, cfg.sym) == (4, 128, True, False)
    assert cfg.checkpoint_format is FORMAT.GPTQ_V2 and cfg.method is METHOD.GPTQ
    assert cfg.pack_dtype == torch.int32 and cfg.extra["lm_head"] is False
    assert cfg.to_hf_dict()["checkpoint_format"] == "gptq_v2"


def test_from_hf_config_autogptq_defaults_to_v1(tmp_path) -> None:
    path = tmp_path / "quantize_config.json"
    path.write_text(json.dumps({"bits": 4, "group_size": 128, "damp_percent": 0.01, "desc_act": False,
                                "static_groups": False, "sym": True, "true_sequential": True,
                                "model_name_or_path": None, "model_file_base_name": None}))
    cfg = QuantizeConfig.from_hf_config(path)
    assert cfg.checkpoint_format is FORMAT.GPTQ and cfg.method is METHOD.GPTQ and cfg.sym


def test_from_hf_config_transformers_config_json(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"],
        "quantization_config": {"bits": 8, "group_size": -1, "quant_method": "gptq", "desc_act": False,
                                "sym": True, "checkpoint_format": "gptq"}}))
    cfg = QuantizeConfig.from_hf_config(tmp_path)
    assert cfg.bits == 8 and cfg.group_size == -1
    assert cfg.scheme(4096, 1024).group_size == 4096


def test_from_hf_config_autoawq(tmp_path) -> None:
    cfg = QuantizeConfig.from_hf_config({"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"})
    assert cfg.method is METHOD.AWQ and cfg.checkpoint_format is FORMAT.GEMM and not cfg.sym
    cfg = QuantizeConfig.from_hf_config({"quantization_config": {"bits": 4, "group_size": 64, "quant_method": "awq",
                                                                 "version": "gemv", "zero_point": False}})
    assert cfg.checkpoint_format is FORMAT.GEMV and cfg.sym and cfg.group_size == 64


def test_from_hf_config_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no quantize_config.json, quant_config.json or config.json"):
        QuantizeConfig.from_hf_config(tmp_path)
    bad = tmp_path / "quantize_config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        QuantizeConfig.from_hf_config(bad)
    with pytest.raises(ConfigError, match="no 'bits'"):
        QuantizeConfig.from_hf_config({"quant_method": "gptq"})
    with pytest.raises(ValueError, match="unknown METHOD 'squeezellm'"):
        QuantizeConfig.from_hf_config({"quant_method": "squeezellm", "bits": 4})


def test_from_hf_config_float_and_compressed_tensors_configs() -> None:
    fp8 = QuantizeConfig.from_hf_config({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
                                         "activation_scheme": "dynamic"})
    assert fp8.method is METHOD.FP8 and fp8.checkpoint_format is FORMAT.HF_FP8 and fp8.bits == 8
    gm = QuantizeConfig.from_hf_config({"quant_method": "fp8", "format": "float8_e4m3fn", "weight_scale_method": "row"})
    assert gm.checkpoint_format is FORMAT.FP8
    with pytest.raises(ValueError, match="cannot tell whether weight_scale_inv multiplies or divides"):
        QuantizeConfig.from_hf_config({"quant_method": "fp8"})
    with pytest.raises(ValueError, match="read them with qlinear.ct_config.CompressedTensorsConfig"):
        QuantizeConfig.from_hf_config({"quant_method": "compressed-tensors", "config_groups": {}})
