"""``ParoQuantTritonLinear`` in Triton's CPU interpreter against ``ParoLinear`` (the exact Torch layer, itself
bit-exact with GPTQModel, tests/external/test_gptqmodel_paro.py) and a float64 product: the rotated input is the
Torch layer's bit for bit, the product within the Triton kernels' accumulation tolerance; the checkpoint tensors and
``release_checkpoint`` keep the rotation. Small shapes; TRITON_INTERPRET=1 is set at collection (see
test_triton_interpret.py)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from qlinear.kernels.paro_base import ParoQuantBase
from qlinear.kernels.paroquant import ParoLinear, ParoQuantTritonLinear
from qlinear.layouts.paroquant import ParoParams
from qlinear.spec import Scheme
from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"
TOL = {torch.float16: 4e-3, torch.bfloat16: 1.5e-2}


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import qmm

    with interpreted(qmm.qmm_kernel):
        yield


def state(k: int, n: int, gs: int, krot: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "qweight": torch.randint(-2**31, 2**31 - 1, (k, n // 8), dtype=torch.int32, generator=g),
        "qzeros": torch.randint(-2**31, 2**31 - 1, (k // gs, n // 8), dtype=torch.int32, generator=g),
        "scales": (torch.rand(k // gs, n, generator=g) * 0.02 + 0.001).half(),
        "pairs": torch.stack([torch.cat([torch.randperm(gs, generator=g) for _ in range(k // gs)])
                              for _ in range(krot)]).to(torch.int16),
        "theta": ((torch.rand(krot, k // 2, generator=g) * 2 - 1) * 3.2).half(),
        "channel_scales": (torch.rand(1, k, generator=g) * 1.5 + 0.5).half(),
        "bias": (torch.randn(n, generator=g) * 0.1).half(),
    }


def pair(k: int, n: int, gs: int, krot: int, dtype: torch.dtype, seed: int, **kw: bool):
    s = Scheme(bits=4, group_size=gs, in_features=k, out_features=n, method="paroquant", format="paroquant",
               layout_params=ParoParams(krot))
    sd = state(k, n, gs, krot, seed)
    exact, tri = ParoLinear(s, bias=True), ParoQuantTritonLinear(s, bias=True, dtype=dtype, **kw)
    exact.load_state_dict(sd, strict=True)
    tri.load_state_dict(sd, strict=True)
    return exact, tri


@pytest.mark.parametrize(("k", "n", "gs", "krot", "dtype", "m"), [
    (128, 64, 64, 8, torch.float16, 1),
    (256, 72, 128, 2, torch.bfloat16, 5),
    (96, 32, 32, 1, torch.float16, 40),
])
def test_triton_layer_matches_exact_layer(k: int, n: int, gs: int, krot: int, dtype: torch.dtype, m: int) -> None:
    exact, tri = pair(k, n, gs, krot, dtype, seed=k + m)
    x = torch.randn(m, k).to(dtype)
    tri.ensure_prepared()
    exact.ensure_prepared()
    rot = tri.rotate_input(x)
    assert torch.equal(rot, exact.rotate_input(x))
    y = tri(x)
    assert y.dtype == dtype and y.shape == (m, n)
    assert torch.equal(y, tri.matmul(rot))
    ref = exact(x).double()
    w64 = exact.dequantize(torch.float64)
    ref64 = rot.double() @ w64.t() + exact.bias.double()
    scale = ref64.abs().max().item()
    assert (y.double() - ref64).abs().max().item() <= TOL[dtype] * scale
    assert (y.double() - ref).abs().max().item() <= 2 * TOL[dtype] * scale


def test_checkpoint_names_and_release_keep_the_rotation() -> None:
    exact, tri = pair(128, 32, 64, 2, torch.float16, seed=3, release_checkpoint=True)
    assert sorted(exact.state_dict()) == sorted(["qweight", "qzeros", "scales", "pairs", "theta", "channel_scales",
                                                 "bias"])
    x = torch.randn(3, 128).half()
    y = tri(x)  # prepares, then drops qweight/qzeros/scales only
    assert tri.checkpoint_released and tri.qweight is None and tri.theta is not None
    assert torch.equal(tri(x), y)
    torch.testing.assert_close(y, exact(x), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("k", "gs", "krot", "dtype", "m"), [
    (256, 128, 8, torch.bfloat16, 37),  # rows past one block, the reference's default shape class
    (96, 96, 3, torch.float16, 5),  # one group of 96: 48 pairs in a 64-wide block (masked lanes)
    (192, 32, 1, torch.bfloat16, 1),
    (128, 64, 8, torch.float16, 16),
])
def test_triton_rotation_is_bit_exact(k: int, gs: int, krot: int, dtype: torch.dtype, m: int) -> None:
    from qlinear.kernels.triton.paro_rotate import rotate

    _, tri = pair(k, 16, gs, krot, dtype, seed=k * krot + m)
    tri.ensure_prepared()
    ops = tri.rotation_operands(dtype, torch.device("cpu"))
    x = (torch.randn(m, k) * torch.logspace(-3, 3, k)).to(dtype)
    want = ParoQuantBase.rotate_input(tri, x)  # the torch transform (checked against GPTQModel)
    got = rotate(x, ops.group_maps, ops.cos, ops.sin, ops.scales, gs, interpreting=True)
    assert got.dtype == dtype and torch.equal(got, want)
    assert torch.equal(tri.rotate_input(x), want)


def test_gradients_take_the_torch_rotation() -> None:
    _, tri = pair(128, 32, 64, 2, torch.float16, seed=8)
    x = torch.randn(2, 128, dtype=torch.float16, requires_grad=True)
    tri.ensure_prepared()
    rot = tri.rotate_input(x)
    assert rot.requires_grad and rot.grad_fn is not None
    rot.float().sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


SM90_PTX = """
import json, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qlinear.kernels.triton.paro_rotate import COMPILE_OPTIONS, _rotate_kernel as fn
out = {}
for dt in ("fp16", "bf16"):
    consts = {"KROT": 8, "HALF": 64, "BLOCK_H": 64, "BLOCK_M": 16, "BF16_BITS": False}
    ptrs = {"X": "*" + dt, "OUT": "*" + dt, "GMAP": "*i32", "COS": "*" + dt, "SIN": "*" + dt, "SCALES": "*" + dt}
    sig = {a: "constexpr" if a in consts else ptrs.get(a, "i32") for a in fn.arg_names}
    src = ASTSource(fn, sig, constexprs=consts)
    opts = {"num_warps": 4, **COMPILE_OPTIONS}
    out[dt] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
json.dump(out, sys.stdout)
"""


def test_sm90_ptx_rounds_every_operation() -> None:
    """Compiled for sm_90 on this CPU (Triton's bundled toolchain) with the launcher's options: no ``fma`` (a fused
    ``x_i*c + x_j*s`` would round once, not three times) and every float op with an explicit ``.rn`` (ptxas may not
    contract those)."""
    import json
    import re
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", SM90_PTX], env=env, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        if "ptxas" in run.stderr or "GPUTarget" in run.stderr:
            pytest.skip(f"sm_90 toolchain unavailable: {run.stderr[-300:]}")
        raise AssertionError(run.stderr[-3000:])
    for dt, ptx in json.loads(run.stdout).items():
        assert not re.search(r"\bfma\.", ptx), dt
        ops = re.findall(r"\t((?:mul|add|sub)[.\w]*?\.b?f16)\s", ptx)
        assert ops and all(".rn." in op for op in ops), (dt, sorted(set(ops)))
