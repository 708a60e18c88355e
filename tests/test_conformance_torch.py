"""Conformance: every combination TorchLinear declares, which the selector accepts here, runs and is right.

The declared space (formats x bits x groups x desc_act x sym x activation dtypes x pack dtypes) is
enumerated; combinations no checkpoint can have (Scheme raises: 5-bit continuous, 3-bit int16) are
skipped as invalid input, everything else must be accepted by the selector and match the float64
oracle. A deterministic sample keeps the run short.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from qlinear import BACKEND, FORMAT, Problem, QuantLinear, Scheme, Target, TorchLinear, quantize_rtn, select
from qlinear.spec import ConfigError
from tests.oracle.gptq_numpy import dequantize_checkpoint

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
K, N = 1024, 32


def declared() -> list[tuple]:
    caps = TorchLinear.caps
    space = itertools.product(sorted(caps.formats, key=str), sorted(caps.bits), sorted(caps.group_sizes),
                              sorted(caps.desc_act), sorted(caps.sym), sorted(caps.dtypes, key=str),
                              sorted(caps.pack_dtypes, key=str))
    valid = []
    for fmt, bits, group, desc, sym, dtype, pack in space:
        try:
            Scheme(bits=bits, group_size=group, in_features=K, out_features=N, sym=sym, desc_act=desc, format=fmt,
                   pack_dtype=pack)
        except ConfigError:
            continue
        valid.append((fmt, bits, group, desc, sym, dtype, pack))
    return valid


SAMPLE = random.Random(2026).sample(declared(), 48)


def test_declared_space_is_large_and_sampled() -> None:
    assert len(declared()) > 500 and len(SAMPLE) == 48


@pytest.mark.parametrize(("fmt", "bits", "group", "desc", "sym", "dtype", "pack"), SAMPLE)
def test_declared_combination_runs_correctly(fmt: FORMAT, bits: int, group: int, desc: bool, sym: bool,
                                              dtype: torch.dtype, pack: torch.dtype) -> None:
    scheme = Scheme(bits=bits, group_size=group, in_features=K, out_features=N, sym=sym, desc_act=desc, format=fmt,
                    pack_dtype=pack)
    choice = select(Problem(scheme, dtype), Target.here("cpu"), BACKEND.GPTQ_TORCH)
    assert choice.kernel is TorchLinear
    g = torch.Generator().manual_seed(bits * 7 + group)
    w = torch.randn(N, K, generator=g) * 0.02
    w[:, ::8] = -0.05  # keeps asymmetric zero points above 0 (v1 cannot hold 0)
    q = quantize_rtn(w, bits=bits, group_size=group, sym=sym, desc_act=desc)
    layer = QuantLinear.create(q, format=fmt, backend="gptq_torch", dtype=dtype, pack_dtype=pack)
    sd = {k: v.numpy() for k, v in layer.state_dict().items()}
    w64 = dequantize_checkpoint(sd, bits, K, N, fmt.value)
    x = torch.randn(3, K, generator=g).to(dtype)
    ref = x.double().numpy() @ w64.T
    err = np.abs(layer(x).double().numpy() - ref).max() / np.abs(ref).max()
    assert err < TOL[dtype]
