"""EXL3's Triton decode on CUDA, bit for bit: every width (1..8) and codebook against the Torch layout.

    PYTHONPATH=src python benchmarks/gpu_exl3_decode_check.py

The interpreter tests run the kernels' plain-Triton lines; on CUDA the codebooks may take PTX instead (mul1's byte
sum as one dp4a, ``exl3_codebook.py``), which only a GPU runs. Per (bits, codebook): the block decode's float16
inner weight equals ``layouts.exl3.inner_weight`` bit for bit, and the one-row GEMV is within 1e-3 of the float64
product of that weight. Exits 1 on any failure.
"""

from __future__ import annotations

import sys

import torch

from qlinear.kernels.triton import exl3_mv as mv
from qlinear.layouts import exl3


def main() -> int:
    gen = torch.Generator(device="cuda").manual_seed(5)
    bad = 0
    print(f"{torch.cuda.get_device_name()}: bits codebook | decode bit-exact | GEMV rel err vs float64")
    for bits in range(1, 9):
        for cb in exl3.CODEBOOKS:
            tr = torch.randint(-32768, 32768, (64, 32, 16 * bits), dtype=torch.int16, device="cuda", generator=gen)
            ref = exl3.inner_weight(tr.cpu(), bits, exl3.codebook_table(cb))
            same = torch.equal(mv.decode_inner(tr, bits, cb).cpu().view(torch.int16), ref.view(torch.int16))
            xh = torch.randn(1, 16 * tr.shape[0], dtype=torch.float16, device="cuda", generator=gen)
            want = xh.double().cpu() @ ref.double()
            err = float((mv.inner_product(xh, tr, bits, cb).double().cpu() - want).norm() / want.norm())
            bad += (not same) or not err < 1e-3
            print(f"{bits} {cb} | {same} | {err:.1e}", flush=True)
    print(f"failed: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
