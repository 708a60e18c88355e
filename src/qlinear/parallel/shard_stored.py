"""Tensor-parallel cuts on the stored tensors of layers with no canonical form to cut (EXL2, EXL3, VPTQ) or with an
input transform beside their codes (ParoQuant): the shard is a smaller layer of the same family whose tensors are
slices of the whole layer's (codes stay codes, nothing is re-encoded).

What is local to which side, per layout:

* EXL2 (``layouts/exl2.py``): every ``q_weight`` column and ``q_scale`` word (8 columns) is one set of outputs, so a
  column cut takes whole scale words. Rows sit in stored order (``q_invperm``) in groups of one bit width, each
  group its own whole words and scale row, so a row cut takes whole groups of the stored order; the shard reads
  the input features those stored rows hold (``q_perm[s0:s1]``, a permuted set unless the permutation keeps them
  in place) and its own permutation is the identity.
* EXL3 (``layouts/exl3.py``): ``W = H(diag(suh) H(inner)) diag(svh)`` with 128-point Hadamard blocks on both
  sides of 16x16 trellis tiles: a cut at multiples of 128 keeps every block and tile whole, with its slice of the
  scale (or packed sign) vector.
* VPTQ (``layouts/vptq.py``): vectors of ``v`` (outliers: ``vo``) output rows share one index, so a column cut
  takes whole vectors of both (codebooks, permutation and a per-input norm stay whole). Decoded input columns are
  the outlier columns, then groups of ``group_size`` with a codebook each, then the permutation: a row cut takes
  whole groups of the decoded order (the first rank also the outlier columns), their codebooks, and reads the input
  features the permutation sends them to.
* ParoQuant (``layouts/paroquant.py``): AWQ GEMM words of 8 output columns; the input rotation pairs channels only
  inside each quantization group, so a column cut keeps the rotation whole and a row cut takes whole groups with
  their pairs, angles and channel scales.

Every cut is checked by reading back: the shard's own dequantized weight must equal the slice of the whole layer's
exactly (EXL3: the decoded inner weight and scale vectors, since its float32 Hadamard products round differently
for different matrix shapes; ParoQuant: also the rotation of a probe input), else ``ShardError``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import accumulate

import torch

from ..caps import Problem
from ..enums import BACKEND, FORMAT
from ..kernels.base import QuantLinear
from ..layouts import exl2, exl3, vptq
from ..select import NoKernelError, select
from ..spec import Scheme
from ..target import Target
from .cut_rule import CutRule, ShardError

STORED_FORMATS = frozenset({FORMAT.EXL2, FORMAT.EXL3, FORMAT.VPTQ, FORMAT.PAROQUANT})
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True, eq=False)
class StoredCut:
    """A cut made on stored tensors: the shard's layer, the whole layer's input features it reads when they are not
    its contiguous range (``None`` otherwise), and how the cut was made."""

    layer: QuantLinear
    in_index: torch.Tensor | None
    note: str


def _exl2_bounds(p: exl2.Exl2Params) -> tuple[int, ...]:
    return (0, *accumulate(p.group_rows))


def _vptq_bounds(p: vptq.VptqParams, k: int) -> tuple[int, ...]:
    """Decoded columns a row cut may fall on: group starts after the first group (the first rank keeps the outlier
    columns with at least one group) and K."""
    os_ = p.outlier_size if p.outlier else 0
    return (0, *(os_ + i * p.group_size for i in range(1, p.group_num) if os_ + i * p.group_size < k), k)


def stored_rule(s: Scheme) -> CutRule:
    """The cut rule of an EXL2 / EXL3 / VPTQ / ParoQuant layer (module docstring: what is local to which side)."""
    if s.format is FORMAT.EXL2:
        p = s.layout_params
        if not isinstance(p, exl2.Exl2Params):
            raise ShardError(f"layout_params: an EXL2 layer needs Exl2Params, got {type(p).__name__}")
        rows = ", ".join(f"{r}x{b}-bit" for b, r in zip(p.group_bits, p.group_rows))
        return CutRule("exl2", 8, 1, "whole q_scale words (8 columns)",
                       f"whole row groups of the stored order (groups {rows})", _exl2_bounds(p))
    if s.format is FORMAT.EXL3:
        return CutRule("exl3", exl3.HAD, exl3.HAD, f"whole {exl3.HAD}-point Hadamard blocks (and 16x16 trellis tiles)",
                       f"whole {exl3.HAD}-point Hadamard blocks (and 16x16 trellis tiles)")
    if s.format is FORMAT.VPTQ:
        p = vptq.params_of(s)
        vo = p.outlier_vector_len if p.outlier else 1
        unit = math.lcm(p.vector_len, vo)
        out_why = f"whole vectors of {p.vector_len} rows" + (f" and outlier vectors of {vo}" if p.outlier else "")
        outl = f"the {p.outlier_size} outlier columns with the first group, " if p.outlier else ""
        return CutRule("vptq", unit, 1, out_why, f"whole codebook groups of {p.group_size} decoded columns ({outl}"
                       f"{p.group_num} group(s))", _vptq_bounds(p, s.in_features))
    if s.format is FORMAT.PAROQUANT:
        return CutRule("paroquant", 8, s.group_size, "whole AWQ GEMM words (8 columns)",
                       f"whole rotation groups of {s.group_size} (the pairs rotate channels inside a group)")
    raise ShardError(f"{s.format.value}: not a stored-tensor format ({sorted(f.value for f in STORED_FORMATS)})")


def reads_permuted_input(s: Scheme) -> bool:
    """Whether a row shard of this layer may read a permuted, non-contiguous set of input features (EXL2 stores its
    rows permuted; VPTQ with ``perm``): such a consumer cannot take a contiguous split of the previous layer."""
    if s.format is FORMAT.EXL2:
        return True
    return s.format is FORMAT.VPTQ and vptq.params_of(s).enable_perm


def _scheme(s: Scheme, ns: int, ks: int, **changes: object) -> Scheme:
    group = ks if s.channelwise else s.group_size
    return replace(s, out_features=ns, in_features=ks, group_size=group, **changes)


def _in_index(perm: torch.Tensor, s0: int, s1: int) -> torch.Tensor | None:
    """The input features stored positions ``s0:s1`` hold, or None when they are exactly ``s0:s1``."""
    part = perm[s0:s1].to(torch.int64).cpu()
    return None if torch.equal(part, torch.arange(s0, s1)) else part


def _exl2(layer: QuantLinear, t: Tensors, o0: int, o1: int, s0: int, s1: int
          ) -> tuple[Scheme, Tensors, torch.Tensor | None]:
    s = layer.scheme
    p: exl2.Exl2Params = s.layout_params  # type: ignore[assignment]
    if (o0, o1) != (0, s.out_features):
        out = dict(t, q_weight=t["q_weight"][:, o0:o1], q_scale=t["q_scale"][:, o0 // 8:o1 // 8])
        return _scheme(s, o1 - o0, s.in_features), out, None
    bounds, words = _exl2_bounds(p), (0, *accumulate(p.word_rows))
    g0, g1 = bounds.index(s0), bounds.index(s1)
    sub = exl2.Exl2Params(p.group_bits[g0:g1], p.group_rows[g0:g1], p.stored_perm)
    ident = torch.arange(s1 - s0, dtype=torch.int32)
    out = {"q_weight": t["q_weight"][words[g0]:words[g1]], "q_scale": t["q_scale"][g0:g1],
           "q_scale_max": t["q_scale_max"][g0:g1], "q_groups": sub.q_groups(), "q_invperm": ident}
    if p.stored_perm:
        out["q_perm"] = ident
    perm = torch.argsort(t["q_invperm"].to(torch.int64).cpu())
    return _scheme(s, s.out_features, s1 - s0, bits=sub.max_bits, layout_params=sub), out, _in_index(perm, s0, s1)


def _exl3(layer: QuantLinear, t: Tensors, o0: int, o1: int, i0: int, i1: int
          ) -> tuple[Scheme, Tensors, torch.Tensor | None]:
    s = layer.scheme
    p: exl3.Exl3Params = s.layout_params  # type: ignore[assignment]
    su, sv = p.scale_names
    step = exl3.TILE if p.packed_signs else 1  # packed signs: one int16 word per 16 channels
    out = dict(t, trellis=t["trellis"][i0 // exl3.TILE:i1 // exl3.TILE, o0 // exl3.TILE:o1 // exl3.TILE])
    out[su], out[sv] = t[su][i0 // step:i1 // step], t[sv][o0 // step:o1 // step]
    return _scheme(s, o1 - o0, i1 - i0), out, None


def _vptq(layer: QuantLinear, t: Tensors, o0: int, o1: int, d0: int, d1: int
          ) -> tuple[Scheme, Tensors, torch.Tensor | None]:
    s = layer.scheme
    p = vptq.params_of(s)
    if (o0, o1) != (0, s.out_features):
        out = dict(t, indices=t["indices"][:, o0 // p.vector_len:o1 // p.vector_len])
        if p.outlier:
            vo = p.outlier_vector_len
            out["outlier_indices"] = t["outlier_indices"][:, o0 // vo:o1 // vo]
        if p.enable_norm and p.norm_dim == 1:
            out["weight_scale"], out["weight_bias"] = t["weight_scale"][o0:o1], t["weight_bias"][o0:o1]
        return _scheme(s, o1 - o0, s.in_features), out, None
    os_ = p.outlier_size if p.outlier else 0
    keep = os_ if d0 == 0 else 0  # the first rank holds the outlier columns
    g0, g1 = (max(d0, os_) - os_) // p.group_size, -(-(d1 - os_) // p.group_size)
    sub = replace(p, group_num=g1 - g0, enable_perm=False, outlier_size=keep,
                  **({} if keep else {"outlier_vector_len": -1, "outlier_num_centroids": -1}))
    out = {"indices": t["indices"][g0:g1], "centroids.weight": t["centroids.weight"][g0:g1]}
    if p.residual:
        out["res_centroids.weight"] = t["res_centroids.weight"][g0:g1]
    if keep:
        out["outlier_indices"], out["outlier_centroids.weight"] = t["outlier_indices"], t["outlier_centroids.weight"]
    perm = vptq.as_index(t["perm"]).cpu() if p.enable_perm else torch.arange(s.in_features)
    index = _in_index(perm, d0, d1)
    if p.enable_norm:
        if p.norm_dim == 0:  # a per-input-channel norm follows its channels
            cols = torch.arange(d0, d1) if index is None else index
            out["weight_scale"], out["weight_bias"] = (t[n][cols.to(t[n].device)]
                                                       for n in ("weight_scale", "weight_bias"))
        else:
            out["weight_scale"], out["weight_bias"] = t["weight_scale"], t["weight_bias"]
    return _scheme(s, s.out_features, d1 - d0, layout_params=sub), out, index


def _paro(layer: QuantLinear, t: Tensors, o0: int, o1: int, i0: int, i1: int
          ) -> tuple[Scheme, Tensors, torch.Tensor | None]:
    s = layer.scheme
    gs = s.group_size
    out = dict(t, qweight=t["qweight"][i0:i1, o0 // 8:o1 // 8], qzeros=t["qzeros"][i0 // gs:i1 // gs, o0 // 8:o1 // 8],
               scales=t["scales"][i0 // gs:i1 // gs, o0:o1], pairs=t["pairs"][:, i0:i1],
               theta=t["theta"][:, i0 // 2:i1 // 2], channel_scales=t["channel_scales"][:, i0:i1])
    return _scheme(s, o1 - o0, i1 - i0), out, None


_CUTS = {FORMAT.EXL2: _exl2, FORMAT.EXL3: _exl3, FORMAT.VPTQ: _vptq, FORMAT.PAROQUANT: _paro}


def stored_tensors(layer: QuantLinear) -> Tensors:
    """The layer's checkpoint tensors by checkpoint name, bias aside (what ``state_dict`` holds)."""
    return {k: v for k, v in layer.state_dict().items() if k != "bias" and v is not None}


