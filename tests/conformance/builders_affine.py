"""Builders for the integer-affine families: GPTQ / AWQ / Marlin / BitBLAS layouts (every GPTQ- and AWQ-format
kernel), the GPTQ embedding table, QQQ, MLX and ParoQuant. References: ``tests/oracle`` decoders of the layer's
checkpoint tensors (gptq_numpy, awq_numpy, mlx_numpy), or float64 arithmetic on the random inputs the layer was
given."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from qlinear.affine import AffineWeight, quantize_rtn
from qlinear.build import create_layer
from qlinear.caps import Problem
from qlinear.enums import DEVICE, FORMAT, METHOD
from qlinear.kernels.base import QuantLinear
from qlinear.select import select
from qlinear.spec import Scheme, method_of
from qlinear.target import Target
from tests.oracle import awq_numpy, gptq_numpy, mlx_numpy, qqq_numpy, rtn_numpy

from .builders import Builder, Built, as_f64, generator, rounded, state
from .space import Combo

#: Kernels whose products run in bfloat16 whatever the layer dtype (the int4pack / int8pack ops and the native
#: extra's kernels; tests/test_cpu_kernels.py): every dtype is held to the bfloat16 bound.
BF16_COMPUTE = frozenset({"TorchAtenLinear", "TorchAtenAwqLinear", "TorchFusedLinear", "TorchFusedAwqLinear",
                          "TorchCpuAvx512Linear", "TorchCpuAvx512AwqLinear", "TorchInt8Linear"})


def selectable_here(c: Combo, device: str) -> bool:
    """False only where a CUDA kernel is run on CPU tensors under the Triton interpreter (no selector then)."""
    return DEVICE(device) in c.kernel.caps.devices


def explicit(c: Combo, scheme: Scheme, device: str) -> QuantLinear:
    """The kernel the selector gives for ``c``'s backend on ``device``, constructed empty (what every public
    ``create_*`` does before loading); it must be the kernel under test. Under the Triton interpreter (a CUDA
    kernel on CPU tensors) the class is constructed directly."""
    if selectable_here(c, device):
        choice = select(Problem(scheme, c.dtype), Target.here(device), c.kernel.backend)
        assert choice.kernel is c.kernel, f"backend {c.kernel.backend.value} selected {choice.kernel.__name__}"
    return c.kernel(scheme, bias=False, dtype=c.dtype)


def ready(layer: QuantLinear, device: str) -> QuantLinear:
    layer = layer.to(torch.device(device))
    layer.prepare()
    return layer


def method_for(c: Combo) -> METHOD:
    """GPTQ or AWQ: the format's own method, except Marlin / BitBLAS tensors run by an AWQ kernel (``build`` then
    loads them directly: ``create_layer`` infers the method from the format alone)."""
    if c.format in (FORMAT.MARLIN, FORMAT.BITBLAS) and "awq" in c.kernel.__name__.lower():
        return METHOD.AWQ
    return method_of(c.format)


class AffineBuilder(Builder):
    """GPTQ (gptq, gptq_v2, gptq_p, marlin, bitblas) and AWQ (gemm, marlin, bitblas) layers from ``quantize_rtn``
    (scales rounded to float16, as every such checkpoint stores them) through ``build.create_layer``; the reference
    decodes the layer's own checkpoint tensors with the numpy oracle."""

    family = "gptq/awq"

    def multiples(self, c: Combo) -> tuple[int, int]:
        """Marlin's repack works on 16 x 64 (K x N) tiles, a rule its kernels check at run time (not declared)."""
        return (16, 64) if "Marlin" in c.kernel.__name__ else (1, 1)

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        return Scheme(bits=c.bits, group_size=c.group_size, in_features=k, out_features=n, sym=c.sym,
                      desc_act=c.desc_act, method=method_for(c), format=c.format, pack_dtype=c.pack_dtype)

    def quantized(self, c: Combo, scheme: Scheme, seed: int) -> AffineWeight:
        # uniform on [-0.06, 0.04): every group's minimum is well below 0, so asymmetric true zeros stay at 1 or
        # more whatever the group (GPTQ v1 stores z - 1 and cannot hold 0), in any act-order permutation
        w = (torch.rand(scheme.out_features, scheme.in_features, generator=generator(seed)) - 0.6) * 0.1
        q = quantize_rtn(w, bits=c.bits, group_size=c.group_size, sym=c.sym, desc_act=c.desc_act)
        return replace(q, scales=q.scales.half().float())

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        q = self.quantized(c, scheme, seed)
        if selectable_here(c, device) and scheme.method is method_of(c.format):
            layer = create_layer(q, format=c.format, backend=c.kernel.backend, device=device, dtype=c.dtype,
                                 pack_dtype=c.pack_dtype)
            assert type(layer) is c.kernel, f"create_layer gave {type(layer).__name__}"
        else:
            layer = explicit(c, scheme, device)
            layer.load_affine(q)
            layer = ready(layer, device)
        w64 = self.reference_weight(layer, q)
        if c.kernel.__name__ == "W4AFP8Linear":  # its defined arithmetic: per-token E4M3 activations
            return Built(layer, w64, reference=lambda x: per_token_e4m3(as_f64(x)) @ w64.T)
        tol, why = (TOL_BF16, "computes in bfloat16") if c.kernel.__name__ in BF16_COMPUTE else (None, "")
        return Built(layer, w64, tol=tol, tol_why=why)

    @staticmethod
    def reference_weight(layer: QuantLinear, q: AffineWeight) -> np.ndarray:
        s = layer.scheme
        # a kernel that released its checkpoint tensors after prepare() has none to decode: the codes given, below
        sd = {} if layer.checkpoint_released else {k: v for k, v in state(layer).items() if k != "bias"}
        if sd and s.format in (FORMAT.GPTQ, FORMAT.GPTQ_V2, FORMAT.GPTQ_P):
            return gptq_numpy.dequantize_checkpoint(sd, s.bits, s.in_features, s.out_features, s.format.value)
        if sd and s.format is FORMAT.GEMM:
            return awq_numpy.dequantize("gemm", sd, s.bits, s.in_features, s.out_features, s.group_size)
        # Marlin tiles, BitBLAS LOP3 words (no numpy decoder yet): the float64 weight of the codes given, with the
        # float16 scales every such checkpoint holds
        return rtn_numpy.dequantize(q.codes.numpy(), q.scales.half().double().numpy(), q.zeros.numpy(),
                                    q.g_idx.numpy())


