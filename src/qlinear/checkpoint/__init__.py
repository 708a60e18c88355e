"""Real checkpoints: load, inspect, convert and save safetensors directories (GPTQ and AWQ layouts)."""

from .load import build_layer, load_checkpoint
from .plan import CheckpointPlan, ModulePlan, plan_checkpoint
from .safetensors_io import CheckpointError

__all__ = ["CheckpointError", "CheckpointPlan", "ModulePlan", "build_layer", "load_checkpoint", "plan_checkpoint"]
