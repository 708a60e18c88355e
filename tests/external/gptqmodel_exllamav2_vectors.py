"""GPTQModel 7.7.0's own preparation of AWQ GEMM buffers for its exllamav2 AWQ kernel (run under .venv-ref)::

    python tests/external/gptqmodel_exllamav2_vectors.py IN.safetensors OUT.safetensors

For every ``<case>/qweight`` / ``<case>/qzeros`` pair in IN (AWQ GEMM 4-bit words), OUT holds what
``AwqExllamaV2Linear.post_init`` hands to the extension: ``unpack_reorder_pack(qweight, qzeros, 4)`` (words packed
along K in input order, zero points in output order), as ``<case>/qweight`` and ``<case>/qzeros``. Shares no code
with qlinear.
"""

from __future__ import annotations

import sys

from gptqmodel.quantization.awq.utils.packing_utils import unpack_reorder_pack
from safetensors.torch import load_file, save_file


def main(src: str, dst: str) -> None:
    t = load_file(src)
    out = {}
    for key in sorted(k for k in t if k.endswith("/qweight")):
        case = key.removesuffix("/qweight")
        qweight, qzeros = unpack_reorder_pack(t[key], t[f"{case}/qzeros"], 4)
        out[f"{case}/qweight"], out[f"{case}/qzeros"] = qweight.contiguous(), qzeros.contiguous()
    save_file(out, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
