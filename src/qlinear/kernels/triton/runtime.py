"""How the Triton kernels run: whether the CPU interpreter is on, the last launch, the thread's CUDA context.

Imports neither triton nor a kernel module (torch only), so any floor (the backends, the kernel bodies, the
benchmarks) can ask.
"""

from __future__ import annotations

import os
import threading

import torch

#: the last compiled kernel launched, by launcher name (for resource and SASS inspection by
#: benchmarks/gpu_check.py --sass)
LAST: dict[str, object] = {}


def interpreting() -> bool:
    """Triton's CPU interpreter is on (tests): kernels then run on CPU tensors (read per call, never cached)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_BOUND = threading.local()


def bind_cuda_context(device: torch.device) -> None:
    """Make ``device``'s primary CUDA context current on this thread, once per thread, before a launch with TMA
    descriptors. Triton encodes them through the driver (``cuTensorMapEncodeTiled``) before its launcher checks
    for a context, and a thread that PyTorch served only from its caching allocator has made no runtime call that
    would bind one: the encode then fails with "invalid device context" (seen on 2 of 8 threads sharing a layer on
    an H100). ``cudaMemGetInfo`` binds the primary context as any runtime call does."""
    if device.type != "cuda":
        return
    index = torch.cuda.current_device() if device.index is None else device.index
    bound = getattr(_BOUND, "devices", None)
    if bound is None:
        bound = _BOUND.devices = set()
    if index not in bound:
        torch.cuda.mem_get_info(index)
        bound.add(index)
