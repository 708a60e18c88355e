"""Tensor-parallel loading of a ``.gguf`` file: each rank copies only the bytes of its own slice of every layer.

A GGUF weight is rows of blocks (``[N, K / B * T]`` bytes: ``B`` values in ``T`` bytes per block), memory-mapped by
``gguf_file``: a column cut is a contiguous run of rows, a row cut the same whole blocks of every row. The slice is
copied out of the map (nothing else of the tensor is touched) and becomes the shard's ``qweight``, so what a rank
holds is ~1/world of the packed layer, and the whole layer is never built.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from ..caps import Problem
from ..checkpoint.gguf import FLOAT_TYPES
from ..enums import BACKEND
from ..gguf_file import GGUFFile, read_gguf
from ..kernels.base import QuantLinear
from ..select import select
from ..target import Target
from .shard import Shard, ShardError, check_cut, row_refusal, shard_scheme

#: GGUF layer-name suffix -> cut dimension: the llama plan (``LLAMA_DIMS``) in llama.cpp's tensor names.
GGUF_LLAMA_DIMS: Mapping[str, str] = {"attn_q": "out", "attn_k": "out", "attn_v": "out", "ffn_gate": "out",
                                      "ffn_up": "out", "attn_output": "in", "ffn_down": "in"}


def load_gguf_shard(f: GGUFFile, name: str, rank: int, world: int, dim: str, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float16, backend: BACKEND | str = BACKEND.AUTO) -> Shard:
    """Rank ``rank``'s shard of GGUF layer ``name`` (``blk.0.ffn_down``), reading only its blocks. The rows keep
    the file's order (transformers' q/k row reordering is the model loader's, as with ``load_gguf_layers``)."""
    layers = f.layers()
    if name not in layers:
        raise KeyError(f"{f.path}: no 2-D weight for layer {name!r}")
    w = layers[name]
    s = w.scheme()
    size, part = check_cut(s, world, dim, name)
    if not isinstance(rank, int) or not 0 <= rank < world:
        raise ShardError(f"rank: expected 0..{world - 1}, got {rank!r}")
    lo, hi = rank * part, (rank + 1) * part
    o0, o1, i0, i1 = (lo, hi, 0, s.in_features) if dim == "out" else (0, s.out_features, lo, hi)
    info = w.info
    b0, b1 = i0 // info.block_size * info.type_size, i1 // info.block_size * info.type_size
    blocks = torch.from_numpy(np.array(w.raw()[o0:o1, b0:b1], copy=True))  # the slice alone, out of the map
    sub = shard_scheme(s, o1 - o0, i1 - i0)
    bias_t = f.tensors.get(f"{name}.bias")
    bias = None if bias_t is None else bias_t.dequantize()
    target = Target.here(device)
    choice = select(Problem(sub, dtype), target, backend)
    why = row_refusal(choice.kernel, sub) if dim == "in" else ""
    if why:
        raise ShardError(f"{name}: {why}")
    local_bias = bias[o0:o1] if (bias is not None and dim == "out") else None
    layer = choice.kernel(sub, bias=local_bias is not None, dtype=dtype)
    layer.load_blocks(blocks, local_bias, share=True)
    layer = layer.to(target.devices[0].torch_device)
    layer.prepare()
    layer.choice = choice
    note = (f"{'column' if dim == 'out' else 'row'}-parallel cut {rank}/{world}: {dim} channels {lo}:{hi} of {size}, "
            f"read as {'rows' if dim == 'out' else 'whole blocks of every row'} of the memory-mapped GGUF tensor")
    return Shard(layer, dim, rank, world, (o0, o1), (i0, i1), None,
                 bias.clone() if (bias is not None and dim == "in") else None, note)


def load_gguf(path: str | Path, tp_rank: int, tp_size: int, plan: Mapping[str, str] = GGUF_LLAMA_DIMS,
              device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
              backend: BACKEND | str = BACKEND.AUTO) -> dict[str, Shard | QuantLinear]:
    """Every quantized 2-D weight of a GGUF file for rank ``tp_rank`` of ``tp_size``: a ``Shard`` for the layers
    ``plan`` cuts (layer-name suffix -> "out" / "in"), the whole layer (the mapped bytes, shared) for the others."""
    f = read_gguf(path)
    out: dict[str, Shard | QuantLinear] = {}
    for name, t in f.layers().items():
        if t.type in FLOAT_TYPES:
            continue
        dim = plan.get(name.rsplit(".", 1)[-1])
        if dim is None:
            out[name] = f.linear(name, backend=str(BACKEND(backend).value), device=device, dtype=dtype)
        else:
            out[name] = load_gguf_shard(f, name, tp_rank, tp_size, dim, device, dtype, backend)
    return out
