"""bitsandbytes layouts (``layouts.bnb``, ``layouts.bnb_state``, ``bnb_weight``) against the numpy oracle written from
the published NF4 / FP4 tables and the format description (tests/oracle/bnb_numpy.py): a hand-placed nibble example,
bit-exact decoding in every dtype (nested absmax, blocks straddling rows, odd code counts), lossless round trips,
and every kind of bad input named."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from qlinear.bnb_weight import BnbInt8Weight, BnbWeight, NestedAbsmax, code_table
from qlinear.layouts import bnb, bnb_state
from qlinear.spec import ConfigError, QuantizeConfig, Scheme
from tests.oracle import bnb_numpy as ref

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make(n: int, k: int, quant_type: str = "nf4", blocksize: int = 64, nested: bool = False,
         dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> BnbWeight:
    """Random codes and absmax (the nested form: random 8-bit codes into a sorted 256-value map)."""
    g = torch.Generator().manual_seed(seed)
    nb = -(-n * k // blocksize)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    if not nested:
        return BnbWeight(codes, quant_type, blocksize, torch.rand(nb, generator=g) * 0.1, code_table(quant_type), dtype)
    qmap = torch.sort(torch.rand(256, generator=g) * 2 - 1).values
    nn = -(-nb // 256)
    state = NestedAbsmax(qmap, torch.rand(nn, generator=g) * 0.05 + 0.01, 256, float(torch.tensor(0.0371)))
    return BnbWeight(codes, quant_type, blocksize, torch.randint(0, 256, (nb,), generator=g, dtype=torch.uint8),
                     code_table(quant_type), dtype, state)


def oracle_absmax(w: BnbWeight) -> np.ndarray:
    if w.nested is None:
        return w.absmax.numpy()
    n = w.nested
    return ref.nested_absmax(w.absmax.numpy(), n.quant_map.numpy(), n.absmax.numpy(), n.blocksize, n.offset)


def test_tables_are_the_published_ones() -> None:
    assert np.array_equal(code_table("nf4").numpy(), ref.NF4)
    assert np.array_equal(code_table("fp4").numpy(), ref.fp4_table())
    assert np.allclose(ref.NF4, ref.nf4_from_quantiles(), atol=1e-6)  # the published table is the paper's definition
    assert code_table("fp4")[8].item() == 0.0 and not torch.signbit(code_table("fp4")[8])
    with pytest.raises(ValueError, match="quant_type: expected one of nf4, fp4, got 'af4'"):
        code_table("af4")


def test_nibble_order_by_hand() -> None:
    """Flat codes 1, 2, 3, 4, 5, 6, 7, 8, 9 of a [3, 3] weight: bytes 0x12 0x34 0x56 0x78 0x9?, the pad nibble being
    the code of 0.0 (NF4: 7, FP4: 0); rows are not byte aligned."""
    codes = torch.arange(1, 10, dtype=torch.uint8).reshape(3, 3)
    assert bnb.pack_codes(codes, "nf4").reshape(-1).tolist() == [0x12, 0x34, 0x56, 0x78, 0x97]
    assert bnb.pack_codes(codes, "fp4").reshape(-1).tolist() == [0x12, 0x34, 0x56, 0x78, 0x90]
    assert bnb.pack_codes(codes, "nf4").shape == (5, 1)
    assert np.array_equal(bnb.unpack_codes(torch.tensor([[0x12], [0x34], [0x56], [0x78], [0x97]], dtype=torch.uint8),
                                           3, 3).numpy(), codes.numpy())
    assert bnb.unpack_flat(bnb.pack_codes(codes, "nf4"), 3, 7).tolist() == [4, 5, 6, 7]  # row 1 starts mid-byte


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "double"])
@pytest.mark.parametrize(("n", "k", "blocksize"), [(48, 96, 64), (33, 70, 64), (7, 13, 32), (5, 300, 128),
                                                   (64, 64, 256), (40, 128, 64)])
def test_decode_matches_the_oracle_bit_for_bit(quant_type: str, nested: bool, n: int, k: int, blocksize: int) -> None:
    """Every dtype; blocks that straddle rows (K % blocksize != 0), odd code counts, and nested absmax."""
    w = make(n, k, quant_type, blocksize, nested, seed=n + k)
    absmax = oracle_absmax(w)
    assert np.array_equal(w.absmax_values().numpy(), absmax)
    exact = ref.dequantize_4bit(ref.unpack(bnb.pack_codes(w.codes, quant_type).numpy(), n, k), quant_type, absmax,
                                blocksize)
    for name, dtype in DTYPES.items():
        got = w.dequantize(dtype).to(torch.float64).numpy()
        assert np.array_equal(got, ref.round_to(exact, name)), name
    assert w.dequantize().dtype == torch.bfloat16  # the stored dtype by default


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "double"])
def test_round_trip_is_lossless_and_byte_for_byte(quant_type: str, nested: bool) -> None:
    for n, k, bs, dtype in [(48, 96, 64, torch.bfloat16), (7, 13, 32, torch.float16), (5, 300, 4096, torch.float32)]:
        w = make(n, k, quant_type, bs, nested, dtype)
        scheme = bnb.scheme_of(w)
        tensors = bnb.to_checkpoint(w, scheme)
        assert list(tensors) == list(bnb.tensor_names(scheme))
        assert np.array_equal(tensors["weight"].numpy(), ref.pack(w.codes.numpy(), 7 if quant_type == "nf4" else 0))
        back = bnb.from_checkpoint(tensors, scheme)
        again = bnb.to_checkpoint(back, scheme)
        for name, t in tensors.items():
            assert t.dtype == again[name].dtype and torch.equal(t, again[name]), name
        assert torch.equal(back.codes, w.codes) and torch.equal(back.absmax, w.absmax) and back.dtype == dtype


def test_the_json_blob_is_bitsandbytes_serialization() -> None:
    """Written as json.dumps of bitsandbytes' keys in its order; parsed back to the same bytes."""
    w = make(8, 32, "fp4", 64, nested=True, dtype=torch.float16)
    blob = bnb.to_checkpoint(w, bnb.scheme_of(w))["weight.quant_state.bitsandbytes__fp4"]
    text = bytes(blob.tolist()).decode()
    assert text == json.dumps({"quant_type": "fp4", "blocksize": 64, "dtype": "float16", "shape": [8, 32],
                               "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": w.nested.offset})
    info = bnb_state.parse(blob, "x")
    assert (info.quant_type, info.blocksize, info.dtype, info.shape, info.nested_blocksize) == (
        "fp4", 64, torch.float16, (8, 32), 256)
    assert torch.equal(bnb_state.serialize(info), blob)


