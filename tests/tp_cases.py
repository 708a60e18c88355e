"""Tiny layers of every format family the tensor-parallel tests cut (built from seeded random weights)."""

from __future__ import annotations

import torch

#: name -> (out_features, in_features); every one cuts into 2 and 4 ranks along both dimensions.
SHAPES = {"gguf_q4_k": (64, 1024)}
DEFAULT_SHAPE = (128, 256)
CASES = ("gptq_v1_actorder", "gptq_v2_asym", "gptq_8bit_channel", "gptq_p", "awq_gemm", "gguf_q8_0", "gguf_q4_k",
         "fp8_channel", "fp8_block", "nvfp4", "mxfp4", "bnb_nf4_nested", "bnb_int8")


def make_layer(case: str, bias: bool = True, seed: int = 0) -> torch.nn.Module:
    """The whole layer for ``case`` on the CPU, float32 activations."""
    from qlinear.affine import quantize_rtn
    from qlinear.build import create_float_layer, create_layer

    n, k = SHAPES.get(case, DEFAULT_SHAPE)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    b = torch.randn(n, generator=g) if bias else None
    f32 = torch.float32
    if case == "gptq_v1_actorder":
        return create_layer(quantize_rtn(w, 4, 32, sym=True, desc_act=True), format="gptq", dtype=f32, bias=b)
    if case == "gptq_v2_asym":
        return create_layer(quantize_rtn(w, 4, 32, sym=False), format="gptq_v2", dtype=f32, bias=b)
    if case == "gptq_8bit_channel":
        return create_layer(quantize_rtn(w, 8, -1, sym=False), format="gptq_v2", dtype=f32, bias=b)
    if case == "gptq_p":
        return create_layer(quantize_rtn(w, 4, 64, sym=True), format="gptq_p", dtype=f32, bias=b)
    if case == "awq_gemm":
        return create_layer(quantize_rtn(w, 4, 32, sym=False), format="gemm", dtype=f32, bias=b)
    if case.startswith("gguf_"):
        from qlinear.kernels.gguf_torch import GGUFTorchLinear
        from qlinear.layouts.gguf import scheme_for

        layer = GGUFTorchLinear(scheme_for(case[5:].upper(), k, n), bias=bias, dtype=f32)
        layer.load_float(w, b)
        layer.prepare()
        return layer
    if case.startswith(("fp8", "nvfp4", "mxfp4")):
        from qlinear import float_quant

        q = {"fp8_channel": lambda: float_quant.quantize_fp8(w), "fp8_block": lambda: float_quant.quantize_fp8(
            w, block=(32, 64)), "nvfp4": lambda: float_quant.quantize_nvfp4(w),
             "mxfp4": lambda: float_quant.quantize_mxfp4(w)}[case]()
        return create_float_layer(q, dtype=f32, bias=b)
    if case.startswith("bnb"):
        from qlinear.bnb_build import create_bnb_layer
        from tests.test_bnb_layout import make

        if case == "bnb_int8":
            from qlinear.bnb_weight import BnbInt8Weight

            codes = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
            q = BnbInt8Weight(codes, torch.rand(n, generator=g) * 2 + 0.1)
        else:
            q = make(n, k, "nf4", 64, nested=True, dtype=f32, seed=seed)
        return create_bnb_layer(q, dtype=f32, bias=b)
    raise KeyError(case)
