"""Tensor-parallel qlinear layers on torch.distributed (Megatron-LM / vLLM column- and row-parallel scheme).

``shard.py``: cut rules per format and ``shard()``; ``layers.py``: ``ColumnParallelLinear`` / ``RowParallelLinear``;
``load.py``: a rank's slices read from safetensors; ``plan.py``: the llama plan on a transformers model;
``launch.py``: ``qlinear run --tp N`` through torchrun. See docs/parallel.md.
"""