def blob(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.uint8)


@pytest.mark.parametrize(("text", "message"), [
    ('{"quant_type": "nf4"', "x: not a JSON object"),
    ('[1, 2]', "x: expected a JSON object, got list"),
    ('{"quant_type": "af4", "blocksize": 64, "dtype": "bfloat16", "shape": [2, 64]}', "quant_type 'af4'"),
    ('{"quant_type": "nf4", "blocksize": 96, "dtype": "bfloat16", "shape": [2, 64]}', "blocksize 96 is not one"),
    ('{"quant_type": "nf4", "blocksize": 64, "dtype": "int8", "shape": [2, 64]}', "dtype 'int8'"),
    ('{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [128]}', "shape must be"),
    ('{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16"}', "no 'shape' in the quant_state JSON"),
    ('{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [2, 64], "x": 1}', "unexpected key"),
    ('{"quant_type":"nf4","blocksize":64,"dtype":"bfloat16","shape":[2,64]}', "not in bitsandbytes' own serial"),
    ('{"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [2, 64], "nested_blocksize": 256, '
     '"nested_dtype": "float32", "nested_offset": 0.1}', "nested_offset must be a finite float32 value"),
])
def test_bad_json_blobs_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bnb_state.parse(blob(text), "x")
    with pytest.raises(ValueError, match="expected a uint8 .len. tensor"):
        bnb_state.parse(blob(text).reshape(1, -1), "x")