def cut_stored(layer: QuantLinear, span: tuple[int, int, int, int], backend: BACKEND | str | None,
               bias: torch.Tensor | None) -> StoredCut:
    """The shard of ``layer`` over outputs ``span[0]:span[1]`` and stored inputs ``span[2]:span[3]`` (the caller has
    checked the span against ``stored_rule``), built through the selector and checked by reading back."""
    s = layer.scheme
    o0, o1, i0, i1 = span
    sch, tensors, index = _CUTS[s.format](layer, stored_tensors(layer), o0, o1, i0, i1)
    new = _build(layer, sch, {k: v.contiguous() for k, v in tensors.items()}, backend, bias)
    cols = torch.arange(i0, i1) if index is None else index
    _check_readback(layer, new, (o0, o1), cols)
    note = f"cut on the stored {s.format.value} tensors"
    if index is not None:
        note += ("; the stored rows are permuted (q_invperm), so the shard reads a permuted set of input features"
                 if s.format is FORMAT.EXL2 else "; the input permutation (perm) sends the shard's decoded columns to "
                 "a permuted set of input features, which the shard reads")
    return StoredCut(new, index, note)


def _build(layer: QuantLinear, scheme: Scheme, tensors: Tensors, backend: BACKEND | str | None,
           bias: torch.Tensor | None) -> QuantLinear:
    device = layer.checkpoint_tensors()[0].device
    try:
        choice = select(Problem(scheme, layer.dtype), Target.here(device), backend or layer.backend)
    except NoKernelError as err:
        raise ShardError(f"{type(layer).__name__}: no kernel runs the shard [{scheme.out_features}, "
                         f"{scheme.in_features}]: {err}") from None
    new = choice.kernel(scheme, bias=bias is not None, dtype=layer.dtype)
    state = dict(tensors) if bias is None else dict(tensors, bias=bias.detach().clone())
    try:
        new.load_state_dict(state, strict=True)
    except (RuntimeError, ValueError) as err:
        raise ShardError(f"{type(layer).__name__}: {choice.kernel.__name__} cannot be built from the cut tensors "
                         f"({err})") from None
    if bias is not None and new.bias.dtype != bias.dtype:  # keep the whole layer's bias dtype
        new.bias = bias.detach().clone()
    new = new.to(device)
    new.prepare()
    new.choice = choice
    return new


