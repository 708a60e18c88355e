"""qlinear's Marlin encoder against vLLM 0.33's own ``gptq_marlin_repack`` / ``awq_marlin_repack`` output, made on an
H200 by benchmarks/marlin_golden.py and stored in tests/fixtures/marlin_vllm_repack.safetensors: for every case
the CPU codec reproduces the op's words bit for bit from the same source words (and ``perm``), and decodes them back.
Where the file also holds the op's GEMM (``marlin_gemm`` on those words), the product must match the float64
weight dequantized from the source words, which checks the file, not our code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qlinear.layouts import marlin as m

GOLDEN = Path(__file__).parent / "fixtures" / "marlin_vllm_repack.safetensors"


@pytest.fixture(scope="module")
def golden() -> tuple[list[dict], dict[str, torch.Tensor]]:
    if not GOLDEN.exists():
        pytest.skip(f"{GOLDEN.name} absent: it is made on a CUDA machine with vLLM's ops by "
                    "benchmarks/marlin_golden.py")
    from safetensors import safe_open

    with safe_open(str(GOLDEN), "pt") as fh:
        return json.loads(fh.metadata()["cases"]), {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118


def test_every_case_is_present(golden) -> None:
    cases, t = golden
    assert cases and {c["kind"] for c in cases} <= {"gptq", "awq"}
    for c in cases:
        assert f"{c['name']}.src" in t and f"{c['name']}.marlin" in t, c["name"]
        assert (f"{c['name']}.perm" in t) == bool(c["act_order"]), c["name"]


def test_encoder_reproduces_vllm_repack_bit_for_bit(golden) -> None:
    cases, t = golden
    kinds = set()
    for c in cases:
        name, bits, k, n = c["name"], c["bits"], c["k"], c["n"]
        src, want = t[f"{name}.src"], t[f"{name}.marlin"]
        perm = t.get(f"{name}.perm")
        if c["kind"] == "gptq":
            got = m.gptq_to_marlin(src, bits, perm)
            back = m.marlin_to_gptq(want, bits, k, n, perm)
        else:
            got = m.awq_to_marlin(src, bits)
            back = m.marlin_to_awq(want, bits, k, n)
        assert got.dtype == want.dtype == torch.int32 and got.shape == want.shape == (k // 16, n * 16 * bits // 32)
        diff = (got != want).nonzero()
        assert not diff.numel(), f"{name}: first differing word at {diff[0].tolist()}"
        assert torch.equal(back, src), name  # every field of the random source words is a code
        kinds.add((c["kind"], bits, perm is not None))
    assert {("gptq", 4, False), ("gptq", 4, True), ("gptq", 8, True), ("awq", 4, False), ("awq", 8, False)} <= kinds


def test_the_files_gemm_matches_the_source_weight(golden) -> None:
    cases, t = golden
    checked = 0
    for c in cases:
        name, bits = c["name"], c["bits"]
        if f"{name}.y" not in t:
            continue
        pf, mask, src = 32 // bits, (1 << bits) - 1, t[f"{name}.src"].long()
        fields = torch.stack([(src >> (bits * i)) & mask for i in range(pf)], dim=-1)  # [rows, cols, pf]
        if c["kind"] == "gptq":  # field i of word [r, n] is row r*pf + i
            codes = fields.permute(0, 2, 1).reshape(c["k"], c["n"])
            zeros = torch.full_like(t[f"{name}.scales"], 1 << (bits - 1), dtype=torch.float64)
        else:  # field i of word [k, c] is column c*pf + ORDER[i]
            order = torch.tensor((0, 2, 4, 6, 1, 3, 5, 7) if bits == 4 else (0, 2, 1, 3))
            codes = torch.empty_like(fields)
            codes[:, :, order] = fields
            codes, zeros = codes.reshape(c["k"], c["n"]), t[f"{name}.zeros"].double()
        g = t[f"{name}.g_idx"].long()
        w = (codes.double() - zeros[g]) * t[f"{name}.scales"].double()[g]  # [K, N]
        ref = t[f"{name}.x"].double() @ w
        err = float((t[f"{name}.y"].double() - ref).abs().max() / ref.abs().max())
        assert err < 1e-2, f"{name}: marlin_gemm is {err:.3g} from the float64 product"
        checked += 1
    assert checked >= 1
