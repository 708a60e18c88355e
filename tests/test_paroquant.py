"""ParoQuant (``layouts/paroquant.py``, ``kernels/paroquant.py``): the input rotation and the layer against a float64
reference written here (an explicit rotation matrix per round, a dense product), the producer's own pieces where
they run on a CPU (paroquant 0.1.16's pair layout ``transform_to_kernel_data`` and its AWQ packer ``_pack_awq`` /
``_to_awq_buffers``, exec'd from its ``cli/convert.py`` because importing that module builds its CUDA extension),
and bad input. Bit-exactness with GPTQModel 7.7.0's ParoLinear: tests/external/test_gptqmodel_paro.py."""

from __future__ import annotations

import ast
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from qlinear.affine import AffineWeight
from qlinear.caps import Problem
from qlinear.enums import BACKEND
from qlinear.kernels.paroquant import ParoLinear
from qlinear.layouts import paroquant
from qlinear.layouts.paroquant import ParoParams, RotationError
from qlinear.select import NoKernelError, select
from qlinear.spec import Scheme
from qlinear.target import Target


def scheme(k: int, n: int, gs: int, krot: int) -> Scheme:
    return Scheme(bits=4, group_size=gs, in_features=k, out_features=n, method="paroquant", format="paroquant",
                  layout_params=ParoParams(krot))


