"""Marlin tensors to and from ``AffineWeight``: the set the Marlin kernels take, and the legacy Marlin checkpoint.

Kernel set (``to_marlin`` / ``from_marlin``), what vLLM's ``gptq_marlin`` / ``awq_marlin`` and GPTQModel pass to
``marlin_gemm``: ``qweight`` tiles, ``scales`` permuted, ``qzeros`` (Marlin-packed true zero points) unless every
zero point is ``2**(b-1)`` (then the kernel's fixed-bias types uint4b8 / uint8b128 hold the weight), and for
act-order the sorted ``g_idx`` with ``perm``.

Legacy checkpoint (``checkpoint_format: marlin``, or ``is_marlin_format: true`` before AutoGPTQ 0.8; written by
AutoGPTQ's ``MarlinQuantLinear``, read by AutoGPTQ and vLLM's ``marlin`` method): per module ``B`` int32
``[K/16, 2N]`` (4-bit tiles), ``s`` float16 ``[G, N]`` permuted, optional ``bias`` float16 ``[N]`` in natural
order (added after the GEMM). The weight is ``s * (q - 8)``: 4-bit, symmetric, no zero points, no g_idx.
Reading accepts any whole tile grid and group size that divides K; writing also keeps to what those readers
accept (K % 128, N % 256, group size 128 or K), so a file qlinear writes loads in both.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..affine import AffineWeight
from ..enums import FORMAT
from ..spec import Scheme
from . import marlin
from .tensors import require_tensors

LEGACY_BITS = 4
LEGACY_GROUPS = (128,)  # or the whole row (group_size -1)
LEGACY_K, LEGACY_N = 128, 256  # AutoGPTQ: infeatures % 128, outfeatures % 256 (vLLM: K % 128, N % 64)


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def _symmetric(zeros_ng: torch.Tensor, bits: int) -> bool:
    return bool((zeros_ng == 1 << (bits - 1)).all())


def to_marlin(q: AffineWeight, scale_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The Marlin kernel tensors of ``q``: ``qweight``, ``scales`` (``scale_dtype``, default q's), ``qzeros`` when
    some zero point is not ``2**(b-1)``, and ``g_idx`` (sorted) + ``perm`` when ``q`` is act-order."""
    marlin.check_bits(q.bits)
    marlin.check_shape(q.in_features, q.out_features)
    perm = g_sorted = None
    if q.desc_act:
        g_sorted, perm = marlin.sort_g_idx(q.g_idx)
    out = {"qweight": marlin.pack_weight(q.codes.t(), q.bits, perm),
           "scales": marlin.permute_scales(q.scales.t().to(scale_dtype or q.scales.dtype))}
    if not _symmetric(q.zeros, q.bits):
        out["qzeros"] = marlin.pack_zeros(q.zeros.t(), q.bits)
    if perm is not None:
        out.update(g_idx=g_sorted, perm=perm)
    return out


