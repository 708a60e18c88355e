"""Small layers of every kernel family that builds on the CPU, for the tensor-parallel format matrix
(tests/test_shard_formats.py); the formats tests/tp_cases.py covers come from there."""

from __future__ import annotations

import torch

from tests.tp_cases import CASES as TP_CASES
from tests.tp_cases import make_layer

# Left out (no CPU kernel): Marlin, Machete, BitBLAS, AWQ GEMV / GEMV-fast; they cut through the canonical form as
# GPTQ / AWQ do. ExLlamaV2's buffers decode on the CPU: tests/test_shard_formats.py cuts one onto the CPU's kernel.
STORED = ("exl2_aligned", "exl2_ragged", "exl3_3inst", "exl3_mcg_signs", "vptq_outliers_perm", "vptq_norm_out",
          "paroquant")
OTHER = ("mlx_4bit", "mlx_3bit", "qqq_channel", "qqq_grouped")
CASES = TP_CASES + STORED + OTHER


def _exl2(groups: tuple[tuple[int, int], ...], n: int) -> torch.nn.Module:
    from qlinear.kernels.exl2 import Exl2TorchLinear
    from qlinear.layouts import exl2
    from qlinear.spec import Scheme
    from tests.test_exl2 import module

    p = exl2.Exl2Params(tuple(b for b, _ in groups), tuple(r for _, r in groups))
    t, _, _ = module(p, 5, n)  # random codes, scale codes and input permutation, with a bias
    s = Scheme(bits=p.max_bits, group_size=-1, in_features=p.in_features, out_features=n, method="exl2",
               format="exl2", layout_params=p)
    layer = Exl2TorchLinear(s, bias=True, dtype=torch.float32)
    layer.load_state_dict(t, strict=True)
    return layer


def _exl3(k: int, n: int, bits: int, codebook: str, signs: bool) -> torch.nn.Module:
    from qlinear.kernels.exl3 import ExllamaV3TorchLinear
    from qlinear.layouts.exl3 import Exl3Params
    from tests.test_exl3_kernels import random_tensors, scheme

    p = Exl3Params(bits, codebook, signs)
    t = random_tensors(k, n, p, 2)
    t["bias"] = torch.randn(n, generator=torch.Generator().manual_seed(3)).half()
    layer = ExllamaV3TorchLinear(scheme(k, n, p), bias=True, dtype=torch.float32)
    layer.load_state_dict(t, strict=True)
    return layer


def _vptq(**kw: object) -> torch.nn.Module:
    from qlinear.kernels.vptq import VPTQLinear
    from qlinear.layouts import vptq
    from tests import vptq_cases

    meta, t = vptq_cases.make_case("shard", **kw)
    packed = vptq.pack_indices(t["idx"], t.get("res"), vptq_cases.params(meta))
    layer = VPTQLinear(vptq_cases.scheme(meta), bias=True, dtype=torch.float32)
    layer.load_state_dict(vptq_cases.checkpoint_tensors(meta, t, packed) | {"bias": t["bias"]}, strict=True)
    return layer


def make_case(case: str) -> tuple[torch.nn.Module, torch.dtype]:
    """The whole layer of ``case`` on the CPU and the activation dtype to run it with."""
    if case in TP_CASES:
        return make_layer(case, seed=3), torch.float32
    if case == "exl2_aligned":  # group bounds at every quarter of K=256
        return _exl2(((8, 64), (6, 64), (4, 64), (4, 64)), 128), torch.float32
    if case == "exl2_ragged":  # bounds 0, 32, 64, 96, 160, 192, 256: no even row cut
        return _exl2(((8, 32), (6, 32), (5, 32), (4, 64), (3, 32), (2, 64)), 64), torch.float32
    if case == "exl3_3inst":
        return _exl3(512, 512, 3, "3inst", False), torch.float32
    if case == "exl3_mcg_signs":
        return _exl3(256, 256, 2, "mcg", True), torch.float32
    if case == "vptq_outliers_perm":  # decoded column bounds 0, 128, 192, 256: rows cut in two only
        return _vptq(k=256, n=64, v=8, c=64, r=16, gs=64, os=64, vo=4, co=16, perm=True, norm=True, bias=True,
                     seed=1), torch.float32
    if case == "vptq_norm_out":
        return _vptq(k=256, n=96, v=6, c=32, gs=128, norm=True, norm_dim=1, bias=True, seed=2), torch.float32
    if case == "paroquant":
        from tests.test_paroquant import make_layer as make_paro

        return make_paro(256, 128, 64, 4, seed=4)[0], torch.float16
    if case.startswith("mlx"):
        from tests.test_mlx_kernel import layer_for, random_mlx

        bits = 4 if case == "mlx_4bit" else 3
        bias = torch.randn(128, generator=torch.Generator().manual_seed(6)).half()
        return layer_for(random_mlx(128, 256, bits, 64 if bits == 4 else 32, torch.float16, 6), bias), torch.float16
    if case.startswith("qqq"):
        from tests.test_qqq_kernels import layer_for as qqq_layer
        from tests.test_qqq_kernels import random_weight

        gs = 256 if case == "qqq_channel" else 128
        bias = torch.randn(128, generator=torch.Generator().manual_seed(7)) * 0.1
        return qqq_layer(random_weight(128, 256, gs, 7), torch.float16, bias), torch.float16
    raise KeyError(case)
