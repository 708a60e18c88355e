"""The MLX checkpoint holders (``kernels/mlx_holders.py``): each holds its format's tensors, refuses a Torch forward,
and ``to_mlx()`` gives an MLX module that mlx itself (CPU wheel) runs: its dequantized weight equals the float64
truth exactly and its output the float64 product within float16 rounding; a holder loaded from a Torch kernel's
state dict agrees with that kernel's forward; weights MLX cannot hold exactly are refused, naming why."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from qlinear.affine import AffineWeight, quantize_rtn
from qlinear.caps import Problem
from qlinear.kernels import mlx_holders as h
from qlinear.kernels.registry import kernel_by_name
from qlinear.mlx_convert import MlxConversionError
from qlinear.spec import Scheme
from qlinear.target import Target
from tests.mlx_support import need_mlx

K, N = 256, 96
#: (holder, format, method, symmetric)
HOLDERS = [(h.MlxQuantLinear, "gptq", "gptq", True), (h.MlxQuantLinear, "gptq_v2", "gptq", False),
           (h.AwqMlxQuantLinear, "gemm", "awq", False), (h.AwqGemvMlxQuantLinear, "gemv", "awq", False),
           (h.AwqGemvFastMlxQuantLinear, "gemv_fast", "awq", False), (h.LLMAwqMlxQuantLinear, "llm-awq", "awq", False),
           (h.GPTQBitBLASMlxQuantLinear, "bitblas", "gptq", True),
           (h.AWQBitBLASMlxQuantLinear, "bitblas", "awq", False)]


def weight(bits: int, group: int, sym: bool, seed: int) -> AffineWeight:
    """A round-to-nearest weight whose scales have 3 significant bits, so every ``scale * (q - z)`` and
    ``-scale * zero`` is exact in float16: the MLX values must then equal the float64 truth bit for bit."""
    g = torch.Generator().manual_seed(seed)
    q = quantize_rtn(torch.randn(N, K, generator=g) * 0.02, bits, group, sym=sym)
    scales = torch.randint(1, 8, q.scales.shape, generator=g).double() * 2.0 ** -9
    return replace(q, scales=scales.to(q.scales.dtype))


def truth(q: AffineWeight) -> torch.Tensor:
    gi = q.g_idx.long()
    return q.scales.double()[:, gi] * (q.codes.double() - q.zeros.double()[:, gi])


def holder(cls: type, fmt: str, method: str, q: AffineWeight, bias: torch.Tensor) -> torch.nn.Module:
    s = Scheme(bits=q.bits, group_size=q.group_size, in_features=K, out_features=N, sym=q.sym, method=method,
               format=fmt)
    layer = cls(s, bias=True)
    layer.load_affine(q, bias=bias)
    return layer


def mlx_out(module: object, x: torch.Tensor) -> torch.Tensor:
    mx = need_mlx()
    return torch.from_numpy(np.array(module(mx.array(x.numpy())).astype(mx.float32))).double()


@pytest.mark.parametrize(("cls", "fmt", "method", "sym"), HOLDERS)
@pytest.mark.parametrize("group", [128, 32])
def test_holder_to_mlx_holds_the_weight_exactly(cls: type, fmt: str, method: str, sym: bool, group: int) -> None:
    mx = need_mlx()
    q = weight(4, group, sym, seed=group)
    bias = (torch.randn(N, generator=torch.Generator().manual_seed(1)) * 0.1).half()
    module = holder(cls, fmt, method, q, bias).to_mlx()
    assert type(module).__name__ == "QuantizedLinear"
    w = mx.dequantize(module.weight, module.scales, module.biases, group_size=module.group_size, bits=module.bits)
    assert torch.equal(torch.from_numpy(np.array(w.astype(mx.float32))).double(), truth(q))
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(2))  # float32: mlx computes in float32
    ref = x.double() @ truth(q).t() + bias.double()
    assert float((mlx_out(module, x) - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize(("cls", "fmt"), [(h.AwqMlxQuantLinear, "gemm")])
def test_groups_of_16_run_as_two_group32_products(cls: type, fmt: str) -> None:
    """MLX has no group 16: the even and odd half-groups each get exact group-32 scales and biases, and each product
    sees only its half's inputs."""
    mx = need_mlx()
    q = weight(4, 16, False, seed=16)
    module = holder(cls, fmt, "awq", q, torch.zeros(N).half()).to_mlx()
    assert type(module).__name__ == "Group16Linear"
    real = truth(q)
    for half, (s, b) in enumerate([(module.scales_even, module.biases_even), (module.scales_odd, module.biases_odd)]):
        w = mx.dequantize(module.weight, s, b, group_size=32, bits=4)
        cols = (torch.arange(K) // 16) % 2 == half
        assert torch.equal(torch.from_numpy(np.array(w.astype(mx.float32))).double()[:, cols], real[:, cols])
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(3))
    ref = x.double() @ real.t()
    assert float((mlx_out(module, x) - ref).abs().max() / ref.abs().max()) < 1e-5


