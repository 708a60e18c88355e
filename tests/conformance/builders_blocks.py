"""Builders for the families whose weights are not one integer-affine grid: GGUF blocks, FP8 / FP4 float codes,
bitsandbytes, VPTQ, EXL2 and EXL3. Each declared combination expands into the family's sub-types (the ``variant``:
GGUF block type, FP8 scale layout and element, bitsandbytes code type). References: gguf-py's own
``gguf.quants.dequantize`` (the producer) for GGUF, and the ``tests/oracle`` decoders for the rest."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from qlinear.spec import Scheme
from tests.oracle import bnb_numpy, exl2_numpy, exl3_oracle, float_numpy, vptq_numpy

from .builders import TOL, Builder, Built, Unavailable, as_f64, generator, rounded, state
from .builders_affine import explicit, ready
from .space import Combo, SchemeRefused

GGUF_INSTALL = "pip install --no-deps -r requirements/nodeps-gguf.txt"
#: ggml quantizes the activations to 8-bit blocks (Q8_0 / Q8_K) before its product. tests/test_gguf_ggml.py bounds
#: the Frobenius error by 1.5e-2 (measured 5e-3 to 7e-3); the max-norm error used here reaches 1.5e-2 (Q6_K,
#: bfloat16 inputs), so twice that.
GGML_TOL = 3e-2


class GGUFBuilder(Builder):
    """GGUF: bytes from qlinear's ggml-exact encoders where a type has one, else random codes with small finite
    float16 scales; reference ``gguf.quants.dequantize`` (libgguf for Q1_0_G128, the spec's sign bits for Q1_0)."""

    family = "gguf"

    def variants(self, c: Combo) -> Sequence[str | None]:
        from qlinear.layouts import gguf as G

        return sorted(t.name for t in c.kernel.qtypes if G.TYPES[t].bits == c.bits)

    def multiples(self, c: Combo) -> tuple[int, int]:
        from qlinear.layouts import gguf as G

        return G.type_info(c.variant).block_size, 1

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        from qlinear.layouts import gguf as G

        return replace(G.scheme_for(c.variant, k, n), pack_dtype=c.pack_dtype)

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        from qlinear.layouts import gguf as G

        n, k = scheme.out_features, scheme.in_features
        info = G.type_info(c.variant)
        rng = np.random.default_rng(seed)
        if info.encode is not None:
            raw = G.quantize(rng.standard_normal((n, k)).astype(np.float32), info.type)
        else:
            raw = rng.integers(0, 256, (n * info.blocks_per_row(k), info.type_size), dtype=np.uint8)
            raw[:, 0:2] = rng.uniform(0.001, 0.02, raw.shape[0]).astype("<f2").view(np.uint8).reshape(-1, 2)
            raw = raw.reshape(n, info.row_bytes(k))
        w64 = self.oracle(info, raw, k)
        layer = explicit(c, scheme, device)
        layer.load_blocks(raw)
        layer = ready(layer, device)
        if c.kernel.__name__ == "GGUFCppKernel":
            return Built(layer, w64, tol=GGML_TOL, tol_why="ggml quantizes activations to 8-bit blocks")
        return Built(layer, w64)

    @staticmethod
    def oracle(info: object, raw: np.ndarray, k: int) -> np.ndarray:
        name = info.type.name
        if name == "Q1_0":  # no gguf-py type: d (float16) then 32 sign bits per block, +d for 1, -d for 0
            blocks = raw.reshape(raw.shape[0], -1, 6)
            d = blocks[:, :, :2].copy().view("<f2").astype(np.float64)
            bits = np.unpackbits(blocks[:, :, 2:], axis=-1, bitorder="little")
            w = np.where(bits == 1, d, -d).reshape(raw.shape[0], -1)
        elif name == "Q1_0_G128":
            try:
                import libgguf
            except ImportError:
                raise Unavailable(f"Q1_0_G128's oracle needs libgguf: {GGUF_INSTALL}") from None
            w = np.stack([libgguf.dequantize_rows(r, 41, n_per_row=raw.shape[1] // 18 * 128) for r in raw])
        else:
            try:
                import gguf
            except ImportError:
                raise Unavailable(f"the GGUF oracle needs gguf-py: {GGUF_INSTALL}") from None
            w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(info.type.value))
        return np.asarray(w, dtype=np.float64).reshape(raw.shape[0], -1)[:, :k]


#: (format, variant) -> how the float weight is quantized: (element, scale block or None per row, rule).
FLOAT_VARIANTS = {
    "fp8": {"e4m3-row": ("e4m3", None, "divide"), "e4m3-tensor": ("e4m3", "tensor", "divide"),
            "e4m3-block8x64": ("e4m3", (8, 64), "divide")},
    "hf_fp8": {"e4m3-block32x128": ("e4m3", (32, 128), "multiply")},
    "float-quantized": {"e4m3-channel": ("e4m3", None, "multiply"), "e4m3-group64": ("e4m3", (1, 64), "multiply")},
    "naive-quantized": {"e4m3-channel": ("e4m3", None, "multiply"), "e5m2-channel": ("e5m2", None, "multiply")},
    "nvfp4-pack-quantized": {"nvfp4": None},
    "mxfp4-pack-quantized": {"mxfp4": None},
}


class FloatBuilder(Builder):
    """FP8 (GPTQModel's dividing scales, transformers' blocks, compressed-tensors' channel / group / naive) and
    NVFP4 / MXFP4 from qlinear's quantizers; reference: ``float_numpy`` decoding the layer's stored codes and
    scales."""

    family = "float"

    def variants(self, c: Combo) -> Sequence[str | None]:
        return sorted(FLOAT_VARIANTS.get(c.format.value, {}))

    def multiples(self, c: Combo) -> tuple[int, int]:
        return (128, 32) if c.variant == "e4m3-block32x128" else (64, 8)

    def weight(self, fmt: str, variant: str, k: int, n: int, seed: int) -> object:
        from qlinear.float_quant import quantize_fp8, quantize_mxfp4, quantize_nvfp4

        w = torch.randn(n, k, generator=generator(seed)) * 0.05
        if variant == "nvfp4":
            return quantize_nvfp4(w)
        if variant == "mxfp4":
            return quantize_mxfp4(w)
        element, block, rule = FLOAT_VARIANTS[fmt][variant]
        block = (n, k) if block == "tensor" else block
        return quantize_fp8(w, block=block, element=element, rule=rule)

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        return replace(self.base_scheme(c.format.value, c.variant, k, n), pack_dtype=c.pack_dtype)

    @functools.lru_cache(maxsize=64)  # noqa: B019 (one module-level builder; quantizing to learn the scheme is slow)
    def base_scheme(self, fmt: str, variant: str, k: int, n: int) -> Scheme:
        """The scheme a weight of this sub-type implies (it does not depend on the dtypes)."""
        from qlinear.build import float_scheme_of

        return float_scheme_of(self.weight(fmt, variant, k, n, 0), fmt)

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        n, k = scheme.out_features, scheme.in_features
        fw = self.weight(c.format.value, c.variant, k, n, seed)
        layer = explicit(c, scheme, device)
        layer.load_float(fw)
        layer = ready(layer, device)
        return Built(layer, self.oracle(layer, c.format.value, n, k))

    @staticmethod
    def oracle(layer: object, fmt: str, n: int, k: int) -> np.ndarray:
        sd = {name: t.detach().cpu() for name, t in layer.state_dict().items()}
        if "weight_packed" in sd:
            raw = sd["weight_scale"].view(torch.uint8).numpy()
            if fmt == "mxfp4-pack-quantized":
                return float_numpy.dequant_fp4(sd["weight_packed"].numpy(), np.vectorize(float_numpy.e8m0_value)(raw),
                                               32)
            s = np.vectorize(lambda code: float_numpy.fp8_value(int(code), "e4m3"))(raw)
            return float_numpy.dequant_fp4(sd["weight_packed"].numpy(), s, 16, float(sd["weight_global_scale"].item()))
        block = layer.scheme.scale_block
        name = "weight_scale_inv" if fmt in ("fp8", "hf_fp8") else "weight_scale"
        scale = sd[name].float().numpy().astype(np.float64).reshape(-(-n // block[0]), -(-k // block[1]))
        kind = "e4m3" if sd["weight"].dtype == torch.float8_e4m3fn else "e5m2"
        return float_numpy.dequant_fp8(sd["weight"].view(torch.uint8).numpy(), kind, scale, block,
                                       divide=fmt == "fp8")


class BnbBuilder(Builder):
    """bitsandbytes: random nf4 / fp4 codes with plain or double-quantized absmax (blocksize 64), and LLM.int8 rows;
    reference ``bnb_numpy`` (published tables) rounded to the activation dtype as bitsandbytes dequantizes."""

    family = "bitsandbytes"

    def variants(self, c: Combo) -> Sequence[str | None]:
        return ("int8",) if c.bits == 8 else ("fp4", "fp4-nested", "nf4", "nf4-nested")

    def weight(self, c: Combo, k: int, n: int, seed: int) -> object:
        from qlinear.bnb_weight import BnbInt8Weight, BnbWeight, NestedAbsmax, code_table

        g = generator(seed)
        if c.variant == "int8":
            return BnbInt8Weight(torch.randint(-127, 128, (n, k), generator=g).to(torch.int8),
                                 torch.rand(n, generator=g) * 0.5 + 0.01)
        qtype, nested = c.variant.split("-")[0], c.variant.endswith("nested")
        nb = -(-n * k // 64)
        codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        if not nested:
            return BnbWeight(codes, qtype, 64, torch.rand(nb, generator=g) * 0.1, code_table(qtype), c.dtype)
        qmap = torch.sort(torch.rand(256, generator=g) * 2 - 1).values
        st = NestedAbsmax(qmap, torch.rand(-(-nb // 256), generator=g) * 0.05 + 0.01, 256,
                          float(torch.tensor(0.0371)))  # an offset bitsandbytes stores: a float32 value
        return BnbWeight(codes, qtype, 64, torch.randint(0, 256, (nb,), generator=g, dtype=torch.uint8),
                         code_table(qtype), c.dtype, st)

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        from qlinear.layouts import bnb

        return replace(bnb.scheme_of(self.weight(c, k, n, 0)), pack_dtype=c.pack_dtype)

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        n, k = scheme.out_features, scheme.in_features
        w = self.weight(c, k, n, seed)
        layer = explicit(c, scheme, device)
        layer.load_bnb(w)
        layer = ready(layer, device)
        name = str(c.dtype).removeprefix("torch.")
        if c.variant == "int8":
            w64 = bnb_numpy.round_to(bnb_numpy.dequantize_int8(w.codes.numpy(), w.scb.numpy()), name)
            if c.kernel.__name__ == "BitsAndBytesLinear":  # LLM.int8: its defined arithmetic quantizes the inputs
                if c.dtype == torch.float32:  # bitsandbytes casts float32 inputs to float16 first (its warning)
                    return Built(layer, w64, reference=lambda x: int8_rows(as_f64(x.half())) @ w64.T,
                                 tol=TOL[torch.float16], tol_why="MatMul8bitLt computes float32 inputs in float16")
                return Built(layer, w64, reference=lambda x: int8_rows(as_f64(x)) @ w64.T)
            return Built(layer, w64)
        codes = bnb_numpy.unpack(state(layer)["weight"], n, k)
        absmax = w.absmax.numpy()
        if w.nested is not None:
            s = w.nested
            absmax = bnb_numpy.nested_absmax(absmax, s.quant_map.numpy(), s.absmax.numpy(), s.blocksize, s.offset)
        return Built(layer, bnb_numpy.round_to(bnb_numpy.dequantize_4bit(codes, w.quant_type, absmax, 64), name))


def int8_rows(x: np.ndarray) -> np.ndarray:
    """Activations as LLM.int8 (no outliers) multiplies them: per row ``round(127 x / absmax) * absmax / 127``."""
    amax = np.abs(x).max(axis=1, keepdims=True)
    amax = np.where(amax > 0, amax, 1.0)
    return np.rint(x * 127.0 / amax) * amax / 127.0


class VptqBuilder(Builder):
    """VPTQ: vector length 2, a main codebook of ``2**min(2b, 10)`` entries and a residual one for the rest of the
    ``2b`` index bits (nominal bits ``b``), random permutation and norm; reference ``vptq_numpy``, the weight
    rounded to the activation dtype as the producers hand it to the GEMM."""

    family = "vptq"
    k_min, n_min = 96, 40

    def meta(self, c: Combo, k: int, n: int) -> dict:
        main = min(2 * c.bits, 10)
        res = 2 * c.bits - main
        return dict(k=k, n=n, v=2, c=1 << main, r=(1 << res) if res else -1, perm=True, norm=True,
                    dtype=torch.float16)

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        from tests import vptq_cases

        meta, _ = vptq_cases.make_case("conformance", **self.meta(c, k, n))
        s = vptq_cases.scheme(meta, torch.int32)
        if s.bits != c.bits:
            raise SchemeRefused(f"vptq case has nominal bits {s.bits}, wanted {c.bits}")
        return replace(s, pack_dtype=c.pack_dtype)

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        from qlinear.layouts import vptq
        from tests import vptq_cases

        meta, t = vptq_cases.make_case("conformance", **self.meta(c, scheme.in_features, scheme.out_features),
                                       seed=seed)
        packed = vptq.pack_indices(t["idx"], t.get("res"), vptq_cases.params(meta, torch.int32))
        layer = explicit(c, scheme, device)
        layer.load_state_dict(vptq_cases.checkpoint_tensors(meta, t, packed, torch.int32), strict=True)
        layer = ready(layer, device)
        w = vptq_numpy.dequantize(meta, {name: as_f64(v) for name, v in t.items()}, packed.numpy())
        if c.kernel.__name__ == "VPTQCpuLinear":
            return Built(layer, rounded(w, c.dtype), tol=TOL[torch.bfloat16],
                         tol_why="float32 sums without the producers' roundings; above 16 rows bfloat16 weight tiles")
        return Built(layer, rounded(w, c.dtype))


class Exl2Builder(Builder):
    """EXL2: two groups of 64 input rows (the declared width and 2 bits), a random input permutation; reference
    ``exl2_numpy.exl2_weight`` (transcribed from exllamav2's reconstruct kernel) of the layer's tensors."""

    family = "exl2"

    def params(self, c: Combo) -> object:
        from qlinear.layouts import exl2

        return exl2.Exl2Params((c.bits, 2), (64, 64)) if c.bits > 2 else exl2.Exl2Params((2,), (128,))

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        p = self.params(c)
        return Scheme(bits=p.max_bits, group_size=-1, in_features=p.in_features, out_features=n, method="exl2",
                      format="exl2", pack_dtype=c.pack_dtype, layout_params=p)

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        from qlinear.layouts import exl2

        p, n, g = self.params(c), scheme.out_features, generator(seed)
        codes = torch.cat([torch.randint(0, 1 << b, (r, n), generator=g) for b, r in zip(p.group_bits, p.group_rows)])
        qscale = torch.randint(1, 17, (len(p.group_bits), n), generator=g)
        smax = torch.rand(len(p.group_bits), generator=g) * 0.02 + 1e-4
        t = exl2.encode(codes, qscale - 1, smax.half(), torch.randperm(p.in_features, generator=g), p)
        layer = explicit(c, scheme, device)
        layer.load_state_dict(t, strict=True)
        layer = ready(layer, device)
        a = state(layer)
        w = exl2_numpy.exl2_weight(a["q_weight"], a["q_invperm"], a["q_scale"], a["q_scale_max"], a["q_groups"],
                                   p.in_features)
        if c.kernel.__name__ == "Exl2CpuLinear":  # its 4-bit parts run the int4 kernels, in bfloat16 for any dtype
            return Built(layer, w.astype(np.float64).T.copy(), tol=TOL[torch.bfloat16], tol_why="computes in bfloat16")
        return Built(layer, w.astype(np.float64).T.copy())


class Exl3Builder(Builder):
    """EXL3: random trellis words and float16 input/output scales, codebook by bit parity (3inst, mcg) and mul1 at
    1 bit; reference ``exl3_oracle.weight`` (a plain-Python decoder) of the layer's tensors."""

    family = "exl3"
    k_min, n_min = 128, 128

    def make_scheme(self, c: Combo, k: int, n: int) -> Scheme:
        from qlinear.layouts.exl3 import Exl3Params

        cb = "mul1" if c.bits == 1 else ("3inst" if c.bits % 2 == 0 else "mcg")
        return Scheme(bits=c.bits, group_size=-1, in_features=k, out_features=n, method="exl3", format="exl3",
                      pack_dtype=c.pack_dtype, layout_params=Exl3Params(c.bits, cb))

    def build(self, c: Combo, scheme: Scheme, device: str, seed: int) -> Built:
        from qlinear.layouts import exl3

        p, k, n, g = scheme.layout_params, scheme.in_features, scheme.out_features, generator(seed)
        t = {"trellis": torch.randint(-(1 << 15), 1 << 15, (k // 16, n // 16, 16 * p.bits), generator=g,
                                      dtype=torch.int32).to(torch.int16),
             "suh": (torch.randn(k, generator=g) * 0.05).half(), "svh": (torch.randn(n, generator=g) * 0.05).half()}
        if p.codebook in exl3.MARKERS:
            t[p.codebook] = exl3.marker_tensor(p.codebook)
        layer = explicit(c, scheme, device)
        layer.load_state_dict(t, strict=True)
        layer = ready(layer, device)
        w = exl3_oracle.weight(t["trellis"], p.bits, p.codebook, t["suh"], t["svh"])  # [K, N]: y = x @ w
        if c.kernel.__name__ == "ExllamaV3Linear" and c.dtype == torch.float32:
            return Built(layer, w.double().numpy().T.copy(), tol=TOL[torch.float16],
                         tol_why="the CUDA kernel rounds H(x * suh) to float16, as exllamav3 does")
        return Built(layer, w.double().numpy().T.copy())


BUILDERS = ((GGUFBuilder(), ("GGUFTorchLinear", "GGUFTritonKernel", "GGUFCppKernel")),
            (FloatBuilder(), ("TorchFP8Linear", "TorchFP4Linear", "TritonFP8Linear", "TritonFP4Linear")),
            (BnbBuilder(), ("BitsAndBytesTorchLinear", "BitsAndBytesLinear", "BitsAndBytesTritonLinear")),
            (VptqBuilder(), ("VPTQLinear", "VPTQCudaLinear", "VPTQCpuLinear")),
            (Exl2Builder(), ("Exl2TorchLinear", "Exl2CpuLinear", "Exl2TritonLinear")),
            (Exl3Builder(), ("ExllamaV3TorchLinear", "ExllamaV3Linear")))
