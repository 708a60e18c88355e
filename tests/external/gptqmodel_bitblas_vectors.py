"""The integer codes and zero points GPTQModel 7.7.0 hands to BitBLAS's weight transform (run under .venv-ref)::

    python tests/external/gptqmodel_bitblas_vectors.py IN.safetensors OUT.safetensors

For every case ``<case>/qweight``, ``<case>/qzeros`` (GPTQ v2 or AWQ gemm words) in IN, this runs the first half of
``BitblasLinear.repack_from_gptq`` / ``AWQBitBlasKernel.repack_from_awq`` (``nn_modules/qlinear/bitblas.py``,
``bitblas_awq.py``) with their own helpers: ``unpack_gptq_qweight`` of ``qweight.T`` viewed as int8,
``unpack_gptq_qzeros(...) - 1`` (a v2 module, as GPTQModel converts checkpoints to before repacking), and
``unpack_awq`` + ``reverse_awq_order``. The second half (``general_compress`` + LOP3) needs BitBLAS's TVM build;
tests/test_bitblas.py checks it against BitBLAS's NumPy functions. Writes ``<case>/intweight`` ``[N, K]`` and
``<case>/intzeros`` ``[G, N]``. Shares no code with qlinear.
"""

from __future__ import annotations

import json
import sys

import torch


def main(src: str, dst: str) -> None:
    from gptqmodel.nn_modules.qlinear.bitblas import unpack_gptq_qweight, unpack_gptq_qzeros
    from gptqmodel.quantization.awq.utils.packing_utils import reverse_awq_order, unpack_awq
    from safetensors import safe_open
    from safetensors.torch import save_file

    out = {}
    with safe_open(src, "pt") as fh:
        cases = json.loads(fh.metadata()["cases"])
        for c in cases:
            name, bits = c["name"], c["bits"]
            qweight, qzeros = fh.get_tensor(f"{name}/qweight"), fh.get_tensor(f"{name}/qzeros")
            if c["method"] == "gptq":
                intweight = unpack_gptq_qweight(qweight.T.contiguous().view(torch.int8), bits).contiguous()
                intzeros = unpack_gptq_qzeros(qzeros, bits, is_gptq_v2=False).contiguous() - 1
            else:
                intweight, intzeros = unpack_awq(qweight, qzeros, bits)
                intweight, intzeros = reverse_awq_order(intweight, intzeros, bits)
                maxq = (1 << bits) - 1
                intweight = torch.bitwise_and(intweight, maxq).to(torch.int8).t().contiguous()
                intzeros = torch.bitwise_and(intzeros, maxq).to(torch.int8).contiguous()
            out[f"{name}/intweight"], out[f"{name}/intzeros"] = intweight, intzeros
    save_file(out, dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
