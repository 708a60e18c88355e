"""Tensor-parallel qlinear layers on torch.distributed (Megatron-LM / vLLM column- and row-parallel scheme).

``shard.py``: cut rules per format and ``shard()`` (``shard_stored.py``: EXL2 / EXL3 / VPTQ / ParoQuant cut on their
stored tensors; ``cut_rule.py``: ``CutRule`` and ``ShardError``); ``layers.py``: ``ColumnParallelLinear`` /
``RowParallelLinear``; ``load.py``: a rank's slices read from safetensors (``load_gguf.py``: from a ``.gguf`` file);
``plan.py``: the llama plan on a transformers model;
``launch.py``: ``qlinear run --tp N`` through torchrun. See docs/parallel.md.
"""