def test_bad_tensors_name_tensor_expected_and_found() -> None:
    w = make(48, 96, "nf4", 64, nested=True)
    scheme = bnb.scheme_of(w)
    good = bnb.to_checkpoint(w, scheme)

    def fails(message: str, **changes: torch.Tensor | None) -> None:
        tensors = {**good, **changes}
        tensors = {k: v for k, v in tensors.items() if v is not None}
        with pytest.raises(ValueError, match=message):
            bnb.from_checkpoint(tensors, scheme)

    fails(r"weight.absmax: expected shape \[72\] dtype torch.uint8 .*, got shape \[71\]", **{"weight.absmax":
                                                                                           good["weight.absmax"][:71]})
    fails(r"weight: expected shape \[2304, 1\] dtype torch.uint8", weight=good["weight"].view(torch.int8))
    fails("weight.nested_absmax: missing", **{"weight.nested_absmax": None})
    fails(r"quant_state.bitsandbytes__nf4: missing", **{"weight.quant_state.bitsandbytes__nf4": None})
    other = bnb.to_checkpoint(make(48, 96, "nf4", 128, nested=True), bnb.bnb_scheme(48, 96, "nf4", 128, True))
    fails(r"says blocksize 128, .* the layer is blocksize 64",
          **{"weight.quant_state.bitsandbytes__nf4": other["weight.quant_state.bitsandbytes__nf4"]})
    qmap = good["weight.quant_map"].clone()
    qmap[3] += 1e-3
    fails(r"quant_map: differs from bitsandbytes' nf4 table at code 3", **{"weight.quant_map": qmap})
    nested = good["weight.nested_absmax"].clone()
    nested[0] = float("nan")
    fails(r"nested_absmax: every nested absmax must be finite; found nan at index 0",
          **{"weight.nested_absmax": nested})
    plain = make(48, 96, "fp4", 64)
    tensors = bnb.to_checkpoint(plain, bnb.scheme_of(plain))
    tensors["weight.absmax"][5] = float("nan")
    with pytest.raises(ValueError, match="absmax: every block absmax must be finite; found nan at index 5"):
        bnb.from_checkpoint(tensors, bnb.scheme_of(plain))
    with pytest.raises(ValueError, match="scheme: gptq_v2 .* is not a bitsandbytes layout"):
        bnb.checkpoint_shapes(Scheme(bits=4, group_size=32, in_features=96, out_features=48))


def test_canonical_form_refuses_what_bitsandbytes_cannot_hold() -> None:
    codes = torch.zeros(4, 64, dtype=torch.uint8)
    table = code_table("nf4")
    with pytest.raises(ValueError, match=r"blocksize: bitsandbytes quantizes .* got 48"):
        BnbWeight(codes, "nf4", 48, torch.ones(6), table)
    with pytest.raises(ValueError, match=r"absmax: expected float32 values of shape \[4\] .* got torch.float32 shape"
                                         r" \[3\]"):
        BnbWeight(codes, "nf4", 64, torch.ones(3), table)
    with pytest.raises(ValueError, match="codes: 4-bit codes are 0..15, found 16"):
        BnbWeight(codes + 16, "nf4", 64, torch.ones(4), table)
    with pytest.raises(ValueError, match="dtype: expected one of"):
        BnbWeight(codes, "nf4", 64, torch.ones(4), table, dtype=torch.float64)
    with pytest.raises(ValueError, match="nested_offset: expected a finite float32 value, got 0.1"):
        BnbWeight(codes, "nf4", 64, torch.zeros(4, dtype=torch.uint8), table,
                  nested=NestedAbsmax(torch.zeros(256), torch.ones(1), 256, 0.1))
    w = make(4, 64)
    with pytest.raises(ValueError, match=r"weight: it is bitsandbytes nf4 blocksize 64 \[4, 64\]; the layer is nf4 "
                                         r"blocksize 128"):
        bnb.to_checkpoint(w, bnb.bnb_scheme(4, 64, "nf4", 128))
    assert replace(w, blocksize=32, absmax=torch.ones(8)).num_blocks == 8