@pytest.mark.parametrize(("torch_kernel", "cls", "fmt", "method", "sym"),
                         [("TorchLinear", h.MlxQuantLinear, "gptq", "gptq", True),
                          ("AwqTorchLinear", h.AwqMlxQuantLinear, "gemm", "awq", False)])
def test_holder_loads_a_torch_kernels_state_dict_and_agrees_with_it(torch_kernel: str, cls: type, fmt: str,
                                                                   method: str, sym: bool) -> None:
    need_mlx()
    q = weight(4, 64, sym, seed=7)
    s = Scheme(bits=4, group_size=64, in_features=K, out_features=N, sym=sym, method=method, format=fmt)
    src = kernel_by_name(torch_kernel)(s, bias=True)
    src.load_affine(q, bias=torch.randn(N, generator=torch.Generator().manual_seed(4)) * 0.1)
    layer = cls(s, bias=True)
    layer.load_state_dict(src.state_dict())
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(5))
    want = src(x).double()
    got = mlx_out(layer.to_mlx(), x)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5


def test_a_torch_forward_is_refused_with_what_to_do() -> None:
    layer = holder(h.MlxQuantLinear, "gptq", "gptq", weight(4, 128, True, 0), torch.zeros(N).half())
    with pytest.raises(RuntimeError, match=r"to_mlx\(\)"):
        layer(torch.zeros(1, K, dtype=torch.float16))


def test_weights_mlx_cannot_hold_are_refused_naming_why() -> None:
    need_mlx()
    act_order = quantize_rtn(torch.randn(N, K) * 0.02, 4, 64, sym=True, desc_act=True, perm=torch.randperm(K))
    s = Scheme(bits=4, group_size=64, in_features=K, out_features=N, sym=True, desc_act=True, method="gptq",
               format="gptq")
    layer = h.MlxQuantLinear(s, bias=False)
    layer.load_affine(act_order)
    with pytest.raises(MlxConversionError, match="act-order"):
        layer.to_mlx()
    seven = holder(h.MlxQuantLinear, "gptq_p", "gptq", weight(7, 128, True, 1), torch.zeros(N).half())
    with pytest.raises(MlxConversionError, match="bits"):
        seven.to_mlx()
    q = quantize_rtn(torch.randn(N, K, generator=torch.Generator().manual_seed(9)) * 0.02, 4, 128, sym=False)
    inexact = holder(h.AwqMlxQuantLinear, "gemm", "awq", replace(q, scales=(q.scales.float() * 1.0009765625 + 1e-4)
                                                               .to(q.scales.dtype)), torch.zeros(N).half())
    with pytest.raises(MlxConversionError, match="biases"):
        inexact.to_mlx()


@pytest.mark.parametrize(("torch_kernel", "cls", "method", "sym"),
                         [("TorchLinear", h.GPTQMarlinMlxQuantLinear, "gptq", True),
                          ("AwqTorchLinear", h.AWQMarlinMlxQuantLinear, "awq", False)])
