"""Plain-Python facts about how the Triton kernels run: whether the CPU interpreter is on, and the last launch.

Imports neither triton nor a kernel module, so any floor (the backends, the kernel bodies, the benchmarks) can ask.
"""

from __future__ import annotations

import os

#: the last compiled kernel launched, by launcher name (for resource and SASS inspection by
#: benchmarks/gpu_check.py --sass)
LAST: dict[str, object] = {}


def interpreting() -> bool:
    """Triton's CPU interpreter is on (tests): kernels then run on CPU tensors (read per call, never cached)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