def test_int8_decodes_as_llm_int8_and_round_trips() -> None:
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (24, 40), generator=g, dtype=torch.int8)
    scb = torch.rand(24, generator=g) * 3
    w = BnbInt8Weight(q, scb)
    assert np.array_equal(w.dequantize().numpy(), ref.dequantize_int8(q.numpy(), scb.numpy()))
    assert np.array_equal(w.dequantize(torch.bfloat16).double().numpy(),
                          ref.round_to(ref.dequantize_int8(q.numpy(), scb.numpy()), "bfloat16"))
    scheme = bnb.scheme_of(w)
    tensors = bnb.to_checkpoint(w, scheme)
    assert list(tensors) == ["weight", "SCB", "weight_format"] and tensors["weight_format"].item() == 0
    back = bnb.from_checkpoint({k: v for k, v in tensors.items() if k != "weight_format"}, scheme)
    assert torch.equal(back.codes, q) and torch.equal(back.scb, scb)
    with pytest.raises(ValueError, match="weight_format: 1 .* only 0, row-major, is read"):
        bnb.from_checkpoint({**tensors, "weight_format": torch.tensor(1, dtype=torch.uint8)}, scheme)
    with pytest.raises(ValueError, match=r"SCB: expected shape \[24\] dtype torch.float32"):
        bnb.from_checkpoint({**tensors, "SCB": scb.half()}, scheme)
    bad = scb.clone()
    bad[2] = float("inf")
    with pytest.raises(ValueError, match="SCB: every row scale must be finite; found inf at index 2"):
        BnbInt8Weight(q, bad)


def test_scheme_fields_are_validated() -> None:
    s = bnb.bnb_scheme(48, 96, "nf4", 64, True)
    assert (s.bits, s.bnb_type, s.blocksize, s.double_quant, s.group_size) == (4, "nf4", 64, True, 96)
    assert bnb.bnb_scheme(48, 128, "fp4", 64).group_size == 64  # blocks are row groups when they divide K
    base = {"in_features": 64, "out_features": 8, "group_size": -1, "method": "bitsandbytes", "format": "bitsandbytes"}
    with pytest.raises(ConfigError, match="bnb_type for 4-bit bitsandbytes weights must be one of nf4, fp4; got 'int"):
        Scheme(bits=4, bnb_type="int8", blocksize=64, **base)
    with pytest.raises(ConfigError, match="4-bit bitsandbytes weights need blocksize"):
        Scheme(bits=4, bnb_type="nf4", **base)
    with pytest.raises(ConfigError, match="8-bit bitsandbytes weights have one scale"):
        Scheme(bits=8, bnb_type="int8", blocksize=64, **base)
    with pytest.raises(ConfigError, match="bitsandbytes weights are 4-bit .* or 8-bit .*; got bits=3"):
        Scheme(bits=3, bnb_type="nf4", blocksize=64, **base)
    with pytest.raises(ConfigError, match="describe bitsandbytes weights; got method gptq"):
        Scheme(bits=4, group_size=32, in_features=64, out_features=8, bnb_type="nf4")
    cfg = QuantizeConfig.from_hf_config({"quant_method": "bitsandbytes", "load_in_8bit": True})
    assert (cfg.bits, cfg.checkpoint_format.value) == (8, "bitsandbytes")
    with pytest.raises(ConfigError, match="exactly one of load_in_4bit / load_in_8bit"):
        QuantizeConfig.from_hf_config({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": True})
