"""VPTQ layout (``layouts/vptq.py``) against an independent float64 oracle (tests/oracle/vptq_numpy.py): code
packing, dequantization of every feature (residual, outliers, permutation, norm, padded rows and groups) in float16
and bfloat16, and the validation errors. Bit-exactness with the producers themselves (VPTQ 0.0.5.post1, GPTQModel
7.7.0) is in tests/external/test_vptq_producers.py."""

from __future__ import annotations

import pytest
import torch

from qlinear.layouts import vptq
from tests import vptq_cases
from tests.oracle import vptq_numpy

CASES = [  # name, make_case kwargs
    ("plain", dict(k=64, n=24, v=8, c=16)),
    ("residual_bf16", dict(k=48, n=20, v=4, c=32, r=8, dtype=torch.bfloat16, seed=1)),
    ("groups_perm_norm", dict(k=96, n=16, v=8, c=64, r=4, gs=32, perm=True, norm=True, seed=2)),
    ("outliers", dict(k=80, n=18, v=6, c=8, os=16, vo=4, co=16, norm=True, perm=True, seed=3)),
    ("padded_group_norm_dim1", dict(k=70, n=12, v=4, c=4, gs=32, norm=True, norm_dim=1, seed=4,
                                    dtype=torch.bfloat16)),
    ("wide_codes", dict(k=40, n=8, v=2, c=1 << 12, r=1 << 10, seed=5)),
]


def packed_case(kw: dict) -> tuple[dict, dict, torch.Tensor]:
    meta, t = vptq_cases.make_case("c", **kw)
    p = vptq_cases.params(meta)
    return meta, t, vptq.pack_indices(t["idx"], t.get("res"), p)


@pytest.mark.parametrize(("name", "kw"), CASES, ids=[c[0] for c in CASES])
def test_decode_matches_float64_oracle(name: str, kw: dict) -> None:
    meta, t, packed = packed_case(kw)
    scheme = vptq_cases.scheme(meta)
    tensors = vptq_cases.checkpoint_tensors(meta, t, packed)
    w = vptq.dequantize(tensors, scheme)
    assert w.dtype == getattr(torch, meta["dtype"]) and w.shape == (meta["N"], meta["K"])
    ref = vptq_numpy.dequantize(meta, {k: v.double().numpy() for k, v in t.items()}, packed.numpy())
    assert torch.equal(w.double(), torch.from_numpy(ref)), name
    rows = vptq.decode_rows(tensors, scheme, meta["v"] * 1, meta["N"] - 1)  # an unaligned end
    assert torch.equal(rows, w[meta["v"]:meta["N"] - 1])


def test_unpack_reads_the_oracle_bit_fields() -> None:
    p = vptq.VptqParams(vector_len=4, num_centroids=1 << 13, group_num=1, group_size=11, num_res_centroids=1 << 11)
    words = torch.randint(-(1 << 31), 1 << 31, (3, 5, p.words), generator=torch.Generator().manual_seed(0),
                          dtype=torch.int64).to(torch.int32)
    main, res = vptq.unpack_indices(words, p)
    for a in range(3):
        for b in range(5):
            for i in range(11):
                code = vptq_numpy.field([int(w) for w in words[a, b]], 24 * i, 24)
                assert (int(main[a, b, i]), int(res[a, b, i])) == (code & 0x1FFF, code >> 13)


def test_pack_round_trips() -> None:
    meta, t, packed = packed_case(dict(k=50, n=8, v=4, c=1 << 16, r=1 << 16))  # 32-bit codes
    main, res = vptq.unpack_indices(packed, vptq_cases.params(meta))
    assert packed.dtype == torch.int32 and torch.equal(main, t["idx"]) and torch.equal(res, t["res"])


def broken(edit) -> tuple[dict, object]:
    meta, t, packed = packed_case(dict(k=80, n=18, v=6, c=8, os=16, vo=4, co=16, norm=True, perm=True))
    tensors = vptq_cases.checkpoint_tensors(meta, t, packed)
    edit(tensors)
    return tensors, vptq_cases.scheme(meta)


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t: t.pop("centroids.weight"), "centroids.weight: missing"),
    (lambda t: t.update(indices=t["indices"][:, :1]), "indices: expected shape [1, 3, 6] dtype torch.int32"),
    (lambda t: t.update(perm=t["perm"].long()), "perm: expected shape [80] dtype torch.int16"),
    (lambda t: t["weight_scale"].__setitem__(3, float("nan")), "weight_scale: holds NaN or infinite values"),
    (lambda t: t["outlier_indices"].__setitem__((0, 0, 0), 16), "outlier_indices: code 16 is outside the 16-entry"),
    (lambda t: t["perm"].__setitem__(0, t["perm"][1]), "perm: expected a permutation of 0..79"),
])
def test_validation_names_the_tensor(edit, needle: str) -> None:
    tensors, scheme = broken(edit)
    with pytest.raises(vptq.VptqLayoutError, match=None) as err:
        vptq.validate(tensors, scheme)
    assert needle in str(err.value)


@pytest.mark.parametrize(("kw", "needle"), [
    (dict(num_centroids=12), "num_centroids must be a power of two"),
    (dict(num_centroids=1 << 20, num_res_centroids=1 << 16), "exceed 32"),
    (dict(outlier_size=4), "outlier_size 4 needs outlier_vector_len"),
    (dict(norm_dim=2), "norm_dim must be 0"),
])
def test_params_refuse_impossible_layers(kw: dict, needle: str) -> None:
    base = dict(vector_len=8, num_centroids=256, group_num=1, group_size=64)
    with pytest.raises(vptq.VptqLayoutError, match=needle):
        vptq.VptqParams(**(base | kw))


def test_groups_must_cover_in_features() -> None:
    p = vptq.VptqParams(vector_len=8, num_centroids=256, group_num=2, group_size=16)
    assert "cover fewer than in_features 40" in vptq.shape_errors(p, 40, 8)[0]
    assert "leaves the last group empty" in vptq.shape_errors(p, 16, 8)[0]
