"""Column- and row-parallel wrappers around a shard, communicating through ``torch.distributed`` collectives.

Megatron-LM / vLLM semantics: a column-parallel layer holds a range of output channels and, with ``gather_output``,
all-gathers them into the whole output; a row-parallel layer holds a range of input features, multiplies its part
of the input and all-reduces (sum) the partial products, then adds the bias once. Only ``all_gather`` and
``all_reduce`` are used, so the same code runs on NCCL (CUDA tensors) and gloo (CPU tensors); nothing here names a
backend. The wrappers return plain tensors (no DTensor): the models they drop into expect ``nn.Linear`` outputs,
and a packed shard is not an even slice of one logical tensor that DTensor could describe.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..enums import BACKEND
from ..kernels.base import QuantLinear
from .shard import Shard, shard
from .shard_stored import STORED_FORMATS


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, world size) in ``group``; (0, 1) when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _check_world(part: Shard, group: dist.ProcessGroup | None) -> None:
    rank, world = _world(group)
    if part.world_size > 1 and (rank, world) != (part.rank, part.world_size):
        raise ValueError(f"shard: cut for rank {part.rank} of {part.world_size}, but this process is rank {rank} of "
                         f"{world} in its process group")


class ColumnParallelLinear(nn.Module):
    """A shard of the output channels; ``gather_output`` all-gathers the whole output on every rank."""

    def __init__(self, part: Shard, gather_output: bool = True, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if part.dim != "out":
            raise ValueError(f"shard: ColumnParallelLinear takes a dim='out' shard, got dim={part.dim!r}")
        _check_world(part, group)
        self.local = part.layer
        self.part = part
        self.gather_output = gather_output
        self.group = group

    @classmethod
    def from_layer(cls, layer: QuantLinear, gather_output: bool = True, group: dist.ProcessGroup | None = None,
                   backend: BACKEND | str | None = None) -> ColumnParallelLinear:
        """This process's shard of a whole layer (rank and world from ``group``)."""
        rank, world = _world(group)
        return cls(shard(layer, rank, world, "out", backend), gather_output, group)

    @property
    def in_features(self) -> int:
        return self.local.in_features

    @property
    def out_features(self) -> int:
        """The whole layer's output channels when gathered, else this rank's."""
        n = self.local.out_features
        return n * self.part.world_size if self.gather_output else n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        if not self.gather_output or self.part.world_size == 1:
            return y
        y = y.contiguous()
        parts = [torch.empty_like(y) for _ in range(self.part.world_size)]
        dist.all_gather(parts, y, group=self.group)
        return torch.cat(parts, dim=-1)

    def explain(self) -> str:
        p = self.part
        comm = "all_gather of the outputs" if self.gather_output else "no communication (output stays split)"
        return "\n".join([f"ColumnParallelLinear rank {p.rank}/{p.world_size}: {p.note}; {comm}",
                          _local_explain(self.local)])


class RowParallelLinear(nn.Module):
    """A shard of the input features: partial product, all-reduce (sum), then the bias once.

    ``input_is_parallel``: the input is already this rank's contiguous range of features (the output of a
    column-parallel layer without gather); otherwise the wrapper takes its features from the whole input. An
    act-order shard reads its features in group order (see ``shard``), which a contiguous split of the previous
    layer cannot hand it, so it needs the whole input: ``input_is_parallel=True`` is refused for it."""

    def __init__(self, part: Shard, input_is_parallel: bool = False, group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if part.dim != "in":
            raise ValueError(f"shard: RowParallelLinear takes a dim='in' shard, got dim={part.dim!r}")
        if input_is_parallel and part.in_index is not None:
            raise ValueError("shard: this act-order shard reads input features sorted by group, not a contiguous "
                             "range, so input_is_parallel=True cannot feed it; pass the whole input "
                             "(input_is_parallel=False)")
        _check_world(part, group)
        self.local = part.layer
        self.part = part
        self.input_is_parallel = input_is_parallel
        self.group = group
        self.register_buffer("bias", part.bias)
        self.register_buffer("in_index", part.in_index)

    @classmethod
    def from_layer(cls, layer: QuantLinear, input_is_parallel: bool = False, group: dist.ProcessGroup | None = None,
                   backend: BACKEND | str | None = None) -> RowParallelLinear:
        """This process's shard of a whole layer (rank and world from ``group``)."""
        rank, world = _world(group)
        return cls(shard(layer, rank, world, "in", backend), input_is_parallel, group)

    @property
    def in_features(self) -> int:
        k = self.local.in_features
        return k if self.input_is_parallel else k * self.part.world_size

    @property
    def out_features(self) -> int:
        return self.local.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            whole = self.local.in_features * self.part.world_size
            if x.shape[-1] != whole:
                raise ValueError(f"input: expected last dimension {whole} (the whole layer's in_features), got shape "
                                 f"{tuple(x.shape)}")
            i0, i1 = self.part.in_range
            x = x.index_select(-1, self.in_index) if self.in_index is not None else x[..., i0:i1]
        y = self.local(x).contiguous()
        if self.part.world_size > 1:
            dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def explain(self) -> str:
        p = self.part
        feed = "input already split (input_is_parallel)" if self.input_is_parallel else \
            "takes its features from the whole input"
        order = ("act-order: input features sorted by group (vLLM's Marlin order) so every rank holds whole groups "
                 "as a plain grouped layer; the shard gathers them from the whole input" if p.in_index is not None
                 else "contiguous input features")
        if p.in_index is not None and p.layer.scheme.format in STORED_FORMATS:
            order = ("the input features its stored rows hold, through the layout's permutation; the shard gathers "
                     "them from the whole input")
        bias = "; bias added once after the all-reduce" if self.bias is not None else ""
        return "\n".join([f"RowParallelLinear rank {p.rank}/{p.world_size}: {p.note}; {order}; {feed}; "
                          f"all_reduce(sum) of the partial products{bias}", _local_explain(self.local)])


def _local_explain(layer: QuantLinear) -> str:
    choice = getattr(layer, "choice", None)
    return choice.explain() if choice is not None else repr(layer)
