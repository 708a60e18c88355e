"""The names the reference uses for methods, checkpoint formats, backends and devices.

Every enum accepts its members' names or values in any case (``"GPTQ_V2"``, ``"gptq_v2"``), and an
unknown name raises a ``ValueError`` that lists the valid ones, so a typo in a config file or on
the command line is answered with the choices instead of a bare ``KeyError``.
"""

from __future__ import annotations

from enum import Enum


class UnknownNameError(ValueError):
    """A method, format, backend or device name that is none of the known ones (the message lists them)."""


class _LenientEnum(str, Enum):
    """A string enum that parses case-insensitively, by name or value."""

    @classmethod
    def _missing_(cls, value: object) -> _LenientEnum | None:
        if isinstance(value, str):
            wanted = value.strip().lower().replace("-", "_")
            for member in cls:
                if wanted in (member.name.lower(), member.value.lower().replace("-", "_")):
                    return member
        valid = ", ".join(m.value for m in cls)
        raise UnknownNameError(f"unknown {cls.__name__} {value!r}; expected one of: {valid}")

    def __str__(self) -> str:
        return self.value


class METHOD(_LenientEnum):
    """Quantization method: how the numbers were chosen."""

    GPTQ = "gptq"
    AWQ = "awq"
    QQQ = "qqq"
    GGUF = "gguf"
    FP8 = "fp8"
    FP4 = "fp4"
    BITSANDBYTES = "bitsandbytes"
    VPTQ = "vptq"
    PAROQUANT = "paroquant"
    EXL3 = "exl3"
    EXL2 = "exl2"
    MLX = "mlx"
    COMPRESSED_TENSORS = "compressed-tensors"


class FORMAT(_LenientEnum):
    """Checkpoint format: where the bits sit on disk (a Scheme, a Layout and tensor names)."""

    GPTQ = "gptq"
    GPTQ_V2 = "gptq_v2"
    GPTQ_P = "gptq_p"
    MARLIN = "marlin"
    BITBLAS = "bitblas"
    GEMM = "gemm"
    GEMV = "gemv"
    GEMV_FAST = "gemv_fast"
    LLM_AWQ = "llm-awq"
    QQQ = "qqq"
    GGUF = "gguf"
    FP8 = "fp8"
    BITSANDBYTES = "bitsandbytes"
    VPTQ = "vptq"
    PAROQUANT = "paroquant"
    EXL3 = "exl3"
    EXL2 = "exl2"  # ExLlamaV2's own mixed-bit checkpoints (q_weight, q_scale, q_groups, q_invperm)
    MLX = "mlx"  # mlx-lm's affine quantization (uint32 words, scales and biases)
    # transformers' fine-grained FP8 (DeepSeek-V3 style): FP8 weight and a float32 `weight_scale_inv` that MULTIPLIES
    HF_FP8 = "hf_fp8"
    # compressed-tensors (llm-compressor) storage formats, named as its configs write them
    PACK_QUANTIZED = "pack-quantized"
    NAIVE_QUANTIZED = "naive-quantized"
    INT_QUANTIZED = "int-quantized"
    FLOAT_QUANTIZED = "float-quantized"
    NVFP4_PACK_QUANTIZED = "nvfp4-pack-quantized"
    MXFP4_PACK_QUANTIZED = "mxfp4-pack-quantized"


