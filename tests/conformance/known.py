"""Declared combinations that fail today, each a defect reported to the kernel's owner. The tests accept exactly
these (matched by kernel, combination label and message); the report still counts them as failures."""

from __future__ import annotations

import re

#: (kernel class pattern, combination label pattern, message pattern, what is wrong)
KNOWN = [
    (r"(Awq)?(Marlin|Machete)Linear", r"^marlin-", r"takes GPTQ / AWQ buffers: a Marlin-format",
     "vLLM Marlin / Machete kernels declare the marlin format (as the reference) but take GPTQ / AWQ buffers: the "
     "loader re-encodes a (B, s) module to gptq_v2, the class itself refuses the marlin scheme"),
    (r"AwqMarlinLinear", r"-8b-", r"Marlin has no kernel for 8-bit weights with zero points",
     "AwqMarlinLinear declares 8-bit asymmetric weights (the reference's) but vLLM 0.33's marlin_gemm refuses them"),
    (r"AwqMacheteLinear", r"-g32-", r"group size 32: vLLM 0\.33's Machete runs group sizes 64, 128",
     "AwqMacheteLinear declares group size 32 (the reference's) but vLLM 0.33's Machete refuses it on the H200"),
]


def known(kernel: str, label: str, detail: str) -> str | None:
    """The known defect a failure is, or None."""
    for k, lab, msg, why in KNOWN:
        if re.fullmatch(k, kernel) and re.search(lab, label) and re.search(msg, detail):
            return why
    return None
