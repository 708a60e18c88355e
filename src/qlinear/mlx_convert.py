"""GPTQ / AWQ (any integer-affine layout) <-> MLX affine weights, exactly or not at all.

An integer-affine weight is ``s * (q - z)``; MLX stores ``s * q + b``. The same real numbers need ``b = -s * z``
exactly in the scales' dtype (``from_affine``), and back ``z = -b / s`` an integer in ``0 .. 2^bits - 1`` with
``-s * z == b`` exactly (``to_affine``). Symmetric GPTQ (``z = 2^(bits-1)``, a power of two) always converts;
asymmetric zero points often give a ``s * z`` that float16 cannot hold, and those layers are refused, naming the
first group (``round_biases=True`` rounds instead, as mlx-lm's own AWQ/GPTQ import does: not lossless).
Real MLX-quantized weights almost never convert back: MLX picks ``b`` as a group's edge value and ``s`` so that
zero is representable, so ``-b / s`` is an integer only in some groups (about 70 % at 4 bits, 7 % at 8 bits for
float16 normal weights), never in all groups of a layer.

Same real values does not mean the same float results: MLX rounds ``s * q`` and then the sum in the scales'
dtype, GPTQModel's kernels round ``s * (q - z)`` once, so the dequantized float16 weights of the two formats can
differ in the last bit (tests/test_mlx_convert.py measures it).

Group sizes: MLX has 32, 64 and 128. A larger source group (GPTQ 256 .. 1024, or one group per row) is written
as 128-wide MLX groups repeating its scale and bias; reading back gives the 128-wide groups. Act-order (g_idx)
weights are refused: MLX groups are contiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from .affine import AffineWeight
from .enums import FORMAT, METHOD
from .layouts import mlx
from .layouts.mlx import MlxWeight
from .spec import Scheme


class MlxConversionError(ValueError):
    """A weight MLX cannot hold exactly, or an MLX weight no integer-affine format holds (says which group)."""


def mlx_group_size(group_size: int, in_features: int) -> int | None:
    """The widest MLX group size that divides both the source group size and ``in_features`` (None: none)."""
    for g in sorted(mlx.GROUP_SIZES, reverse=True):
        if group_size % g == 0 and in_features % g == 0:
            return g
    return None


def from_affine(q: AffineWeight, group_size: int | None = None, scale_dtype: torch.dtype | None = None,
                round_biases: bool = False) -> MlxWeight:
    """``q`` as an MLX weight: codes unchanged, ``biases = -scales * zeros`` in the scales' dtype (``scale_dtype``,
    default the weight's own when MLX stores it, else float16). Refuses (``MlxConversionError``) act-order, bit
    widths MLX lacks, group sizes it cannot express, scales the dtype cannot hold and (unless ``round_biases``)
    biases it cannot hold exactly."""
    k = q.in_features
    if q.desc_act:
        raise MlxConversionError("g_idx: the weight is act-order (desc_act); MLX groups are contiguous input channels")
    if q.bits not in mlx.BITS:
        raise MlxConversionError(f"bits: MLX holds {', '.join(map(str, mlx.BITS))}-bit codes; the weight is "
                                 f"{q.bits}-bit")
    gs = mlx_group_size(q.group_size, k) if group_size is None else group_size
    if gs is None or gs not in mlx.GROUP_SIZES or q.group_size % gs or k % gs:
        raise MlxConversionError(f"group_size: MLX groups are 32, 64 or 128 wide and must divide the weight's group "
                                 f"size {q.group_size} and in_features {k}; got {gs}")
    dtype = scale_dtype or (q.scales.dtype if q.scales.dtype in mlx.SCALE_DTYPES else torch.float16)
    reps = q.group_size // gs
    s64 = q.scales.double().repeat_interleave(reps, dim=1)[:, :k // gs]
    z64 = q.zeros.double().repeat_interleave(reps, dim=1)[:, :k // gs]
    scales = s64.to(dtype)
    _first_mismatch(scales.double() != s64, "scales", f"not exactly representable in {dtype}", s64, z64, gs)
    b64 = (-z64) * s64  # mlx-lm's order: a zero zero point gives -0.0 for a positive scale, as its import does
    biases = b64.to(dtype)
    if not round_biases:
        _first_mismatch(biases.double() != b64, "biases", f"-scale * zero is not exactly representable in {dtype} "
                        "(round_biases=True rounds it as mlx-lm's import does; not lossless)", s64, z64, gs)
    return MlxWeight(q.codes, scales, biases, q.bits, gs)


def _first_mismatch(bad: torch.Tensor, name: str, why: str, s: torch.Tensor, z: torch.Tensor, gs: int) -> None:
    where = bad.nonzero()
    if where.numel():
        r, g = where[0].tolist()
        raise MlxConversionError(f"{name}: group (out {r}, inputs {g * gs}..{g * gs + gs - 1}), scale "
                                 f"{s[r, g].item()!r}, zero {int(z[r, g])}: {why}; {len(where)} of {bad.numel()} "
                                 "groups are affected")


def to_affine(w: MlxWeight) -> AffineWeight:
    """``w`` as an integer-affine weight (true zero points ``-biases / scales``), or ``MlxConversionError`` naming
    the first group whose zero point is not an integer in range (or a zero scale with a nonzero bias)."""
    s, b = w.scales.double(), w.biases.double()
    zero_scale = s == 0
    z = torch.where(zero_scale, 0.0, -b / torch.where(zero_scale, 1.0, s))
    maxq = (1 << w.bits) - 1
    zi = z.round().clamp(0, maxq)
    ok = (zi == z) & (-(s * zi) == b)
    bad = (~ok).nonzero()
    if bad.numel():
        r, g = bad[0].tolist()
        raise MlxConversionError(f"biases: group (out {r}, inputs {g * w.group_size}..{(g + 1) * w.group_size - 1}): "
                                 f"-bias/scale = {-b[r, g].item()!r}/{s[r, g].item()!r} = {z[r, g].item()!r} is not an "
                                 f"integer zero point in 0..{maxq}; {len(bad)} of {b.numel()} groups are not "
                                 "(MLX's own quantizer rarely gives integer zero points: such weights have no "
                                 "GPTQ/AWQ form)")
    zeros = zi.to(torch.int32)
    k = w.in_features
    g_idx = torch.arange(k, dtype=torch.int32) // w.group_size
    sym = bool((zeros == 1 << (w.bits - 1)).all())
    return AffineWeight(w.codes, w.scales, zeros, g_idx, w.bits, w.group_size, sym)


def mlx_scheme(q: AffineWeight | MlxWeight, group_size: int) -> Scheme:
    return mlx.scheme_for(q.bits, group_size, q.in_features, q.out_features)


def convert_tensors(tensors: Mapping[str, torch.Tensor], scheme: Scheme, to: FORMAT,
                    pack_dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], Scheme]:
    """``convert.convert_tensors`` where MLX is the source or the target format (lossless or refused)."""
    from .canonical import ConversionError, affine_difference, decode, encode, target_scheme

    what = f"cannot convert {scheme.format.value} to {to.value}"
    try:
        if scheme.format is FORMAT.MLX:
            w = mlx.from_checkpoint(tensors, scheme)
            if to is FORMAT.MLX:
                out, target = mlx.to_checkpoint(w), scheme
                bias_dtype = w.scales.dtype
            else:
                q = to_affine(w)
                target = target_scheme(scheme, to, pack_dtype)
                target = replace(target, sym=q.sym)
                out = encode(q, target)
                lost = affine_difference(q, decode(out, target))
                if lost is not None:
                    raise ConversionError(f"{what} without loss: {lost}")
                bias_dtype = torch.float16 if to is not FORMAT.GEMM else out["scales"].dtype
        else:
            q = decode(tensors, scheme)
            if not isinstance(q, AffineWeight):
                raise ConversionError(f"{what}: the weight has float codes, which MLX affine does not hold")
            w = from_affine(q)
            target = mlx_scheme(q, w.group_size)
            out = mlx.to_checkpoint(w)
            _check_same_values(q, mlx.from_checkpoint(out, target), what)
            bias_dtype = w.scales.dtype
    except ConversionError:
        raise
    except ValueError as err:  # MlxConversionError and layout errors
        raise ConversionError(f"{what}: {err}") from None
    bias = tensors.get("bias")
    if bias is not None:
        cast = bias.detach().to(bias_dtype)
        if not torch.equal(cast.double(), bias.detach().double()):
            raise ConversionError(f"{what} without loss: bias is not exactly representable in {bias_dtype}")
        out["bias"] = cast
    return out, target


def _check_same_values(q: AffineWeight, back: MlxWeight, what: str) -> None:
    """The MLX weight read back holds ``q``'s codes and, per input channel, its scale and ``-scale * zero``."""
    from .canonical import ConversionError

    g = q.g_idx.long()
    mg = torch.arange(q.in_features) // back.group_size
    if not torch.equal(back.codes, q.codes):
        raise ConversionError(f"{what} without loss: codes differ after packing")
    s = q.scales.double()[:, g]
    if not torch.equal(back.scales.double()[:, mg], s):
        raise ConversionError(f"{what} without loss: scales differ")
    if not torch.equal(back.biases.double()[:, mg], -(s * q.zeros.double()[:, g])):
        raise ConversionError(f"{what} without loss: biases differ from -scale * zero")


def mlx_config(schemes: Mapping[str, Scheme]) -> dict[str, object]:
    """mlx-lm's ``quantization`` dict for these modules: the commonest bits / group size, and a per-module entry
    (by module path) for each module that differs, as ``mlx_lm.utils.quantize_model`` writes them."""
    from collections import Counter

    if any(s.method is not METHOD.MLX for s in schemes.values()):
        raise ValueError("mlx_config: every module must be an MLX scheme")
    bits, gs = Counter((s.bits, s.group_size) for s in schemes.values()).most_common(1)[0][0]
    out: dict[str, object] = {"group_size": gs, "bits": bits, "mode": "affine"}
    for name, s in schemes.items():
        if (s.bits, s.group_size) != (bits, gs):
            out[name] = {"group_size": s.group_size, "bits": s.bits, "mode": "affine"}
    return out