TOL_BF16 = 1.5e-2


def per_token_e4m3(x: np.ndarray) -> np.ndarray:
    """Activations as a W4AFP8 product sees them: per row ``s = amax / 448`` and ``x / s`` rounded to E4M3."""
    s = np.abs(x).max(axis=1, keepdims=True) / 448.0
    s = np.where(s > 0, s, 1.0)
    q = torch.from_numpy(x / s).to(torch.float8_e4m3fn).double().numpy()
    return q * s


class EmbeddingBuilder(AffineBuilder):
    """``TorchQuantEmbeddings``: a GPTQ table looked up by token ids (rows of W, in the layer dtype)."""

    family = "gptq embedding"

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        q = self.quantized(c, scheme, seed)
        layer = c.kernel(scheme, bias=False, dtype=c.dtype)  # not selectable (lookups, not products): built directly
        layer.load_affine(q)
        layer = ready(layer, device)
        w64 = self.reference_weight(layer, q)
        n = scheme.out_features
        return Built(layer, w64, reference=lambda ids: w64[ids.cpu().numpy()],
                     make_input=lambda m, g, dev: torch.randint(0, n, (m,), generator=g).to(dev))


class QQQBuilder(Builder):
    """QQQ W4A8: random signed codes and the two scale levels; the reference is the oracle's integer product
    (``qqq_numpy.forward``: activations quantized per row to int8, exact sums, one rounding), the arithmetic the
    format defines."""

    family = "qqq"
    k_min, n_min = 256, 64

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        return Scheme(bits=c.bits, group_size=c.group_size, in_features=k, out_features=n, sym=c.sym,
                      desc_act=c.desc_act, method="qqq", format="qqq", pack_dtype=c.pack_dtype)

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        from qlinear.layouts.qqq import QQQWeight

        g = generator(seed)
        n, k, gs = scheme.out_features, scheme.in_features, scheme.group_size
        codes = torch.randint(-8, 8, (n, k), generator=g).to(torch.int8)
        group = (torch.rand(n, k // gs, generator=g) * 12 + 4).half() if gs < k else torch.empty(n, 0).half()
        qw = QQQWeight(codes, group, torch.rand(n, generator=g) * 1e-3 + 1e-4, gs)
        layer = explicit(c, scheme, device)
        layer.load_qqq(qw)
        layer = ready(layer, device)
        w8 = qqq_numpy.int8_weight(codes.numpy(), group.numpy() if gs < k else None, gs)
        name = str(c.dtype).removeprefix("torch.")
        chan = qw.channel_scales.numpy()
        return Built(layer, None, reference=lambda x: qqq_numpy.forward(as_f64(x), w8, chan, name))


class MlxBuilder(Builder):
    """MLX affine: random codes, scales and biases in the activation dtype; the reference is the oracle's
    ``s * q + b`` from the layer's stored words, rounded to that dtype as ``mx.dequantize`` returns it."""

    family = "mlx"

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        from qlinear.layouts import mlx

        return replace(mlx.scheme_for(c.bits, c.group_size, k, n), pack_dtype=c.pack_dtype)

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        from qlinear.layouts.mlx import MlxWeight

        g = generator(seed)
        n, k, gs, bits = scheme.out_features, scheme.in_features, scheme.group_size, c.bits
        codes = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.int64).to(torch.uint8)
        scales = ((torch.rand(n, k // gs, generator=g) - 0.5) * 0.02).to(c.dtype)
        biases = ((torch.rand(n, k // gs, generator=g) - 0.5) * 0.1).to(c.dtype)
        layer = explicit(c, scheme, device)
        layer.load_mlx(MlxWeight(codes, scales, biases, bits, gs))
        layer = ready(layer, device)
        words = layer.state_dict()["weight"].cpu().view(torch.int32).numpy().view(np.uint32)
        w64 = mlx_numpy.weight64(mlx_numpy.unpack_stream(words, bits, k), as_f64(scales), as_f64(biases), gs)
        if c.kernel.__name__ == "MlxCpuLinear":  # its 4-bit parts run the int4 kernels, in bfloat16 for any dtype
            return Built(layer, rounded(w64, c.dtype), tol=TOL_BF16, tol_why="computes in bfloat16")
        return Built(layer, rounded(w64, c.dtype))


def givens64(x: np.ndarray, pairs: np.ndarray, theta: np.ndarray, scales: np.ndarray, gs: int) -> np.ndarray:
    """ParoQuant's input transform in float64: channel scales, then per round the Givens rotation of each pair
    (positions ``2p``, ``2p+1`` of the round's pair list, offsets within their group of ``gs`` channels)."""
    x = x * scales.reshape(1, -1)
    k = x.shape[1]
    base = (np.arange(k) // gs * gs).reshape(-1, 2)[:, 0]
    for r in range(pairs.shape[0]):
        i = base + pairs[r, 0::2].astype(np.int64)
        j = base + pairs[r, 1::2].astype(np.int64)
        cos, sin = np.cos(theta[r]), np.sin(theta[r])
        xi, xj = x[:, i].copy(), x[:, j].copy()
        x[:, i] = xi * cos + xj * sin
        x[:, j] = xj * cos - xi * sin
    return x


class ParoBuilder(Builder):
    """ParoQuant: random 4-bit affine codes plus two rounds of random pair rotations; the reference rotates the
    input in float64 and multiplies by the float64 weight of the codes given."""

    family = "paroquant"
    krot = 2

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        from qlinear.layouts.paroquant import ParoParams

        return Scheme(bits=c.bits, group_size=c.group_size, in_features=k, out_features=n, sym=c.sym,
                      desc_act=c.desc_act, method="paroquant", format="paroquant", pack_dtype=c.pack_dtype,
                      layout_params=ParoParams(self.krot))

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        g = generator(seed)
        n, k, gs = scheme.out_features, scheme.in_features, scheme.group_size
        groups = k // gs
        q = AffineWeight(codes=torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g),
                         scales=(torch.rand(n, groups, generator=g) * 0.02 + 0.001).half().float(),
                         zeros=torch.randint(0, 16, (n, groups), dtype=torch.int32, generator=g),
                         g_idx=torch.arange(k, dtype=torch.int32) // gs, bits=4, group_size=gs, sym=True)
        pairs = torch.stack([torch.cat([torch.randperm(gs, generator=g) for _ in range(groups)])
                             for _ in range(self.krot)]).to(torch.int16)
        theta = ((torch.rand(self.krot, k // 2, generator=g) * 2 - 1) * 3.2).half()
        chan = (torch.rand(1, k, generator=g) * 1.5 + 0.5).half()
        layer = explicit(c, scheme, device)
        layer.load_affine(q)
        layer.load_rotation(pairs, theta, chan)
        layer = ready(layer, device)
        w64 = rtn_numpy.dequantize(q.codes.numpy(), q.scales.double().numpy(), q.zeros.numpy(), q.g_idx.numpy())
        p, t, s = pairs.numpy(), as_f64(theta), as_f64(chan)

        def reference(x: torch.Tensor) -> np.ndarray:
            return givens64(as_f64(x), p, t, s, gs) @ w64.T

        if c.dtype == torch.bfloat16:  # measured 1.52e-2 once on an H100 (ParoQuantTritonLinear, group -1)
            return Built(layer, w64, reference=reference, tol=3e-2,
                         tol_why="the rotation rounds to bfloat16 after each of its operations, as ParoQuant's does")
        if c.kernel.__name__ == "ParoCpuLinear":  # the int4 kernels' arithmetic
            return Built(layer, w64, reference=reference, tol=TOL_BF16, tol_why="computes in bfloat16")
        return Built(layer, w64, reference=reference)


GPTQ_AWQ = ("TorchLinear", "AwqTorchLinear", "TorchAtenLinear", "TorchAtenAwqLinear", "TorchFusedLinear",
            "TorchFusedAwqLinear", "TorchCpuAvx512Linear", "TorchCpuAvx512AwqLinear", "TorchInt8Linear",
            "TritonV2Linear", "AwqGEMMTritonLinear", "W4AFP8Linear", "MarlinLinear", "AwqMarlinLinear",
            "MacheteLinear", "AwqMacheteLinear", "ExllamaV2Linear", "AwqExllamaV2Linear", "BitblasLinear",
            "AWQBitBlasKernel")
BUILDERS = ((AffineBuilder(), GPTQ_AWQ), (EmbeddingBuilder(), ("TorchQuantEmbeddings",)),
            (QQQBuilder(), ("QQQLinear", "QQQTorchLinear")),
            (MlxBuilder(), ("MlxTorchLinear", "MlxCpuLinear", "MlxTritonLinear")),
            (ParoBuilder(), ("ParoLinear", "ParoQuantTritonLinear", "ParoCpuLinear")))
