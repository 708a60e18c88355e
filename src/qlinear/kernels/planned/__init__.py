"""Every kernel class of the reference that qlinear declares but has not built yet, as data.

Each class sets ``backend`` and one ``Caps`` transcribed from the reference's declaration tables (plus short
``runtime_reasons`` where a rule does not fit ``Caps``). ``PLANNED`` lists them in the order of the reference's
backend table (TorchLinear and TorchQuantEmbeddings live in ``kernels/torch.py``), then the two EXL3 classes,
which the reference lists separately. Importing these modules only defines classes.
"""

from __future__ import annotations

from ..base import QuantLinear
from .awq import AwqGEMMLinear, AwqGEMMTritonLinear, AwqGEMVFastLinear, AwqGEMVLinear, AwqTorchLinear, LLMAwqLinear
from .cpu import (
    TorchAtenAwqLinear,
    TorchAtenLinear,
    TorchCpuAvx512AwqLinear,
    TorchCpuAvx512Linear,
    TorchFusedAwqLinear,
    TorchFusedLinear,
    TorchInt8AwqLinear,
    TorchInt8Linear,
)
from .exllama_bitblas import (
    AWQBitBlasKernel,
    AwqExllamaV2Linear,
    BitblasLinear,
    ExllamaV2Linear,
    ExllamaV3Linear,
    ExllamaV3TorchLinear,
)
from .float_formats import TorchFP8Linear, W4AFP8Linear, W4ANVFP4Linear
from .gguf import GGUFCppKernel, GGUFCudaKernel, GGUFTorchLinear, GGUFTritonKernel
from .marlin import AwqMacheteLinear, AwqMarlinLinear, AwqSwordfishLinear, MacheteLinear, MarlinLinear, SwordfishLinear
from .mlx import (
    AWQBitBLASMlxQuantLinear,
    AwqGemvFastMlxQuantLinear,
    AwqGemvMlxQuantLinear,
    AWQMarlinMlxQuantLinear,
    AwqMlxQuantLinear,
    BitsAndBytesMlxQuantLinear,
    FP8MlxQuantLinear,
    GGUFMlxQuantLinear,
    GPTQBitBLASMlxQuantLinear,
    GPTQMarlinMlxQuantLinear,
    LLMAwqMlxQuantLinear,
    MlxQuantLinear,
    ParoMlxQuantLinear,
    QQQMlxQuantLinear,
)
from .other import (
    BitsAndBytesLinear,
    ParoLinear,
    ParoQuantTritonLinear,
    QQQLinear,
    QQQTorchLinear,
    VPTQCudaLinear,
    VPTQLinear,
)
from .triton import TritonV2Linear

PLANNED: tuple[type[QuantLinear], ...] = (
    BitblasLinear,
    AWQBitBlasKernel,
    BitsAndBytesLinear,
    ExllamaV2Linear,
    AwqExllamaV2Linear,
    TorchFP8Linear,
    AwqGEMMLinear,
    AwqGEMMTritonLinear,
    AwqGEMVLinear,
    AwqGEMVFastLinear,
    LLMAwqLinear,
    GGUFTorchLinear,
    GGUFCppKernel,
    GGUFCudaKernel,
    GGUFTritonKernel,
    MacheteLinear,
    AwqMacheteLinear,
    MarlinLinear,
    AwqMarlinLinear,
    AWQBitBLASMlxQuantLinear,
    AWQMarlinMlxQuantLinear,
    AwqGemvFastMlxQuantLinear,
    AwqGemvMlxQuantLinear,
    AwqMlxQuantLinear,
    BitsAndBytesMlxQuantLinear,
    FP8MlxQuantLinear,
    GGUFMlxQuantLinear,
    GPTQBitBLASMlxQuantLinear,
    GPTQMarlinMlxQuantLinear,
    LLMAwqMlxQuantLinear,
    MlxQuantLinear,
    ParoMlxQuantLinear,
    QQQMlxQuantLinear,
    ParoLinear,
    ParoQuantTritonLinear,
    QQQLinear,
    QQQTorchLinear,
    AwqSwordfishLinear,
    SwordfishLinear,
    TorchAtenLinear,
    TorchAtenAwqLinear,
    AwqTorchLinear,
    TorchCpuAvx512Linear,
    TorchCpuAvx512AwqLinear,
    TorchFusedLinear,
    TorchFusedAwqLinear,
    TorchInt8Linear,
    TorchInt8AwqLinear,
    TritonV2Linear,
    VPTQCudaLinear,
    VPTQLinear,
    W4AFP8Linear,
    W4ANVFP4Linear,
    ExllamaV3Linear,
    ExllamaV3TorchLinear,
)

__all__ = ["PLANNED"] + [k.__name__ for k in PLANNED]
