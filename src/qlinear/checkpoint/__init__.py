"""Real checkpoints: load, inspect, convert and save safetensors directories (GPTQ and AWQ layouts), load GGUF.

``load_checkpoint`` -> ``{module name: prepared QuantLinear}``; ``inspect_checkpoint`` reads headers only;
``save_checkpoint`` / ``convert_checkpoint`` write atomically, lossless or refused (listing every module).
"""

from .inspect import inspect_checkpoint
from .load import build_layer, load_checkpoint
from .plan import CheckpointPlan, ModulePlan, plan_checkpoint
from .safetensors_io import CheckpointError
from .save import convert_checkpoint, save_checkpoint

__all__ = ["CheckpointError", "CheckpointPlan", "ModulePlan", "build_layer", "convert_checkpoint",
           "inspect_checkpoint", "load_checkpoint", "plan_checkpoint", "save_checkpoint"]