def test_marlin_holders_take_a_marlin_configs_gptq_or_awq_tensors(torch_kernel: str, cls: type, method: str,
                                                                  sym: bool) -> None:
    """A ``format: marlin`` config's module holds GPTQ v1 (AWQ: GEMM) tensors, as GPTQModel's Marlin holders read
    them: the state dict of the matching Torch kernel loads and converts to the same MLX output."""
    need_mlx()
    q = weight(4, 128, sym, seed=12)
    fmt = "gptq" if method == "gptq" else "gemm"
    src = kernel_by_name(torch_kernel)(Scheme(bits=4, group_size=128, in_features=K, out_features=N, sym=sym,
                                              method=method, format=fmt), bias=True)
    src.load_affine(q, bias=torch.randn(N, generator=torch.Generator().manual_seed(13)) * 0.1)
    layer = cls(Scheme(bits=4, group_size=128, in_features=K, out_features=N, sym=sym, method=method,
                       format="marlin"), bias=True)
    layer.load_state_dict(src.state_dict())
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(14))
    want = src(x).double()
    assert float((mlx_out(layer.to_mlx(), x) - want).abs().max() / want.abs().max()) < 1e-5


def test_every_mlx_holder_of_the_reference_is_implemented() -> None:
    from qlinear.kernels.planned import mlx as declared

    names = {c.__name__ for c in vars(declared).values()
             if isinstance(c, type) and c.__name__.endswith("MlxQuantLinear")}
    assert len(names) == 14 and names == {cls.__name__ for cls in h.KERNELS}
    for cls in h.KERNELS:
        assert kernel_by_name(cls.__name__) is cls and cls.implemented


GGUF_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q6_K"]


