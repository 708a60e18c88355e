"""The one check every layout runs on checkpoint tensors before decoding them."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..spec import Scheme


def check_against(tensors: Mapping[str, torch.Tensor],
                  expected: Mapping[str, tuple[tuple[int, ...], tuple[torch.dtype, ...]]], what: str) -> None:
    """Raise ``ValueError`` naming the tensor, the expected and the found shape/dtype, unless every tensor in
    ``expected`` (name -> shape, allowed dtypes) is present as it should be; ``what`` describes the layer."""
    for name, (shape, dtypes) in expected.items():
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"{name}: missing ({what} needs {', '.join(expected)})")
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != tuple(shape) or t.dtype not in dtypes:
            wanted = " or ".join(str(d) for d in dtypes)
            raise ValueError(f"{name}: expected shape {list(shape)} dtype {wanted} for {what}, got shape "
                             f"{list(t.shape)} dtype {t.dtype}")


def require_tensors(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                    scheme: Scheme, also_accepted: Mapping[str, tuple[torch.dtype, ...]] | None = None) -> None:
    """Raise ``ValueError`` naming the tensor, the expected and the found shape/dtype, unless every tensor in
    ``expected`` is present as it should be. ``also_accepted`` lists extra dtypes a tensor may have."""
    extra = also_accepted or {}
    for name, (shape, dtype) in expected.items():
        if name not in tensors:
            raise ValueError(f"{name}: missing from the checkpoint tensors (found {', '.join(sorted(tensors))}); "
                             f"expected shape {list(shape)} dtype {dtype}")
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        allowed = (dtype, *extra.get(name, ()))
        if tuple(t.shape) != shape or t.dtype not in allowed:
            want = " or ".join(str(d) for d in dict.fromkeys(allowed))
            raise ValueError(f"{name}: expected shape {list(shape)} dtype {want} for {scheme.format.value} "
                             f"{scheme.bits}-bit K={scheme.in_features} N={scheme.out_features} "
                             f"gs={scheme.group_size} G={scheme.num_groups}, got shape {list(t.shape)} dtype {t.dtype}")