def random_rotation(k: int, gs: int, krot: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    pairs = torch.stack([torch.cat([torch.randperm(gs, generator=g) for _ in range(k // gs)])
                         for _ in range(krot)]).to(torch.int16)
    theta = ((torch.rand(krot, k // 2, generator=g) * 2 - 1) * 3.2).half()
    scales = (torch.rand(1, k, generator=g) * 1.5 + 0.5).half()
    return {"pairs": pairs, "theta": theta, "channel_scales": scales}


def rotation64(x: torch.Tensor, pairs: torch.Tensor, theta: torch.Tensor, scales: torch.Tensor,
               gs: int) -> torch.Tensor:
    """x @ (diag(scales) R_0 ... R_{krot-1}) in float64, R_r the Givens rotations of round r as a K x K matrix."""
    k = x.shape[-1]
    m = torch.diag(scales.double().reshape(-1))
    for r in range(pairs.shape[0]):
        rot = torch.eye(k, dtype=torch.float64)
        for p in range(k // 2):
            g0 = (2 * p // gs) * gs
            i, j = g0 + int(pairs[r, 2 * p]), g0 + int(pairs[r, 2 * p + 1])
            c, s = math.cos(float(theta[r, p])), math.sin(float(theta[r, p]))
            rot[i, i], rot[j, i], rot[i, j], rot[j, j] = c, s, -s, c
        m = m @ rot
    return x.double() @ m


def make_layer(k: int, n: int, gs: int, krot: int, seed: int = 0, bias: bool = True) -> tuple[ParoLinear, AffineWeight]:
    g = torch.Generator().manual_seed(seed)
    groups = k // gs
    q = AffineWeight(codes=torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                     scales=(torch.rand(n, groups, generator=g) * 0.02 + 0.001).half().float(),
                     zeros=torch.randint(0, 16, (n, groups), dtype=torch.int32, generator=g),
                     g_idx=torch.arange(k, dtype=torch.int32) // gs, bits=4, group_size=gs, sym=True)
    layer = ParoLinear(scheme(k, n, gs, krot), bias=bias)
    layer.load_affine(q, (torch.randn(n, generator=g) * 0.1).half() if bias else None)
    layer.load_rotation(**random_rotation(k, gs, krot, g))
    return layer, q


@pytest.mark.parametrize(("k", "gs", "krot"), [(128, 64, 8), (96, 32, 3), (64, 64, 1)])
def test_rotation_matches_float64(k: int, gs: int, krot: int) -> None:
    g = torch.Generator().manual_seed(k + krot)
    t = random_rotation(k, gs, krot, g)
    x = torch.randn(7, k, generator=g)
    plan = paroquant.plan_rotation(t["pairs"], t["theta"], t["channel_scales"], gs)
    ref = rotation64(x.double(), t["pairs"], t["theta"].double(), t["channel_scales"], gs)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-2), (torch.bfloat16, 1.5e-1)):
        cos, sin = paroquant.cos_sin(t["theta"], dtype)
        got = paroquant.rotate(x.to(dtype), plan, cos, sin, t["channel_scales"])
        assert got.dtype == dtype
        # float64 reference on the dtype-rounded input: each round rounds to dtype, errors grow with krot
        ref = rotation64(x.to(dtype).double(), t["pairs"], t["theta"].double(), t["channel_scales"], gs)
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * (1 + krot))


def paroquant_cuda_rotation(x: torch.Tensor, pairs: torch.Tensor, theta: torch.Tensor, scales: torch.Tensor,
                            gs: int) -> torch.Tensor:
    """paroquant 0.1.16's CUDA kernel (``kernels/cuda/rotation.cuh``, half path), transcribed: it cannot run here.
    Angles cast to half; ``x * scale`` in half; per round, for thread ``t`` of group ``g``: the int16 pair at
    ``pairs[r, g*gs + 2t]`` (i, low half) and ``+1`` (j), angle ``theta[r, g*gs/2 + t]``, then in float32
    ``fmaf(c, xi, s*xj)`` and ``fmaf(c, xj, -s*xi)`` (the FMA emulated in float64) rounded to half."""
    k = x.shape[-1]
    out = (x.float() * scales.reshape(-1).float()).half()
    th = theta.half().float()
    offs = (torch.arange(k // 2) * 2 // gs) * gs
    for r in range(pairs.shape[0]):
        i = offs + pairs[r, 0::2].long()
        j = offs + pairs[r, 1::2].long()
        c, s = th[r].cos(), th[r].sin()
        xi, xj = out[:, i].float(), out[:, j].float()
        nxt = out.clone()
        nxt[:, i] = (c.double() * xi.double() + (s * xj).double()).float().half()
        nxt[:, j] = (c.double() * xj.double() + (-s * xi).double()).float().half()
        out = nxt
    return out


def test_rotation_agrees_with_paroquants_cuda_arithmetic() -> None:
    """Same pair/angle/scale layout and signs as the producer's kernel: the two differ only by its fewer roundings
    (about 1e-3 of the norm after 8 rounds in float16, both that close to the exact transform)."""
    g = torch.Generator().manual_seed(4)
    t = random_rotation(256, 128, 8, g)
    x = torch.randn(32, 256, generator=g).half()
    plan = paroquant.plan_rotation(t["pairs"], t["theta"], t["channel_scales"], 128)
    cos, sin = paroquant.cos_sin(t["theta"], torch.float16)
    ours = paroquant.rotate(x, plan, cos, sin, t["channel_scales"]).double()
    theirs = paroquant_cuda_rotation(x, t["pairs"], t["theta"], t["channel_scales"], 128).double()
    exact = rotation64(x.double(), t["pairs"], t["theta"].double(), t["channel_scales"], 128)
    assert float((ours - theirs).norm() / theirs.norm()) < 3e-3
    assert float((theirs - exact).norm() / exact.norm()) < 2e-3 and float((ours - exact).norm() / exact.norm()) < 2e-3


def test_layer_matches_float64_product() -> None:
    layer, q = make_layer(128, 48, 32, 4)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 128, generator=g).half()
    y = layer(x)
    assert y.shape == (2, 3, 48) and y.dtype == torch.float16
    w64 = (q.codes.double() - q.zeros.double()[:, q.g_idx.long()]) * q.scales.double()[:, q.g_idx.long()]
    rot = rotation64(x.reshape(-1, 128).double(), layer.pairs, layer.theta.double(), layer.channel_scales, 32)
    ref = rot @ w64.t() + layer.bias.double()
    torch.testing.assert_close(y.reshape(-1, 48).double(), ref, rtol=2e-2, atol=3e-2)


def test_identity_rotation_is_the_awq_product() -> None:
    layer, q = make_layer(64, 16, 32, 2, bias=False)
    layer.load_rotation(**paroquant.identity_rotation(layer.scheme))
    x = torch.randn(4, 64).half()
    w = q.dequantize(torch.float32).half()
    assert torch.equal(layer(x), x @ w.t())


def test_krot_and_selection() -> None:
    s = scheme(128, 64, 128, 8)
    assert paroquant.rotation_shapes(s)["theta"] == ((8, 64), torch.float16)
    choice = select(Problem(s, torch.float16), Target.fake_cpu())
    assert choice.backend is BACKEND.PAROQUANT_CUDA
    layer = ParoLinear(s)
    assert sorted(layer.state_dict()) == ["channel_scales", "pairs", "qweight", "qzeros", "scales", "theta"]
    assert layer(torch.zeros(1, 128, dtype=torch.bfloat16)).abs().max() == 0


def test_backward_reaches_the_input() -> None:
    layer, _ = make_layer(64, 16, 32, 2)
    x = torch.randn(3, 64, dtype=torch.float16, requires_grad=True)
    layer(x).float().sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape and bool(torch.isfinite(x.grad).all())


def producer_convert_functions() -> dict[str, object]:
    """``_AWQ_REORDER``, ``_pack_awq`` and ``_to_awq_buffers`` of paroquant's converter, exec'd from its source."""
    spec = importlib.util.find_spec("paroquant")
    if spec is None or spec.origin is None:
        pytest.skip("paroquant missing: pip install --no-deps paroquant==0.1.16")
    source = (Path(spec.origin).parent / "cli" / "convert.py").read_text()
    wanted = {"_AWQ_REORDER", "_pack_awq", "_to_awq_buffers"}
    body = [node for node in ast.parse(source).body
            if (isinstance(node, ast.FunctionDef) and node.name in wanted)
            or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) in wanted for t in node.targets))]
    namespace: dict[str, object] = {"torch": torch}
    exec(compile(ast.Module(body=body, type_ignores=[]), "paroquant/cli/convert.py", "exec"), namespace)
    return namespace


def test_producer_packer_gives_the_layer_buffers() -> None:
    ns = producer_convert_functions()
    layer, q = make_layer(128, 64, 64, 1, seed=3)
    theirs = ns["_to_awq_buffers"](q.codes.to(torch.int32), q.scales, q.zeros)  # type: ignore[operator]
    for name in ("qweight", "qzeros", "scales"):
        assert theirs[name].dtype == getattr(layer, name).dtype, name
        assert torch.equal(theirs[name], getattr(layer, name)), name


def test_producer_pair_layout_is_accepted() -> None:
    pytest.importorskip("paroquant", reason="pip install --no-deps paroquant==0.1.16")
    from paroquant.optim.rotation import transform_to_kernel_data

    g = torch.Generator().manual_seed(9)
    k, gs = 128, 64
    pairs_group, angles_group = [], []
    for _ in range(2):  # two rounds of a few disjoint pairs per group, the rest padded with dummy pairs
        chosen = []
        for grp in range(k // gs):
            perm = torch.randperm(gs, generator=g)[:20] + grp * gs
            chosen.append(perm.reshape(10, 2))
        pairs_group.append(torch.cat(chosen))
        angles_group.append(torch.rand(20, generator=g))
    pairs, theta, _ = transform_to_kernel_data(pairs_group, angles_group, group_size=gs)
    plan = paroquant.plan_rotation(pairs, theta.half(), torch.ones(1, k, dtype=torch.float16), gs)
    x = torch.randn(3, k)
    cos, sin = paroquant.cos_sin(theta, torch.float32)
    got = paroquant.rotate(x, plan, cos, sin, torch.ones(1, k))
    ref = rotation64(x.double(), pairs, theta.double(), torch.ones(1, k), gs)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_bad_rotations_are_named() -> None:
    layer, _ = make_layer(64, 16, 32, 2)
    t = random_rotation(64, 32, 2, torch.Generator().manual_seed(1))
    dup = t["pairs"].clone()
    dup[1, 3] = dup[1, 4]
    with pytest.raises(RotationError, match="pairs: round 1, group 0 is not a permutation"):
        layer.load_rotation(dup, t["theta"], t["channel_scales"])
    far = t["pairs"].clone()
    far[0, 40] = 32
    with pytest.raises(RotationError, match="pairs: local index 32 at round 0, group 1"):
        layer.load_rotation(far, t["theta"], t["channel_scales"])
    nan = t["theta"].clone()
    nan[1, 5] = float("nan")
    with pytest.raises(RotationError, match=r"theta: expected finite values, found nan at index \[1, 5\]"):
        layer.load_rotation(t["pairs"], nan, t["channel_scales"])
    with pytest.raises(RotationError, match=r"theta: expected shape \[2, 32\]"):
        layer.load_rotation(t["pairs"], t["theta"][:, :16], t["channel_scales"])
    with pytest.raises(RotationError, match=r"channel_scales: expected shape \[1, 64\]"):
        layer.load_rotation(t["pairs"], t["theta"], t["channel_scales"][:, :32])
    with pytest.raises(RotationError, match="krot=2"):
        layer.load_rotation(t["pairs"][:1], t["theta"][:1], t["channel_scales"])
    state = layer.state_dict()
    state["pairs"] = dup
    layer.load_state_dict(state)
    with pytest.raises(RotationError, match="not a permutation"):
        layer(torch.zeros(1, 64, dtype=torch.float16))


def test_bad_schemes_and_inputs() -> None:
    with pytest.raises(RotationError, match="krot"):
        ParoParams(0)
    with pytest.raises(RotationError, match="group_size: the rotation pairs channels"):
        paroquant.check_scheme(scheme(96, 16, 36, 1))
    with pytest.raises(RotationError, match="bits: ParoQuant stores 4-bit"):
        paroquant.check_scheme(Scheme(bits=8, group_size=32, in_features=64, out_features=16, method="paroquant",
                                      format="paroquant"))
    with pytest.raises(RotationError, match="expected method/format paroquant, got paroquant/gemm"):
        ParoLinear(Scheme(bits=4, group_size=32, in_features=64, out_features=16, method="paroquant", format="gemm"))
    layer, _ = make_layer(64, 16, 32, 1)
    with pytest.raises(ValueError, match="input: expected last dimension 64"):
        layer(torch.zeros(2, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match="input: dtype torch.float32 not supported"):
        layer(torch.zeros(2, 64))
    with pytest.raises(NoKernelError, match="out_features 12 not a multiple of 8"):
        select(Problem(scheme(64, 12, 32, 1), torch.float16), Target.fake_cpu(), BACKEND.PAROQUANT_CUDA)
