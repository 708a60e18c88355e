"""A transformers llama-style model built in one tensor-parallel rank straight from a safetensors checkpoint.

Unlike ``hf_model.from_pretrained`` followed by ``apply_llama_plan`` (which reads every module whole, then cuts), a
rank here reads only its slice of each planned projection (``load.load_shard``); the model skeleton is built
without weights (accelerate's ``init_empty_weights``) and every other tensor (embeddings, norms, an unquantized
head) is read whole, as every rank needs it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint.load import build_layer
from ..checkpoint.plan import plan_checkpoint
from ..checkpoint.safetensors_io import CheckpointError, read_tensor
from ..enums import BACKEND
from ..model import move_unquantized, set_submodule
from ..target import Target
from .layers import _world
from .load import load_shard
from .plan import Placement, llama_placements, wrap


def from_pretrained_tp(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                       backend: BACKEND | str = BACKEND.AUTO, group: dist.ProcessGroup | None = None
                       ) -> tuple[nn.Module, list[Placement]]:
    """This rank's model of a GPTQ / AWQ / compressed-tensors / FP8 directory (with config.json), cut by the llama
    plan over ``group``; returns the model and the placements. Every rank calls it, after joining the process group
    through ``launch.join_process_group`` (transformers imports ``torch.distributed.nn`` here, which otherwise pins
    the default group past ``destroy_process_group``)."""
    from accelerate import init_empty_weights

    from ..hf_model import _transformers

    tf = _transformers()
    root = Path(path)
    rank, world = _world(group)
    plan = plan_checkpoint(root)
    if plan.model_config is None:
        raise CheckpointError(f"{root}: no config.json: transformers needs the model architecture")
    cfg = dict(plan.model_config)
    config = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with init_empty_weights():
        model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    embeddings = {n for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
    if embeddings & set(plan.modules):
        raise CheckpointError(f"{root}: quantized embeddings ({sorted(embeddings & set(plan.modules))[0]}): load it "
                              "with hf_model.from_pretrained and cut it with apply_llama_plan")
    placements = llama_placements({n: mp.scheme for n, mp in plan.modules.items()}, config, world)
    by_name = {p.name: p for p in placements}
    target = Target.here(device)
    for name, mp in plan.modules.items():
        p = by_name.get(name)
        if p is None or p.dim is None:
            layer = build_layer(name, mp.scheme, {k: read_tensor(v) for k, v in mp.tensors.items()}, target, dtype,
                                backend)
        else:
            layer = wrap(p, load_shard(mp, rank, world, p.dim, device, dtype, backend), group)
        set_submodule(model, name, layer)
    state = {k: read_tensor(v) for k, v in plan.other.items()}
    model.load_state_dict(state, strict=False, assign=True)
    tied = getattr(config, "tie_word_embeddings", False)
    if tied and isinstance(model.get_output_embeddings(), nn.Linear):
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    empty = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if empty:
        raise CheckpointError(f"{root}: tensors do not fit the {config.model_type} model: missing {empty[:5]}")
    move_unquantized(model, device, dtype)
    return model.eval(), placements
