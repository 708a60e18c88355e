"""The llama tensor-parallel plan, decided from the layers' schemes and applied in each rank.

Megatron / vLLM's plan: q/k/v and gate/up column-parallel, o and down row-parallel, so a decoder block
communicates twice per forward (one all-reduce after o, one after down). Each producer/consumer pair is decided
together, because a consumer fed a split input needs its producers left split:

* ``split``: producers cut without gather, consumer cut row-parallel on the split input. Attention heads split
  with the projections (each rank runs ``num_heads / world`` query and ``num_kv_heads / world`` key/value heads):
  transformers' attention infers the head count from the projection's width, so nothing in the config changes.
  Needs whole heads per rank and a consumer cut that takes a contiguous input range (not act-order).
* ``gathered`` otherwise (SmolLM2's 9 query / 3 key-value heads at tp=2; an act-order consumer; a consumer whose
  groups do not cut): producers all-gather their outputs, attention runs on every head in every rank, and the
  consumer is cut row-parallel on the whole input, or column-parallel with gather when its input features do not
  cut. A layer that cannot be cut either way stays whole on every rank (``replicated``).

Layers that are not qlinear layers (an unquantized head, embeddings) stay whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from ..enums import BACKEND
from ..kernels.base import QuantLinear
from ..model import set_submodule
from ..spec import Scheme
from .layers import ColumnParallelLinear, RowParallelLinear, _world
from .shard import Shard, ShardError, check_cut, row_refusal
from .shard_stored import reads_permuted_input

#: (producers, consumer, the config's head counts or None) of a llama decoder block.
LLAMA_PAIRS = ((("q_proj", "k_proj", "v_proj"), "o_proj", ("num_attention_heads", "num_key_value_heads")),
               (("gate_proj", "up_proj"), "down_proj", None))
HOWS = ("column", "column+gather", "row", "row(whole input)", "replicated")


@dataclass(frozen=True)
class Placement:
    """What the plan does with one layer (one of ``HOWS``), and why when it fell back from the split plan."""

    name: str
    how: str
    why: str = ""

    @property
    def dim(self) -> str | None:
        """The cut dimension ("out", "in"), or None for a replicated layer."""
        return "out" if self.how.startswith("column") else "in" if self.how.startswith("row") else None


def _cuts(name: str, scheme: Scheme | None, world: int, dim: str, kernel: type[QuantLinear] | None = None) -> str:
    """'' when the layer cuts into ``world`` along ``dim`` (by its format, and by ``kernel``'s declared multiples
    when the kernel is known), else why not."""
    if scheme is None:
        return f"{name} is not a qlinear layer"
    try:
        check_cut(scheme, world, dim, name, kernel)
    except ShardError as err:
        return str(err)
    return row_refusal(kernel, scheme) if dim == "in" and kernel is not None else ""


def _heads_split(config: object, attrs: tuple[str, str] | None, world: int) -> str:
    if attrs is None:
        return ""
    counts = [getattr(config, a, None) for a in attrs]
    if any(c is None or c % world for c in counts):
        return f"heads {dict(zip(attrs, counts))} do not divide by world size {world}"
    return ""


def llama_placements(schemes: Mapping[str, Scheme], config: object, world: int,
                     kernels: Mapping[str, type[QuantLinear]] | None = None) -> list[Placement]:
    """The plan for every qlinear projection of llama decoder blocks (``schemes``: module name -> scheme;
    ``kernels``: module name -> the kernel its shards will run, where known)."""
    kernels = kernels or {}

    def cuts(n: str, dim: str) -> str:
        return _cuts(n, schemes.get(n), world, dim, kernels.get(n))

    out: list[Placement] = []
    suffixes = {c: (p, h) for p, c, h in LLAMA_PAIRS}
    consumers = sorted(n for n in schemes if n.rsplit(".", 1)[-1] in suffixes)
    for cname in consumers:
        prefix, consumer = cname.rsplit(".", 1)
        producers, heads = suffixes[consumer]
        names = [f"{prefix}.{p}" for p in producers]
        reasons = [cuts(n, "out") for n in names] + [cuts(cname, "in"), _heads_split(config, heads, world)]
        if schemes[cname].desc_act:
            reasons.append(f"{cname} is act-order: it reads its input sorted by group, not a contiguous split")
        elif reads_permuted_input(schemes[cname]):
            reasons.append(f"{cname} ({schemes[cname].format.value}) reads its input through a stored permutation, "
                           "not a contiguous split")
        why = "; ".join(r for r in reasons if r)
        for n in names:
            if n in schemes:
                gone = cuts(n, "out")
                out.append(Placement(n, "replicated", gone) if gone else
                           Placement(n, "column+gather", why) if why else Placement(n, "column"))
        if not why:
            out.append(Placement(cname, "row"))
        elif not cuts(cname, "in"):
            out.append(Placement(cname, "row(whole input)", why))
        elif not cuts(cname, "out"):
            out.append(Placement(cname, "column+gather", why))
        else:
            out.append(Placement(cname, "replicated", why))
    return out


def wrap(p: Placement, part: Shard, group: dist.ProcessGroup | None = None) -> nn.Module:
    """The parallel module for a placement and this rank's shard."""
    if p.how in ("column", "column+gather"):
        return ColumnParallelLinear(part, gather_output=p.how == "column+gather", group=group)
    return RowParallelLinear(part, input_is_parallel=p.how == "row", group=group)


def apply_llama_plan(model: nn.Module, group: dist.ProcessGroup | None = None,
                     backend: BACKEND | str | None = None) -> list[Placement]:
    """Replace, in place, the qlinear projections of a transformers llama-style model by this rank's parallel
    shards (rank and world from ``group``). Every rank calls it on the same model. Returns the placements."""
    from .shard import shard

    rank, world = _world(group)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    kernels = {n: type(m) for n, m in layers.items()} if backend is None else None
    placements = llama_placements({n: m.scheme for n, m in layers.items()}, getattr(model, "config", None), world,
                                  kernels)
    for p in placements:
        if p.dim is not None:
            set_submodule(model, p.name, wrap(p, shard(layers[p.name], rank, world, p.dim, backend), group))
    return placements


def summary(placements: list[Placement]) -> str:
    """One line: how many projections of each kind went which way (``o_proj: row(whole input) x30``)."""
    counts: dict[tuple[str, str], int] = {}
    for p in placements:
        key = (p.name.rsplit(".", 1)[-1], p.how)
        counts[key] = counts.get(key, 0) + 1
    return ", ".join(f"{kind}: {how} x{n}" for (kind, how), n in counts.items())
