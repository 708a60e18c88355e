"""``triton/gather.py``: x's columns through an int32 index in one launch, -1 reading 0 (interpreter on CPU).

The reference is a Python loop over the index, written apart from the kernel; cases: act-order permutations with
padding rows, an input whose rows are longer than K (a column slice), several row counts, and bad indices.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

import pytest
import torch

from qlinear.kernels.triton.gather import BLOCK, gather


def _loop(x: torch.Tensor, index: list[int]) -> torch.Tensor:
    out = torch.zeros(x.shape[0], len(index), dtype=x.dtype)
    for j, src in enumerate(index):
        if src >= 0:
            out[:, j] = x[:, src]
    return out


@pytest.mark.parametrize(("m", "k", "ko", "dtype"), [(1, 96, 128, torch.bfloat16), (3, 200, 256, torch.float16),
                                                     (5, BLOCK + 40, BLOCK + 64, torch.float32)])
def test_gather_matches_a_loop(m: int, k: int, ko: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(k)
    wide = torch.randn(m, k + 24, generator=gen).to(dtype)
    x = wide[:, 7:7 + k]  # rows longer than K: stride(0) = K + 24, unit column stride
    index = torch.cat([torch.randperm(k, generator=gen), torch.full((ko - k,), -1)])
    index = index[torch.randperm(ko, generator=gen)].to(torch.int32)
    got = gather(x, index)
    assert got.shape == (m, ko) and got.dtype == dtype
    assert torch.equal(got, _loop(x, index.tolist()))


def test_gather_refuses_what_it_cannot_read() -> None:
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="int32"):
        gather(x, torch.arange(8))
    with pytest.raises(ValueError, match="unit column stride"):
        gather(x.t(), torch.arange(2, dtype=torch.int32))


COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from qlinear.kernels.triton.gather import BLOCK, gather_kernel
for dt in ("bf16", "fp16", "fp32"):
    sig = {"X": "*" + dt, "IDX": "*i32", "OUT": "*" + dt, "KO": "i32", "stride_x": "i32", "stride_o": "i32",
           "BLOCK": "constexpr"}
    try:
        c = triton.compile(ASTSource(gather_kernel, sig, constexprs={"BLOCK": BLOCK}), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4})
        print(dt, "ok", c.asm["ptx"].count("ld.global"), "local" if ".local" in c.asm["ptx"] else "-", flush=True)
    except Exception as err:
        print(dt, "err", type(err).__name__, str(err).replace("\\n", " ")[-600:], flush=True)
"""


def test_gather_compiles_for_sm90(tmp_path) -> None:
    """The compiled path exists (Triton's bundled LLVM and ptxas, no GPU): a fresh process without the interpreter."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parents[1])
    assert run.returncode == 0, run.stderr[-3000:]
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in run.stdout.splitlines()}
    assert set(lines) == {"bf16", "fp16", "fp32"}, run.stdout + run.stderr[-2000:]
    for dt, result in lines.items():
        if result.startswith("err") and ("ptxas" in result or "cuobjdump" in result):
            pytest.skip(f"sm_90 toolchain unavailable: {result[:300]}")
        assert result.startswith("ok") and result.endswith("-"), f"{dt}: {result}"  # compiled, nothing spilled
