"""qlinear: kernels for quantized LLM weights.

Every packed format read and written bit-exactly through one canonical affine form, a selector
that explains which kernel runs a layer and why the others cannot, and fast Torch paths.
Importing qlinear touches no GPU, compiles nothing and reads no environment variable.
"""

from .activations import ActQuant
from .affine import AffineWeight, quantize_rtn
from .blockfloat import FloatWeight
from .build import create_float_layer, create_layer
from .caps import Caps, Problem
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .enums import BACKEND, DEVICE, FORMAT, METHOD, PLATFORM
from .kernels.base import QuantLinear, RetiredKernelError
from .kernels.torch import TorchLinear, TorchQuantEmbeddings
from .packing import (
    hf_check_best_packing_format,
    hf_check_packing_feasibility,
    hf_pack_layer,
    hf_post_init,
    hf_repack_layer,
)
from .select import Choice, NoKernelError, Verdict, explain, select
from .spec import ConfigError, QuantizeConfig, Scheme
from .target import DeviceInfo, Target
from .version import __version__ as __version__

__all__ = [
    "BACKEND",
    "DEVICE",
    "FORMAT",
    "METHOD",
    "PLATFORM",
    "ActQuant",
    "AffineWeight",
    "Caps",
    "CheckpointError",
    "Choice",
    "ConfigError",
    "DeviceInfo",
    "FloatWeight",
    "NoKernelError",
    "Problem",
    "QuantLinear",
    "QuantizeConfig",
    "RetiredKernelError",
    "Scheme",
    "Target",
    "TorchLinear",
    "TorchQuantEmbeddings",
    "Verdict",
    "create_float_layer",
    "create_layer",
    "explain",
    "hf_check_best_packing_format",
    "hf_check_packing_feasibility",
    "hf_pack_layer",
    "hf_post_init",
    "hf_repack_layer",
    "load_checkpoint",
    "quantize_rtn",
    "save_checkpoint",
    "select",
]
