"""Tensor-parallel checkpoint loading: each rank reads only the bytes of its own slice of every module.

A module's stored tensors are cut where the format's layout makes a rank's slice an even, contiguous piece of each
axis (GPTQ v1/v2 and AWQ gemm words, planar GPTQ's 32-code blocks (its cut rule keeps them whole),
compressed-tensors packed/unpacked integers and FP8/NVFP4/MXFP4): the axis sizes of the whole module's layout and
of the shard's layout (``checkpoint_shapes`` of both schemes) say which axes shrink, and the rank reads piece
``rank`` of each. Reading goes through a memory map, so a column slice of a row-major ``[K/8, N]`` GPTQ ``qweight``
copies only its own columns: what a rank holds is ~1/world of the packed module. Layouts whose slices interleave
(Marlin tiles, AWQ GEMV) and act-order row cuts (whose features are sorted by group first) read the whole module
and cut it in memory (``Shard.note`` says so). GGUF files: ``load_gguf.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..checkpoint.load import build_layer
from ..checkpoint.module_plan import ModulePlan
from ..checkpoint.plan import plan_checkpoint
from ..checkpoint.safetensors_io import CheckpointError, TensorInfo, read_tensor
from ..enums import BACKEND, FORMAT, METHOD
from ..kernels.base import QuantLinear
from ..layouts import awq, ct_int, float_layouts, gptq
from ..spec import Scheme
from ..target import Target
from .shard import Shard, ShardError, check_cut, row_refusal, shard, shard_scheme

#: Module-name suffix -> cut dimension, the llama plan (q/k/v/gate/up column-parallel, o/down row-parallel).
LLAMA_DIMS: Mapping[str, str] = {"q_proj": "out", "k_proj": "out", "v_proj": "out", "gate_proj": "out",
                                 "up_proj": "out", "o_proj": "in", "down_proj": "in"}
#: Formats whose stored slices are contiguous pieces of each axis, with the function giving their tensor shapes.
SLICED: Mapping[FORMAT, Callable[[Scheme], Mapping[str, tuple[tuple[int, ...], object]]]] = {
    FORMAT.GPTQ: gptq.checkpoint_shapes, FORMAT.GPTQ_V2: gptq.checkpoint_shapes, FORMAT.GPTQ_P: gptq.checkpoint_shapes,
    FORMAT.GEMM: awq.checkpoint_shapes,
    **{f: ct_int.checkpoint_shapes for f in ct_int.INT_FORMATS},
    **{f: float_layouts.checkpoint_shapes for f in float_layouts.FLOAT_LAYOUT_FORMATS},
}
_INT_OF_SIZE = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def read_slice(info: TensorInfo, index: tuple[slice, ...]) -> torch.Tensor:
    """The part ``index`` of a stored tensor, reading (through a memory map) only the pages that hold it."""
    dtype = info.dtype
    if dtype is None:
        raise CheckpointError(f"{info.file}: tensor {info.name!r}: dtype {info.code} is not one qlinear reads")
    item = torch.empty((), dtype=dtype).element_size()
    if info.end == info.begin:
        return read_tensor(info)[index]
    mm = np.memmap(info.file, dtype=_INT_OF_SIZE[item], mode="r", offset=info.begin, shape=info.shape)
    part = np.array(mm[index], copy=True)  # a fresh array of the slice alone (never a view of the map)
    del mm
    return torch.from_numpy(part).view(dtype)


def sliced_tensors(mp: ModulePlan, rank: int, world: int, dim: str) -> tuple[dict[str, torch.Tensor], Scheme]:
    """Rank ``rank``'s stored tensors of module ``mp`` and its scheme, reading only their slices.

    Raises ``KeyError`` when the layout is not one cut this way (the caller reads the whole module)."""
    s = mp.scheme
    shapes = SLICED[s.format]
    ns, ks = (s.out_features // world, s.in_features) if dim == "out" else (s.out_features, s.in_features // world)
    sub = shard_scheme(s, ns, ks)
    whole, part = shapes(s), shapes(sub)
    out: dict[str, torch.Tensor] = {}
    for leaf, info in mp.tensors.items():
        if leaf == "bias":
            out[leaf] = read_slice(info, (slice(rank * sub.out_features, (rank + 1) * sub.out_features),)) \
                if dim == "out" else read_tensor(info)
            continue
        if leaf not in whole or tuple(info.shape) != tuple(whole[leaf][0]):
            out[leaf] = read_tensor(info)  # small per-tensor values (global and activation scales)
            continue
        index = []
        for w, p in zip(whole[leaf][0], part[leaf][0]):
            if w == p:
                index.append(slice(None))
            elif p * world == w:
                index.append(slice(rank * p, (rank + 1) * p))
            else:
                raise KeyError(f"{leaf}: axis of {w} does not cut into {world} pieces of {p}")
        out[leaf] = read_slice(info, tuple(index))
    if "weight_shape" in out:  # compressed-tensors records the module's shape as a tensor
        out["weight_shape"] = torch.tensor([sub.out_features, sub.in_features], dtype=out["weight_shape"].dtype)
    for leaf in ("g_idx", "weight_g_idx"):
        if leaf in out and dim == "in":  # a plain grouping: the shard's groups start at 0
            out[leaf] = out[leaf] - (rank * sub.in_features) // s.group_size
    return out, sub


def load_shard(mp: ModulePlan, rank: int, world: int, dim: str, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float16, backend: BACKEND | str = BACKEND.AUTO) -> Shard:
    """Rank ``rank``'s shard of one planned module (see the module docstring for what is read)."""
    s = mp.scheme
    _, size = check_cut(s, world, dim, mp.name)
    target = Target.here(device)
    act_order = s.desc_act and dim == "in"
    if s.format in SLICED and not act_order and s.method is not METHOD.GGUF:
        try:
            tensors, sub = sliced_tensors(mp, rank, world, dim)
        except KeyError:
            pass
        else:
            bias = tensors.pop("bias") if dim == "in" and "bias" in tensors else None
            layer = build_layer(mp.name, sub, tensors, target, dtype, backend)
            why = row_refusal(type(layer), sub) if dim == "in" else ""
            if why:
                raise ShardError(f"{mp.name}: {why}")
            lo, hi = rank * size, (rank + 1) * size
            o, i = ((lo, hi), (0, s.in_features)) if dim == "out" else ((0, s.out_features), (lo, hi))
            note = f"{'column' if dim == 'out' else 'row'}-parallel cut {rank}/{world}: {dim} channels {lo}:{hi} " \
                   f"of {s.out_features if dim == 'out' else s.in_features}, read as slices of the stored tensors"
            return Shard(layer, dim, rank, world, o, i, None, bias, note)
    whole = build_layer(mp.name, s, {leaf: read_tensor(info) for leaf, info in mp.tensors.items()}, target, dtype,
                        backend)
    part = shard(whole, rank, world, dim)
    return replace(part, note=part.note + "; read whole, then cut (this layout's slices are not contiguous)")


def load_checkpoint(path: str | Path, tp_rank: int, tp_size: int, plan: Mapping[str, str] = LLAMA_DIMS,
                    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
                    backend: BACKEND | str = BACKEND.AUTO) -> dict[str, Shard | QuantLinear]:
    """Every quantized module of a safetensors checkpoint for rank ``tp_rank`` of ``tp_size``: a ``Shard`` for the
    modules ``plan`` cuts (module-name suffix -> "out" / "in"), the whole layer for the others."""
    ckpt = plan_checkpoint(Path(path))
    target = Target.here(device)
    out: dict[str, Shard | QuantLinear] = {}
    for name, mp in ckpt.modules.items():
        dim = plan.get(name.rsplit(".", 1)[-1])
        if dim is None:
            tensors = {leaf: read_tensor(info) for leaf, info in mp.tensors.items()}
            out[name] = build_layer(name, mp.scheme, tensors, target, dtype, backend)
        else:
            out[name] = load_shard(mp, tp_rank, tp_size, dim, device, dtype, backend)
    return out