class BACKEND(_LenientEnum):
    """Every backend the reference names, plus AUTO (let the selector choose)."""

    AUTO = "auto"
    GPTQ_TORCH = "gptq_torch"
    GPTQ_TORCH_ATEN = "gptq_torch_aten"
    GPTQ_TORCH_FUSED = "gptq_torch_fused"
    GPTQ_TORCH_INT8 = "gptq_torch_int8"
    GPTQ_TORCH_CPU_AVX512 = "gptq_torch_cpu_avx512"
    GPTQ_TRITON = "gptq_triton"
    GPTQ_MARLIN = "gptq_marlin"
    GPTQ_MACHETE = "gptq_machete"
    GPTQ_SWORDFISH = "gptq_swordfish"
    GPTQ_EXLLAMA_V2 = "gptq_exllama_v2"
    GPTQ_BITBLAS = "gptq_bitblas"
    GPTQ_W4AFP8 = "gptq_w4afp8"
    GPTQ_W4A_NVFP4 = "gptq_w4a_nvfp4"
    AWQ_TORCH = "awq_torch"
    AWQ_TORCH_ATEN = "awq_torch_aten"
    AWQ_TORCH_FUSED = "awq_torch_fused"
    AWQ_TORCH_INT8 = "awq_torch_int8"
    AWQ_TORCH_CPU_AVX512 = "awq_torch_cpu_avx512"
    AWQ_GEMM = "awq_gemm"
    AWQ_GEMM_TRITON = "awq_gemm_triton"
    AWQ_GEMV = "awq_gemv"
    AWQ_GEMV_FAST = "awq_gemv_fast"
    AWQ_MARLIN = "awq_marlin"
    AWQ_MACHETE = "awq_machete"
    AWQ_SWORDFISH = "awq_swordfish"
    AWQ_EXLLAMA_V2 = "awq_exllama_v2"
    AWQ_BITBLAS = "awq_bitblas"
    GGUF_TORCH = "gguf_torch"
    GGUF_TRITON = "gguf_triton"
    GGUF_CPP_CPU = "gguf_cpp_cpu"
    GGUF_CPP_CUDA = "gguf_cpp_cuda"
    FP8_TORCH = "fp8_torch"
    FP8_TRITON = "fp8_triton"  # qlinear's own: FP8 weight-only and W8A8 Triton kernels (no reference member)
    FP4_TORCH = "fp4_torch"  # the reference's TorchFP4Linear, which has no member of its own there
    FP4_TRITON = "fp4_triton"  # qlinear's own: NVFP4 / MXFP4 weight-only Triton kernels
    BITSANDBYTES = "bitsandbytes"
    BITSANDBYTES_TORCH = "bitsandbytes_torch"  # qlinear's own: exact NF4 / FP4 / LLM.int8 Torch kernel, any device
    BITSANDBYTES_TRITON = "bitsandbytes_triton"  # qlinear's own: NF4 / FP4 Triton kernels
    QQQ = "qqq"
    QQQ_TORCH = "qqq_torch"
    VPTQ_TORCH = "vptq_torch"
    VPTQ_CUDA = "vptq_cuda"
    VPTQ_CPU = "vptq_cpu"  # qlinear's own: VPTQ codes walked by the native extra on CPU (float32 sums), decode sizes
    PAROQUANT_CUDA = "paroquant_cuda"
    PAROQUANT_TRITON = "paroquant_triton"
    PAROQUANT_CPU = "paroquant_cpu"  # qlinear's own: ParoQuant's rotation, then its AWQ codes on the CPU int4 kernels
    EXL3_EXLLAMA_V3 = "exl3_exllama_v3"
    EXL3_TORCH = "exl3_torch"
    MLX = "mlx"
    MLX_TORCH = "mlx_torch"  # qlinear's own: exact Torch kernel for mlx-lm affine weights, any device
    MLX_CPU = "mlx_cpu"  # qlinear's own: mlx-lm affine weights as 4-bit parts on the CPU int4 kernels (bfloat16)
    MLX_TRITON = "mlx_triton"  # qlinear's own: mlx-lm affine weights on the GPTQ Triton kernels with offsets, CUDA
    EXL2_TORCH = "exl2_torch"  # qlinear's own: exact Torch kernel for ExLlamaV2 EXL2 mixed-bit weights, any device
    EXL2_CPU = "exl2_cpu"  # qlinear's own: EXL2 as 4-bit parts on the CPU int4 kernels (bfloat16 arithmetic)
    EXL2_TRITON = "exl2_triton"  # qlinear's own: EXL2 widened losslessly onto the GPTQ Triton kernels, CUDA


class DEVICE(_LenientEnum):
    """Device families a kernel can declare. ROCm shares torch's ``cuda`` namespace but not its binaries."""

    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"
    XPU = "xpu"
    MPS = "mps"


ALL_DEVICES = frozenset(DEVICE)


class PLATFORM(_LenientEnum):
    """Operating systems a kernel can declare (values as in ``sys.platform``)."""

    LINUX = "linux"
    WINDOWS = "win32"
    DARWIN = "darwin"


ALL_PLATFORMS = frozenset(PLATFORM)
