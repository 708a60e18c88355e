"""Marlin tensors made by GPTQModel 7.7.0's own CPU helpers, saved as test vectors (run under .venv-ref)::

    python tests/external/gptqmodel_marlin_vectors.py OUT.safetensors

``gptqmodel.utils.marlin``: ``marlin_permute_scales`` (grouped, channelwise ``-1`` and ``group_size == K``),
``marlin_permute_bias``, ``marlin_zero_points`` and ``awq_to_marlin_zero_points`` (4 and 8 bits),
``marlin_sort_g_idx``, ``pack_cols``; and the legacy 4-bit weight table ``_get_perms()`` of
``gptqmodel.nn_modules.qlinear.marlin``, applied as the legacy Python Marlin procedure does (16x16 blocks, rows
of 16N, every 1024 values through the table, 8 consecutive values per word with ``pack_cols``). The repack
ops themselves are CUDA only (tests/test_marlin_vllm_golden.py holds vLLM's). Inputs and outputs are stored
under ``<case>/<name>``; case parameters in the metadata key ``cases`` (JSON). Shares no code with qlinear.
"""

from __future__ import annotations

import json
import sys

import torch


def main(path: str) -> None:
    from gptqmodel.nn_modules.qlinear.marlin import _get_perms
    from gptqmodel.utils.marlin import (
        awq_to_marlin_zero_points,
        marlin_permute_bias,
        marlin_permute_scales,
        marlin_sort_g_idx,
        marlin_zero_points,
        pack_cols,
    )
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(77)
    tensors: dict[str, torch.Tensor] = {}
    cases: list[dict] = []

    def add(case: dict, **named: torch.Tensor) -> None:
        cases.append(case)
        tensors.update({f"{case['name']}/{k}": v.contiguous() for k, v in named.items()})

    for groups, k, n, gs in ((4, 256, 128, 64), (8, 256, 256, 32), (1, 128, 192, -1), (1, 128, 192, 128)):
        s = (torch.rand(groups, n, generator=g) * 0.02 + 1e-3).to(torch.float16)
        add({"name": f"scales_g{groups}_gs{gs}", "kind": "scales", "k": k, "n": n, "group_size": gs},
            scales=s, out=marlin_permute_scales(s, k, n, gs))
    bias = torch.randn(192, generator=g).to(torch.float16)
    add({"name": "bias", "kind": "bias"}, bias=bias, out=marlin_permute_bias(bias))
    for bits in (4, 8):
        pf = 32 // bits
        for groups, n in ((1, 128), (3, 192)):
            z = torch.randint(0, 1 << bits, (groups, n), generator=g, dtype=torch.int32)
            add({"name": f"zeros{bits}_g{groups}", "kind": "zeros", "bits": bits},
                zeros=z, out=marlin_zero_points(z, groups, n, bits))
            q = torch.randint(-2**31, 2**31, (groups, n // pf), generator=g, dtype=torch.int64).to(torch.int32)
            add({"name": f"awq_zeros{bits}_g{groups}", "kind": "awq_zeros", "bits": bits},
                qzeros=q, out=awq_to_marlin_zero_points(q, groups, n, bits))
    g_idx = (torch.arange(128, dtype=torch.int32) // 32)[torch.randperm(128, generator=g)].contiguous()
    g_sorted, perm = marlin_sort_g_idx(g_idx)
    add({"name": "sort", "kind": "sort"}, g_idx=g_idx, sorted=g_sorted.to(torch.int32), perm=perm.to(torch.int32))
    table = _get_perms()[0]
    for k, n, act in ((16, 64, False), (64, 192, False), (128, 256, True)):
        codes = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
        p = torch.randperm(k, generator=g).to(torch.int32) if act else torch.arange(k, dtype=torch.int32)
        rows = codes[p.long()]
        tiled = rows.reshape(k // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, 16 * n)
        tiled = tiled.reshape(-1, table.numel())[:, table].reshape(k // 16, 16 * n)
        add({"name": f"weight_{k}x{n}{'_perm' if act else ''}", "kind": "weight", "k": k, "n": n, "act": act},
            codes=codes.to(torch.uint8), perm=p, out=pack_cols(tiled, 4, k // 16, 16 * n))
    save_file(tensors, path, metadata={"cases": json.dumps(cases)})


if __name__ == "__main__":
    main(sys.argv[1])