def gguf_blocks(name: str, k: int, seed: int) -> np.ndarray:
    """GGML rows of type ``name``: qlinear's ggml-exact encoder on Gaussian weights, or (IQ4, no encoder) random
    bytes with a finite float16 ``d``."""
    from qlinear.layouts import gguf as G

    rng = np.random.default_rng(seed)
    t = G.ggml_type(name)
    info = G.TYPES[t]
    if info.encode is not None:
        return np.asarray(G.quantize(rng.standard_normal((N, k)).astype(np.float32) * 0.05, t))
    raw = rng.integers(0, 256, (N, k // info.block_size * info.type_size), dtype=np.uint8)
    raw.reshape(-1, info.type_size)[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return raw


@pytest.mark.parametrize("name", GGUF_TYPES)
def test_gguf_holder_gives_mlx_the_values_gguf_py_decodes(name: str) -> None:
    """The MLX module's weight (``mx.dequantize``; per half-group for the 16-value K-quants) equals gguf-py's
    dequantization value for value (a zero may be +0 where ggml gives -0), and its float32 output the float64
    product of gguf-py's weight."""
    mx = need_mlx()
    gp = pytest.importorskip("gguf", reason="pip install --no-deps -r requirements/nodeps-gguf.txt")
    from qlinear.layouts import gguf as G

    k = 512
    raw = gguf_blocks(name, k, seed=len(name))
    s = Scheme(bits=G.TYPES[G.ggml_type(name)].bits, group_size=-1, in_features=k, out_features=N, method="gguf",
               format="gguf", qtype=name)
    layer = h.GGUFMlxQuantLinear(s, bias=True)
    layer.load_blocks(torch.from_numpy(raw), bias=torch.randn(N, generator=torch.Generator().manual_seed(6)))
    module = layer.to_mlx()
    want = gp.quants.dequantize(raw, gp.GGMLQuantizationType(G.ggml_type(name).value)).astype(np.float32)
    if name in ("Q2_K", "Q3_K", "Q6_K"):
        assert type(module).__name__ == "Group16Linear"
        halves = [np.array(mx.dequantize(module.weight, sc, b, group_size=32, bits=module.bits))
                  for sc, b in ((module.scales_even, module.biases_even), (module.scales_odd, module.biases_odd))]
        w = np.where((np.arange(k) // 16) % 2 == 0, halves[0], halves[1])
    else:
        assert type(module).__name__ == "QuantizedLinear"
        w = np.array(mx.dequantize(module.weight, module.scales, module.biases, group_size=32, bits=module.bits))
    assert np.array_equal(w, want)
    x = np.random.default_rng(8).standard_normal((3, k)).astype(np.float32)
    ref = x.astype(np.float64) @ want.astype(np.float64).T + layer.bias.double().numpy()
    got = np.array(module(mx.array(x))).astype(np.float64)
    assert float(np.abs(got - ref).max() / np.abs(ref).max()) < 1e-5


def test_gguf_holder_refuses_types_and_rows_mlx_cannot_take() -> None:
    need_mlx()
    from qlinear.layouts import gguf as G

    s = Scheme(bits=1, group_size=-1, in_features=256, out_features=N, method="gguf", format="gguf", qtype="Q1_0")
    reasons = h.GGUFMlxQuantLinear.runtime_reasons(Problem(s), Target.fake_cpu())
    assert any("qtype Q1_0 not run" in r for r in reasons), reasons
    s = Scheme(bits=4, group_size=-1, in_features=80, out_features=N, method="gguf", format="gguf", qtype="Q4_0")
    layer = h.GGUFMlxQuantLinear(s)
    layer.load_blocks(torch.from_numpy(np.zeros((N, 3 * G.TYPES[G.GGMLType.Q4_0].type_size), np.uint8)))
    with pytest.raises(MlxConversionError, match="whole 32-value blocks"):
        layer.to_mlx()


def test_paroquant_holder_rotates_as_the_torch_kernel_and_multiplies_in_mlx() -> None:
    """The MLX module's input rotation is bit-identical to ``ParoLinear``'s (each activation dtype); its float32
    output is the float64 product of that rotated input within 1e-5, and its float16 output ``ParoLinear``'s
    forward within float16 rounding."""
    mx = need_mlx()
    from qlinear.kernels.paroquant import ParoLinear
    from tests.test_paroquant import random_rotation, scheme

    k, n, gs, krot = 128, N, 64, 4
    g = torch.Generator().manual_seed(11)
    q = AffineWeight(codes=torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                     scales=torch.randint(1, 8, (n, k // gs), generator=g).float() * 2.0 ** -9,
                     zeros=torch.randint(0, 16, (n, k // gs), dtype=torch.int32, generator=g),
                     g_idx=torch.arange(k, dtype=torch.int32) // gs, bits=4, group_size=gs, sym=True)
    torch_layer = ParoLinear(scheme(k, n, gs, krot), bias=True)
    torch_layer.load_affine(q, (torch.randn(n, generator=g) * 0.1).half())
    torch_layer.load_rotation(**random_rotation(k, gs, krot, g))
    holder_layer = h.ParoMlxQuantLinear(scheme(k, n, gs, krot), bias=True)
    holder_layer.load_state_dict(torch_layer.state_dict())
    module = holder_layer.to_mlx()
    torch_layer.ensure_prepared()
    x = torch.randn(3, k, generator=g)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        xd = x.to(dtype)
        got = module.rotate(mx.array(xd.float().numpy()).astype(getattr(mx, str(dtype)[6:])))
        want = torch_layer.rotate_input(xd)
        assert torch.equal(torch.from_numpy(np.array(got.astype(mx.float32))), want.float()), dtype
    want = torch_layer.rotate_input(x).double() @ truth(q).t() + torch_layer.bias.double()  # float32 rotation
    assert float((mlx_out(module, x) - want).abs().max() / want.abs().max()) < 1e-5
    x16 = x.half()  # float16 end to end against the Torch kernel's own forward
    want16 = torch_layer(x16).double()
    assert float((mlx_out(module, x16) - want16).abs().max() / want16.abs().max()) < 5e-3


@pytest.mark.parametrize("group", [128, -1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_qqq_holder_computes_what_qqq_torch_linear_computes(group: int, dtype: torch.dtype) -> None:
    """Int8 activations, the int8 weight and exact integer sums in mlx give ``QQQTorchLinear``'s outputs bit for bit
    (K = 1024: two 512-deep chunks, so the int32 sum of the chunks is exercised)."""
    mx = need_mlx()
    from tests.test_qqq_kernels import layer_for, random_weight

    k, n = 1024, 128  # QQQ tiles: N a multiple of 64
    qw = random_weight(n, k, group if group > 0 else k, seed=21)
    bias = (torch.randn(n, generator=torch.Generator().manual_seed(22)) * 0.1).half()
    torch_layer = layer_for(qw, dtype, bias)
    layer = h.QQQMlxQuantLinear(torch_layer.scheme, bias=True)
    layer.load_state_dict(torch_layer.state_dict())
    module = layer.to_mlx()
    x = (torch.randn(4, k, generator=torch.Generator().manual_seed(23)) * 3).to(dtype)
    x[1] = 0  # an all-zero row: scale 0, codes 0
    want = torch_layer(x)
    got = module(mx.array(x.float().numpy()).astype(getattr(mx, str(dtype)[6:])))
    assert torch.equal(torch.from_numpy(np.array(got.astype(mx.float32))).to(dtype), want)


def _torch_then_holder(torch_layer: torch.nn.Module, cls: type) -> torch.nn.Module:
    layer = cls(torch_layer.scheme, bias=torch_layer.bias is not None)
    layer.load_state_dict(torch_layer.state_dict())
    return layer


@pytest.mark.parametrize(("quant_type", "nested", "blocksize"), [("nf4", False, 64), ("fp4", False, 64),
                                                                  ("nf4", True, 128), ("int8", False, 0)])
def test_bitsandbytes_holder_decodes_as_bitsandbytes(quant_type: str, nested: bool, blocksize: int) -> None:
    """The MLX module's float32 weight equals ``BitsAndBytesTorchLinear``'s (bitsandbytes' own dequantization,
    checked against bitsandbytes elsewhere) bit for bit; its output matches that layer's within bfloat16 rounding."""
    mx = need_mlx()
    from qlinear.bnb_build import create_bnb_layer
    from qlinear.bnb_weight import BnbInt8Weight
    from tests.test_bnb_layout import make

    n, k = 47, 201  # 9447 values: an odd count (the last byte half full), the flat blocks end in a partial one
    if quant_type == "int8":
        g = torch.Generator().manual_seed(5)
        w = BnbInt8Weight(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8),
                          torch.rand(n, generator=g) * 0.5 + 0.01)
    else:
        w = make(n, k, quant_type, blocksize, nested, seed=4)
    torch_layer = create_bnb_layer(w, backend="bitsandbytes_torch", bias=torch.randn(n).bfloat16())
    module = _torch_then_holder(torch_layer, h.BitsAndBytesMlxQuantLinear).to_mlx()
    got = torch.from_numpy(np.array(module.weight_values()))
    assert torch.equal(got, torch_layer.dequantize(torch.float32))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(6)).bfloat16()
    want = torch_layer(x).float()
    out = torch.from_numpy(np.array(module(mx.array(x.float().numpy()).astype(mx.bfloat16)).astype(mx.float32)))
    assert float((out - want).abs().max() / want.abs().max()) < 1e-2


@pytest.mark.parametrize("block", [(1, 64), (128, 128), None])
def test_fp8_holder_decodes_as_the_torch_kernel(block: tuple[int, int] | None) -> None:
    """The MLX module's float32 weight equals ``TorchFP8Linear``'s dequantization bit for bit (per-block scales
    that divide, as GPTQModel's fp8 stores them); its output matches that layer's within bfloat16 rounding."""
    mx = need_mlx()
    from qlinear.build import create_float_layer
    from qlinear.float_quant import quantize_fp8

    weight = torch.randn(N, K, generator=torch.Generator().manual_seed(30)) * 0.05
    fw = quantize_fp8(weight, block=block, rule="divide")  # GPTQModel's fp8 stores scales that divide
    torch_layer = create_float_layer(fw, format="fp8", backend="fp8_torch", bias=torch.randn(N).bfloat16())
    module = _torch_then_holder(torch_layer, h.FP8MlxQuantLinear).to_mlx()
    assert torch.equal(torch.from_numpy(np.array(module.weight_values())), torch_layer.dequantize(torch.float32))
    x = torch.randn(2, K, generator=torch.Generator().manual_seed(31)).bfloat16()
    want = torch_layer(x).float()
    out = torch.from_numpy(np.array(module(mx.array(x.float().numpy()).astype(mx.bfloat16)).astype(mx.float32)))
    assert float((out - want).abs().max() / want.abs().max()) < 1e-2