def _exl3_decoded(layer: QuantLinear) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An EXL3 layer's float16 inner weight ``[N, K]`` and scale vectors ``suh [K]``, ``svh [N]``, decoded exactly
    (table look-ups, no sums: the float32 dense weight's Hadamard products round differently per matrix shape)."""
    t, p = layer.tensors(), layer.scheme.layout_params
    table = exl3.codebook_table(p.codebook, t["trellis"].device)
    suh, svh = exl3.scale_vectors(t, p)
    return exl3.inner_weight(t["trellis"], p.bits, table).t(), suh, svh


def _check_readback(layer: QuantLinear, new: QuantLinear, out: tuple[int, int], cols: torch.Tensor) -> None:
    """The shard's dequantized weight is exactly the whole layer's rows ``out`` and input features ``cols`` (EXL3:
    its inner weight and scale vectors, whose blocks the Hadamard transforms keep apart); a ParoQuant shard also
    rotates a probe input exactly as the whole layer rotates those features."""
    o0, o1 = out
    if layer.scheme.format is FORMAT.EXL3:
        (w, suh, svh), (ws, suh_s, svh_s) = _exl3_decoded(layer), _exl3_decoded(new)
        c = cols.to(w.device)
        same = torch.equal(ws, w[o0:o1][:, c]) and torch.equal(suh_s, suh[c]) and torch.equal(svh_s, svh[o0:o1])
    else:
        whole = layer.dequantize(torch.float32)
        same = torch.equal(new.dequantize(torch.float32), whole[o0:o1][:, cols.to(whole.device)])
    if not same:
        raise ShardError(f"{type(layer).__name__}: the shard's weight does not read back as its slice of the whole "
                         "weight; this cut is not exact for the layout")
    if layer.scheme.format is FORMAT.PAROQUANT:
        dev = layer.qweight.device
        layer.ensure_prepared()
        x = torch.randn(4, layer.in_features, generator=torch.Generator().manual_seed(0)).to(dev, layer.dtype)
        if not torch.equal(new.rotate_input(x[:, cols.to(dev)]), layer.rotate_input(x)[:, cols.to(dev)]):
            raise ShardError(f"{type(layer).__name__}: the shard's input rotation differs from the whole layer's on "
                             "its features; the rotation groups do not stay inside the cut")