def from_marlin(tensors: Mapping[str, torch.Tensor], bits: int, in_features: int, out_features: int,
                group_size: int, sym: bool | None = None) -> AffineWeight:
    """Decode the Marlin kernel tensors (see ``to_marlin``) of a ``[out_features, in_features]`` layer.

    ``group_size`` -1 means one group per row. Without ``qzeros`` every zero point is ``2**(b-1)``. ``sym``
    defaults to "no qzeros".
    """
    marlin.check_bits(bits)
    k, n = in_features, out_features
    marlin.check_shape(k, n)
    gs = k if group_size == -1 else group_size
    _need(isinstance(gs, int) and gs > 0, f"group_size: expected -1 or a positive length, got {group_size!r}")
    for name in ("qweight", "scales"):
        _need(name in tensors, f"{name}: missing (Marlin tensors are qweight, scales[, qzeros][, g_idx, perm])")
    _need(("g_idx" in tensors) == ("perm" in tensors), "g_idx / perm: act-order needs both (sorted g_idx and perm), "
                                                       f"found only {'g_idx' if 'g_idx' in tensors else 'perm'}")
    groups = -(-k // gs)
    s = tensors["scales"]
    _need(isinstance(s, torch.Tensor) and tuple(s.shape) == (groups, n),
          f"scales: expected shape [{groups}, {n}] for K={k} group_size={gs}, got "
          f"{list(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__}")
    perm = tensors.get("perm")
    codes = marlin.unpack_weight(tensors["qweight"], bits, k, n, perm)
    if "qzeros" in tensors:
        zeros = marlin.unpack_zeros(tensors["qzeros"], bits)
        _need(tuple(zeros.shape) == (groups, n), f"qzeros: expected shape [{groups}, {n * bits // 32}], got "
                                                 f"{list(tensors['qzeros'].shape)}")
    else:
        zeros = torch.full((groups, n), 1 << (bits - 1), dtype=torch.int32)
    if perm is None:
        g_idx = (torch.arange(k) // gs).to(torch.int32)
    else:
        g_sorted = tensors["g_idx"]
        _need(isinstance(g_sorted, torch.Tensor) and tuple(g_sorted.shape) == (k,),
              f"g_idx: expected the sorted group ids, shape [{k}], got {getattr(g_sorted, 'shape', g_sorted)!r}")
        _need(bool((g_sorted[1:] >= g_sorted[:-1]).all()), "g_idx: expected sorted group ids (g_idx[perm]) next to "
                                                            "perm, found a decrease")
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[perm.long().cpu()] = g_sorted.cpu().to(torch.int32)
    return AffineWeight(codes=codes.t().contiguous(), scales=marlin.unpermute_scales(s).t().contiguous(),
                        zeros=zeros.t().contiguous(), g_idx=g_idx, bits=bits, group_size=gs,
                        sym="qzeros" not in tensors if sym is None else sym)


# ---------------------------------------------------------------- the legacy checkpoint (B, s)
def checkpoint_shapes(scheme: Scheme) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Expected shape and dtype of a legacy Marlin module's tensors (``B``, ``s``); raises if it has none."""
    _need(scheme.format is FORMAT.MARLIN, f"scheme: expected format 'marlin', got {scheme.format.value!r}")
    _need(scheme.bits == LEGACY_BITS, f"bits: Marlin checkpoints (B, s) hold 4-bit codes with a fixed bias of 8 "
                                      f"(AutoGPTQ's and vLLM's legacy marlin kernel), got bits={scheme.bits}")
    _need(scheme.sym, "sym: Marlin checkpoints (B, s) store no zero points (the kernel subtracts 8): symmetric only, "
                      "but the config says sym=false")
    k, n, gs = scheme.in_features, scheme.out_features, scheme.group_size
    marlin.check_shape(k, n)
    _need(k % gs == 0, f"group_size: {gs} does not divide in_features {k} (Marlin scales cover whole groups)")
    return {"B": ((k // marlin.TILE_K, n * marlin.TILE_K * LEGACY_BITS // 32), torch.int32),
            "s": ((k // gs, n), torch.float16)}


def from_checkpoint(tensors: Mapping[str, torch.Tensor], scheme: Scheme) -> AffineWeight:
    """Decode a legacy Marlin module (``B``, ``s``; bias is not part of the weight) into an AffineWeight."""
    require_tensors(tensors, checkpoint_shapes(scheme), scheme, {"s": (torch.bfloat16,)})
    return from_marlin({"qweight": tensors["B"], "scales": tensors["s"]}, LEGACY_BITS, scheme.in_features,
                       scheme.out_features, scheme.group_size, sym=True)


def checkpoint_problems(q: AffineWeight) -> list[str]:
    """Every reason ``q`` cannot be written as a legacy Marlin module that AutoGPTQ and vLLM both read."""
    k, n, out = q.in_features, q.out_features, []
    if q.bits != LEGACY_BITS:
        out.append(f"bits: Marlin checkpoints hold 4-bit codes, got {q.bits}-bit")
    if q.desc_act:
        out.append("g_idx: act-order (desc_act) weights have no Marlin checkpoint encoding (it stores no g_idx); "
                   "keep them in gptq / gptq_v2")
    if k % LEGACY_K or n % LEGACY_N:
        out.append(f"shape: Marlin checkpoints need in_features % {LEGACY_K} == 0 and out_features % {LEGACY_N} == 0 "
                   f"(AutoGPTQ's MarlinQuantLinear), got in_features {k}, out_features {n}")
    if q.group_size not in (*LEGACY_GROUPS, k):
        out.append(f"group_size: Marlin checkpoints use group size 128 or -1 (AutoGPTQ's and vLLM's marlin readers), "
                   f"got {q.group_size}")
    if q.bits == LEGACY_BITS and not _symmetric(q.zeros, q.bits):
        bad = (q.zeros != 8).nonzero()[0].tolist()
        out.append(f"zeros: Marlin checkpoints are symmetric (every zero point 8, none stored); found "
                   f"{int(q.zeros[bad[0], bad[1]])} at (out column {bad[0]}, group {bad[1]})")
    return out


def to_checkpoint(q: AffineWeight, scale_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """The legacy Marlin checkpoint tensors ``B`` and ``s`` of ``q``; raises listing every problem."""
    problems = checkpoint_problems(q)
    _need(scale_dtype == torch.float16, f"scale_dtype: Marlin checkpoints store float16 scales, got {scale_dtype}")
    _need(not problems, "; ".join(problems))
    scales = q.scales.detach().cpu().to(torch.float16)
    if not bool(torch.isfinite(scales).all()):
        n, g = (~torch.isfinite(scales)).nonzero()[0].tolist()
        raise ValueError(f"scales: {q.scales[n, g].item()} at (out column {n}, group {g}) is not finite as float16")
    t = to_marlin(AffineWeight(codes=q.codes.detach().cpu(), scales=scales, zeros=q.zeros.detach().cpu(),
                               g_idx=q.g_idx.detach().cpu(), bits=q.bits, group_size=q.group_size, sym=True))
    return {"B": t["qweight"], "s": t["scales"]}
