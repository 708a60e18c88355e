"""Declared combinations that fail today, each a defect reported to the kernel's owner. The tests accept exactly
these (matched by kernel, combination label and message); the report still counts them as failures."""

from __future__ import annotations

import re

#: (kernel class pattern, combination label pattern, message pattern, what is wrong)
KNOWN = [
    (r"BitsAndBytes(Torch|Triton)?Linear", r"-int(16|32|64)$", r"weight: it is bitsandbytes .*; the layer is",
     "bitsandbytes kernels declare pack dtypes int16/int32/int64 (the reference's), the selector accepts them, but "
     "load_bnb refuses every scheme whose pack_dtype is not int8 (and its message names no difference)"),
]


def known(kernel: str, label: str, detail: str) -> str | None:
    """The known defect a failure is, or None."""
    for k, lab, msg, why in KNOWN:
        if re.fullmatch(k, kernel) and re.search(lab, label) and re.search(msg, detail):
            return why
    return None
