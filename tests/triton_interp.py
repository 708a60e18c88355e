"""Shared set-up for the Triton interpreter tests (not a test module).

``interpreted(kernel)`` is a context manager: skip unless ``kernel`` was defined interpreted
(TRITON_INTERPRET=1 set before its module was imported), and meanwhile make the interpreter
multiply bfloat16 dot operands as float32 (Triton 3.9's interpreter multiplies the raw bfloat16
bit patterns as integers otherwise).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest


@contextlib.contextmanager
def interpreted(kernel: object) -> Iterator[None]:
    import triton.language as tl
    from triton.runtime import interpreter as it

    if type(kernel).__name__ != "InterpretedFunction":
        pytest.skip("the kernel bodies were imported before TRITON_INTERPRET=1 was set")
    original = it.InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, *args):
        def f32(h):
            if h.dtype.scalar == tl.bfloat16:
                return it.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
            return h

        return original(self, f32(a), f32(b), d, *args)

    it.InterpreterBuilder.create_dot = create_dot
    try:
        yield
    finally:
        it.InterpreterBuilder.create_dot = original
