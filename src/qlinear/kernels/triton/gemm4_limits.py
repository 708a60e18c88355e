"""What ``gemm4`` and ``gemm5`` (``qmm4.py``, ``qmm5.py``: Gluon kernels) need, checked without importing Gluon.

The layer asks these questions on every call whose M would pick gemm4, on any machine: a Triton without Gluon,
or with a Gluon older than the one the kernel was written against (3.6; CI compiles it with 3.9), must make the
layer take the next variant, not fail at import.
"""

from __future__ import annotations

import functools
import importlib.util
import re

import torch

from .fragment_order import groups_reasons
from .layout import Packed
from .qmm3 import skinny3_reasons

#: the oldest Triton whose Gluon API gemm4 is written against (the H200's; 3.9 compiles it in CI)
MIN_TRITON = (3, 6)


@functools.cache
def gluon_missing() -> str:
    """'' when the installed Triton has a Gluon gemm4 runs on, else why not (checked once per process)."""
    import triton

    found = re.match(r"(\d+)\.(\d+)", triton.__version__)
    version = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    if version < MIN_TRITON:
        return f"triton {triton.__version__} (Gluon kernels need {MIN_TRITON[0]}.{MIN_TRITON[1]}+)"
    if importlib.util.find_spec("triton.experimental.gluon") is None:
        return f"triton {triton.__version__} has no triton.experimental.gluon"
    return ""


def gemm4_reasons(p: Packed, m: int, dtype: torch.dtype, capability: tuple[int, int] | None,
                  variant: str = "gemm4") -> list[str]:
    """Why ``gemm4`` (or ``gemm5``: the same product and layouts, loads on a warp of their own) cannot run this
    call ([] when it can); ``capability`` None: no CUDA device."""
    out = [r for r in skinny3_reasons(p, m, dtype, variant, capability) if not r.startswith("compute")]
    if variant == "gemm5":  # offsets, groups of 32 through x in fragment order (fragment.py), 8-bit (fragment8.py)
        out = [r for r in out if not r.startswith(("additive offsets", "8-bit words", "field blocks"))]
        out += groups_reasons(p, m)
    elif p.rows_per_block != 8:
        out.append(f"field blocks of {p.rows_per_block} word rows (the A-fragment layout needs 8: group % 64)")
    if capability is None or capability[0] != 9:
        found = "no CUDA device" if capability is None else f"compute capability {capability[0]}.{capability[1]}"
        out.append(f"{found} (Gluon wgmma + TMA: sm_90 only)")
    if (p.kp if p.perm is not None else p.k) % 8:
        out.append(f"K = {p.k} (TMA needs 16-byte activation rows: K % 8 == 0)")
    if capability is not None and gluon_missing():
        out.append(gluon_missing())
    return out
