"""Cut one qlinear layer into the slice a tensor-parallel rank holds, on the packed weight (codes stay codes).

Column-parallel (``dim="out"``) keeps a range of output channels, row-parallel (``dim="in"``) a range of input
features. The weight is cut in its canonical form (``AffineWeight``, ``FloatWeight``, ``BnbWeight``, ``MlxWeight``,
``QQQWeight``; GGUF: whole stored blocks; EXL2 / EXL3 / VPTQ / ParoQuant: their stored tensors, ``shard_stored.py``)
and re-encoded in the layer's own format, so the shard is an ordinary qlinear layer of a smaller
shape: the selector picks its kernel and ``explain()`` works. ``cut_rule`` gives, per format, the unit a rank's
share must be a multiple of; a cut that breaks a unit is refused with the world sizes that would work.

Act-order (``g_idx``) row-parallel cuts sort the input features by group first (vLLM's Marlin order), so each
rank holds whole groups as a plain grouped layer; the shard then reads a permuted, non-contiguous set of input
features (``Shard.in_index``), which the row-parallel wrapper gathers from the full input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from ..activations import ActScales, ActStrategy
from ..affine import AffineWeight
from ..blockfloat import FloatWeight
from ..bnb_weight import BnbInt8Weight, BnbWeight
from ..caps import Problem
from ..enums import BACKEND, FORMAT, METHOD
from ..floats import Element
from ..kernels.base import QuantLinear
from ..kernels.bnb_base import BnbQuantLinear
from ..kernels.float_base import FloatQuantLinear
from ..kernels.gguf_torch import GGUFQuantLinear
from ..kernels.mlx_torch import MlxTorchLinear
from ..kernels.qqq import QQQQuantLinear
from ..layouts.gguf import type_info as gguf_type_info
from ..layouts.mlx import MlxWeight
from ..layouts.qqq import QQQWeight
from ..select import NoKernelError, select
from ..spec import Scheme
from ..target import Target
from .cut_rule import CutRule, ShardError, cuts_evenly, valid_world_sizes
from .shard_stored import STORED_FORMATS, cut_stored, stored_rule

DIMS = ("out", "in")
#: Kernels that quantize their activations per token inside the product (W4A8, W4AFP8, LLM.int8's int8 matmul):
#: on a row shard the per-token scale would come from a rank's features only, so they take column cuts only.
PER_TOKEN_KERNELS = frozenset({BACKEND.QQQ, BACKEND.QQQ_TORCH, BACKEND.GPTQ_W4AFP8})


@dataclass(frozen=True, eq=False)
class Shard:
    """One rank's slice: an ordinary qlinear ``layer`` plus where it sits in the whole layer.

    ``out_range``/``in_range``: the channels of the whole layer this shard covers (contiguous), ``in_index``: the
    whole layer's input features this shard reads, in its order, when they are not a contiguous range (act-order
    row cut), ``bias``: a row-parallel cut's bias, kept out of the local product so it is added once after the
    reduction. ``note``: how the cut was made, for ``explain()``."""

    layer: QuantLinear
    dim: str
    rank: int
    world_size: int
    out_range: tuple[int, int]
    in_range: tuple[int, int]
    in_index: torch.Tensor | None
    bias: torch.Tensor | None
    note: str


def _word_unit(scheme: Scheme) -> int:
    """Codes per run of whole words (4-bit in int32: 8; 3-bit: 32 codes in 3 words)."""
    dt = scheme.pack_dtype if isinstance(scheme.pack_dtype, torch.dtype) else torch.int32
    word = torch.empty(0, dtype=dt).element_size() * 8
    return math.lcm(word, scheme.bits) // scheme.bits


def _format_rule(scheme: Scheme) -> CutRule:
    s = scheme
    if s.format in STORED_FORMATS:
        return stored_rule(s)
    n, k = s.out_features, s.in_features
    if s.method is METHOD.GGUF:
        info = gguf_type_info(s.qtype)
        b = info.block_size
        return CutRule(f"gguf {info.name}", 1, b, "whole rows of blocks", f"whole {info.name} blocks of {b} values")
    if s.element is not None:
        bn, bk = s.scale_block or (1, k)
        pair = 2 if s.element is Element.E2M1 else 1
        ou = bn if bn < n else 1
        iu = math.lcm(bk if bk < k else 1, pair)
        return CutRule(f"float {s.format.value}", ou, iu, f"whole scale blocks of {bn} rows" if ou > 1 else
                       "rows (one scale covers every row)", f"whole scale blocks of {bk} values" +
                       (" and FP4 byte pairs" if pair > 1 else "") if iu > 1 else "features")
    if s.method is METHOD.BITSANDBYTES:
        if s.bits == 8:
            return CutRule("bitsandbytes int8", 1, 1, "rows (one SCB per row)", "features (SCB is per row)")
        bs = s.blocksize
        if k % bs:
            return CutRule(f"bitsandbytes {s.bnb_type}", bs // math.gcd(k, bs), 0,
                           f"rows whose flat start falls on a {bs}-value absmax block",
                           f"in_features {k} is not a multiple of the absmax block {bs}: blocks straddle rows")
        return CutRule(f"bitsandbytes {s.bnb_type}", 1, bs, "rows", f"whole absmax blocks of {bs} values")
    unit = _word_unit(s)
    if s.format is FORMAT.GPTQ_P:  # planar: every 32 codes along a packed axis share their words across bit planes
        unit = math.lcm(unit, 32)
    iu = unit if s.channelwise else math.lcm(unit, s.group_size)
    if s.format is FORMAT.QQQ:
        return CutRule("qqq", unit, 0, f"whole packed words ({unit} codes)", "QQQ (W4A8) quantizes activations per "
                       "token inside its product: a rank sees only its features, so a row cut would change the numbers")
    return CutRule(f"affine {s.format.value}", unit, iu, f"whole packed words ({unit} codes)",
                   f"whole packed words ({unit} codes)" + ("" if s.channelwise else f" and groups of {s.group_size}"))


def cut_rule(scheme: Scheme) -> CutRule:
    """The cut rule of a layer's format (see docs/parallel.md for the table), narrowed by its activation
    quantization: a row cut must keep each activation scale's inputs on one rank (per-group scales: whole groups;
    a static per-tensor scale: any cut; a scale over a whole token or a dynamic per-tensor one: no row cut)."""
    rule = _format_rule(scheme)
    act = scheme.activations
    if act is None or rule.in_unit <= 0 or (act.scales is ActScales.STATIC and act.strategy is ActStrategy.TENSOR):
        return rule
    if act.strategy in (ActStrategy.GROUP, ActStrategy.TENSOR_GROUP) and act.group_size:
        # GROUP: every scale from its own group; TENSOR_GROUP (NVFP4): group scales under a stored global one
        return replace(rule, in_unit=math.lcm(rule.in_unit, act.group_size),
                       in_why=f"{rule.in_why} and activation groups of {act.group_size}")
    return replace(rule, in_unit=0, in_why=f"activation quantization {act.describe()} takes its scale over the whole "
                   "input; a rank sees only its features, so a row-parallel cut would change the numbers "
                   "(column-parallel works)")


def check_cut(scheme: Scheme, world_size: int, dim: str, what: str = "layer",
              kernel: type[QuantLinear] | None = None) -> tuple[int, int]:
    """``(whole size, per-rank size)`` along ``dim``, or ``ShardError`` with the valid world sizes (``what`` names
    the layer in the message; ``kernel``: the shard's kernel, whose declared multiples also apply)."""
    if dim not in DIMS:
        raise ShardError(f"dim: expected 'out' (column-parallel) or 'in' (row-parallel), got {dim!r}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ShardError(f"world_size: expected a positive integer, got {world_size!r}")
    rule = cut_rule(scheme)
    size = scheme.out_features if dim == "out" else scheme.in_features
    unit, why = rule.unit(dim)
    need = 0 if kernel is None else kernel.caps.out_divisible if dim == "out" else kernel.caps.in_divisible
    if unit > 0 and need > 1 and unit % need:
        unit, why = math.lcm(unit, need), f"{why} (and multiples of {need} for {kernel.__name__})"
    if world_size == 1:
        return size, size
    feat = "out_features" if dim == "out" else "in_features"
    if unit <= 0:
        raise ShardError(f"{what} ({rule.family}): cannot cut {feat}={size}: {why}; world sizes that work: [1]")
    points = rule.points(dim)
    if not cuts_evenly(size, world_size, unit, points):
        works = valid_world_sizes(size, unit, points=points)
        raise ShardError(f"{what} ({rule.family}): cannot cut {feat}={size} into {world_size} "
                         f"equal shares of {why}; world sizes that work: {works}")
    return size, size // world_size


def _block_of(block: tuple[int, int] | None, whole: tuple[int, int], part: tuple[int, int]
              ) -> tuple[int, int] | None:
    """A scale block after the cut: a block that spanned a whole dimension spans the shard's."""
    if block is None:
        return None
    return tuple(p if b >= w else b for b, w, p in zip(block, whole, part, strict=True))  # type: ignore[return-value]


def shard_scheme(s: Scheme, ns: int, ks: int) -> Scheme:
    """The scheme of a ``[ns, ks]`` shard of a layer of scheme ``s`` (the same format and numbers): a scale block
    or group that spanned a whole dimension spans the shard's."""
    block = _block_of(s.scale_block, (s.out_features, s.in_features), (ns, ks))
    group = ks if s.channelwise else s.group_size
    if block is not None:
        group = min(block[1], ks)
    return replace(s, out_features=ns, in_features=ks, group_size=group, scale_block=block,
                   per_tensor_scale=s.per_tensor_scale and block == (ns, ks))


def shard(layer: QuantLinear, rank: int, world_size: int, dim: str = "out",
          backend: BACKEND | str | None = None) -> Shard:
    """Rank ``rank``'s slice of ``layer`` cut along ``dim`` ("out": column-parallel, "in": row-parallel).

    ``backend``: the shard's kernel (default the whole layer's; ``"auto"`` lets the selector choose per shard).
    Raises ``ShardError`` for a cut that breaks the format's units (listing the world sizes that work), an
    act-order layer whose groups are not all full, or activation quantization a row cut would change."""
    same = backend is None or BACKEND(backend) is layer.backend
    size, part = check_cut(layer.scheme, world_size, dim, type(layer).__name__, type(layer) if same else None)
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ShardError(f"rank: expected 0..{world_size - 1}, got {rank!r}")
    s = layer.scheme
    n, k = s.out_features, s.in_features
    lo, hi = rank * part, (rank + 1) * part
    o0, o1, i0, i1 = (lo, hi, 0, k) if dim == "out" else (0, n, lo, hi)
    ns, ks = o1 - o0, i1 - i0
    bias = getattr(layer, "bias", None)
    local_bias = bias[o0:o1] if (bias is not None and dim == "out") else None
    index, note = None, f"{'column' if dim == 'out' else 'row'}-parallel cut {rank}/{world_size}: " \
                        f"{'out' if dim == 'out' else 'in'} channels {lo}:{hi} of {size}"
    sch = shard_scheme(s, ns, ks)
    if s.format in STORED_FORMATS:
        cut = cut_stored(layer, (o0, o1, i0, i1), backend, local_bias)
        new, index, note = cut.layer, cut.in_index, f"{note}; {cut.note}"
    elif isinstance(layer, GGUFQuantLinear):
        info = layer.type_info
        b0, b1 = i0 // info.block_size * info.type_size, -(-i1 // info.block_size) * info.type_size
        blocks = layer.blocks()[o0:o1, b0:b1].contiguous()
        new = _build(layer, sch, backend, dim, local_bias, lambda m, b: m.load_blocks(blocks, b))
    elif isinstance(layer, FloatQuantLinear):
        w = layer.float_weight()
        bn, bk = s.scale_block or (1, k)
        blk = _block_of((bn, bk), (n, k), (ns, ks))
        r0, r1 = (o0 // bn, -(-o1 // bn)) if bn < n else (0, 1)
        c0, c1 = (i0 // bk, -(-i1 // bk)) if bk < k else (0, 1)
        ws = FloatWeight(w.codes[o0:o1, i0:i1].contiguous(), w.element, w.scales[r0:r1, c0:c1].contiguous(), blk,
                         w.global_scale, w.rule)
        new = _build(layer, sch, backend, dim, local_bias, lambda m, b: m.load_float(ws, b))
    elif isinstance(layer, BnbQuantLinear):
        w = layer.bnb_weight()
        ws = _cut_bnb(w, o0, o1, i0, i1)
        if isinstance(w, BnbWeight):
            sch = replace(sch, double_quant=False)
            if w.nested is not None:
                note += "; nested absmax stored decoded (float32 values, the same numbers)"
        new = _build(layer, sch, backend, dim, local_bias, lambda m, b: m.load_bnb(ws, b))
    elif isinstance(layer, (MlxTorchLinear, QQQQuantLinear)):
        new = _build(layer, sch, backend, dim, local_bias, _own_form_loader(layer, o0, o1, i0, i1))
        if not torch.equal(new.dequantize(torch.float32), layer.dequantize(torch.float32)[o0:o1, i0:i1]):
            raise ShardError(f"{type(layer).__name__}: the shard does not read back its slice of the whole weight")
    else:
        q = _affine(layer)
        if dim == "in" and q.desc_act:
            index, q = _sorted_by_group(q, layer)
            note += f" of the input features sorted by group (g_idx), {ks // q.group_size} whole groups per rank; " \
                    "the shard reads a permuted set of input features"
            sch = replace(sch, desc_act=False)
            index = index[i0:i1]
        qs = _cut_affine(q, o0, o1, i0, i1)
        new = _build(layer, sch, backend, dim, local_bias, lambda m, b: m.load_affine(qs, b))
        if not _same_affine(qs, new.affine()):
            raise ShardError(f"{type(layer).__name__}: the shard re-encoded in {s.format.value} does not read back "
                             "the cut codes, zeros and scales exactly; this layout cannot be cut losslessly")
    row_bias = bias.detach().clone() if (bias is not None and dim == "in") else None
    return Shard(new, dim, rank, world_size, (o0, o1), (i0, i1), index, row_bias, note)


def _own_form_loader(layer: QuantLinear, o0: int, o1: int, i0: int, i1: int
                     ) -> Callable[[QuantLinear, torch.Tensor | None], None]:
    """Cut formats with a lossless form of their own that AffineWeight cannot hold: MLX (float biases, not integer
    zero points) and QQQ (grouped: int8 rounding between two scales; column cuts only, its cut rule refuses rows)."""
    if isinstance(layer, MlxTorchLinear):
        w = layer.mlx_weight()
        g0, g1 = i0 // w.group_size, -(-i1 // w.group_size)
        wm = MlxWeight(w.codes[o0:o1, i0:i1].contiguous(), w.scales[o0:o1, g0:g1].contiguous(),
                       w.biases[o0:o1, g0:g1].contiguous(), w.bits, w.group_size)
        return lambda m, b: m.load_mlx(wm, b)
    q = layer.qqq_weight()
    gs = q.group_size if q.grouped else i1 - i0
    wq = QQQWeight(q.codes[o0:o1, i0:i1].contiguous(), q.group_scales[o0:o1, i0 // gs:i1 // gs].contiguous()
                   if q.grouped else q.group_scales[o0:o1], q.channel_scales[o0:o1].contiguous(), gs)
    return lambda m, b: m.load_qqq(wq, b)


def _affine(layer: QuantLinear) -> AffineWeight:
    try:
        q = layer.affine()
    except (NotImplementedError, TypeError, ValueError) as err:
        raise ShardError(f"{type(layer).__name__} ({layer.scheme.format.value}): no cut rule for this layout "
                         f"({err})") from None
    if not isinstance(q, AffineWeight):
        raise ShardError(f"{type(layer).__name__} ({layer.scheme.format.value}): no cut rule for this layout (its "
                         f"weight is a {type(q).__name__}, not integer-affine codes)")
    return q


def _same_affine(a: AffineWeight, b: AffineWeight) -> bool:
    """The shard's layer reads back exactly the cut codes, zeros, scales (as values) and g_idx."""
    return all(torch.equal(x, y) for x, y in ((a.codes, b.codes), (a.zeros.long(), b.zeros.long()),
                                               (a.g_idx.long(), b.g_idx.long()),
                                               (a.scales.double(), b.scales.double())))


def _sorted_by_group(q: AffineWeight, layer: QuantLinear) -> tuple[torch.Tensor, AffineWeight]:
    """Input features in group order (stable), and the weight in that order with a plain ``g_idx``."""
    counts = torch.bincount(q.g_idx.long().cpu(), minlength=q.num_groups)
    gs = q.group_size
    if q.in_features % gs or not bool((counts == gs).all()):
        raise ShardError(f"{type(layer).__name__}: act-order row-parallel cut needs every group to hold exactly "
                         f"group_size={gs} input features; found group sizes {sorted(set(counts.tolist()))}")
    perm = torch.argsort(q.g_idx.long().cpu(), stable=True).to(q.codes.device)
    plain = torch.arange(q.in_features, dtype=torch.int32, device=q.g_idx.device) // gs
    return perm, AffineWeight(q.codes[:, perm].contiguous(), q.scales, q.zeros, plain, q.bits, gs, q.sym)


def _cut_affine(q: AffineWeight, o0: int, o1: int, i0: int, i1: int) -> AffineWeight:
    """Codes, scales and zeros of the cut; a channelwise weight keeps its one group over the shard's features."""
    g = q.g_idx[i0:i1]
    if q.group_size >= q.in_features:
        gs, g0, g1 = i1 - i0, 0, 1
    elif q.desc_act:  # column cut of an act-order weight: every group, same g_idx
        gs, g0, g1 = q.group_size, 0, q.num_groups
    else:
        gs, g0, g1 = q.group_size, i0 // q.group_size, -(-i1 // q.group_size)
    return AffineWeight(q.codes[o0:o1, i0:i1].contiguous(), q.scales[o0:o1, g0:g1].contiguous(),
                        q.zeros[o0:o1, g0:g1].contiguous(), (g - g0).contiguous(), q.bits, gs, q.sym)


def _cut_bnb(w: BnbWeight | BnbInt8Weight, o0: int, o1: int, i0: int, i1: int) -> BnbWeight | BnbInt8Weight:
    if isinstance(w, BnbInt8Weight):
        return BnbInt8Weight(w.codes[o0:o1, i0:i1].contiguous(), w.scb[o0:o1].contiguous())
    k, bs = w.in_features, w.blocksize
    absmax = w.absmax_values()
    if i1 - i0 == k:
        am = absmax[o0 * k // bs: -(-o1 * k // bs)]
    else:
        am = absmax.reshape(w.out_features, k // bs)[o0:o1, i0 // bs:i1 // bs].reshape(-1)
    return BnbWeight(w.codes[o0:o1, i0:i1].contiguous(), w.quant_type, bs, am.contiguous(), w.quant_map, w.dtype)


def row_refusal(kernel: type[QuantLinear], scheme: Scheme) -> str:
    """Why ``kernel`` cannot run a row shard of ``scheme`` (it quantizes activations per token), or ''."""
    if kernel.backend in PER_TOKEN_KERNELS or (kernel.backend is BACKEND.BITSANDBYTES and scheme.bits == 8):
        exact = " or name backend='bitsandbytes_torch' (exact) for it" if scheme.bits == 8 else ""
        return (f"{kernel.__name__} quantizes activations per token inside its product, so a row-parallel shard "
                f"would change the numbers (a rank sees only its features); cut it column-parallel{exact}")
    return ""


def _build(layer: QuantLinear, scheme: Scheme, backend: BACKEND | str | None, dim: str, bias: torch.Tensor | None,
           load: Callable[[QuantLinear, torch.Tensor | None], None]) -> QuantLinear:
    """A layer of ``scheme`` through the selector (the whole layer's backend unless told), loaded and prepared."""
    device = layer.checkpoint_tensors()[0].device
    target = Target.here(device)
    try:
        choice = select(Problem(scheme, layer.dtype), target, backend or layer.backend)
    except NoKernelError as err:
        raise ShardError(f"{type(layer).__name__}: no kernel runs the shard [{scheme.out_features}, "
                         f"{scheme.in_features}]: {err}") from None
    why = row_refusal(choice.kernel, scheme) if dim == "in" else ""
    if why:
        raise ShardError(f"{type(layer).__name__}: {why}")
    new = choice.kernel(scheme, bias=bias is not None, dtype=layer.dtype)
    try:
        load(new, bias)
    except (NotImplementedError, TypeError) as err:
        raise ShardError(f"{type(layer).__name__}: {choice.kernel.__name__} cannot be built from the cut weight "
                         f"({err})") from None
    with torch.no_grad():
        for name in (scheme.activations.tensor_names if scheme.activations else ()):
            new._buffers[name] = getattr(layer, name).detach().clone()
    new = new.to(device)
    new.prepare()
    new.choice = choice
    return new
