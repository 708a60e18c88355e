"""The native extra's 4-bit look-up-table kernels (``qlinear_native._lut4``, bitsandbytes NF4 / FP4) against a
float64 oracle.

The oracle (written here) unpacks the bytes high nibble first, takes ``table[c] * absmax`` in float64 and the
matmul in float64; the tables are the published NF4 / FP4 values (``tests/oracle/bnb_numpy.py``). The kernels
form each weight as the float32 product ``fl(table[c] * absmax)`` (one rounding, relative 2**-24), multiply it
by x exactly (``lut4_mm``: three bfloat16 terms in TDPBF16PS; ``lut4_mv``: inside a float32 FMA) and sum in
float32 in some order, so the standard bound for a float32 sum of n terms gives the tolerance per output:
``(n + 2) * 2**-24 * sum_k |x w|`` with n = K (``lut4_mv``) or 3K (``lut4_mm``, three addends per product), plus
half a bfloat16 ulp (2**-8 relative) of the result for bfloat16 outputs. Exactness is checked without tolerance:
a single weight times x = 1 gives exactly ``fl32(table[c] * absmax)`` (bfloat16-rounded for bfloat16), and a
table whose entries need all three bfloat16 terms gives an exact 2**-20 cancellation residue.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch

from qlinear.kernels import native_lut4
from tests.oracle import bnb_numpy

_lut4 = pytest.importorskip(
    "qlinear_native._lut4",
    reason="needs the native extra's LUT4 kernels: pip install ./native (from the repository root)")

BF16 = torch.bfloat16
MV = _lut4.available()
AMX = _lut4.amx_available()
TABLES = {"nf4": bnb_numpy.NF4, "fp4": bnb_numpy.fp4_table()}
KERNELS = [pytest.param("lut4_mv", marks=pytest.mark.skipif(not MV, reason="no AVX-512 (F, BW, DQ, VL)")),
           pytest.param("lut4_mm", marks=pytest.mark.skipif(not AMX, reason="no AMX-BF16"))]
pytestmark = pytest.mark.skipif(not MV, reason="this CPU offers no AVX-512 for the native LUT4 kernels")


def unpack(codes: np.ndarray) -> np.ndarray:
    """bytes [N, K/2] -> codes [N, K]: byte j holds column 2j in its high nibble, 2j + 1 in its low one."""
    out = np.empty((codes.shape[0], 2 * codes.shape[1]), dtype=np.int64)
    out[:, 0::2] = codes >> 4
    out[:, 1::2] = codes & 15
    return out


def oracle(x: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, table: np.ndarray,
           block: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 x @ W^T and sum_k |x w| per output."""
    w = table.astype(np.float64)[unpack(codes.numpy())] * np.repeat(absmax.numpy().astype(np.float64), block, 1)
    xd = x.double().numpy()
    return xd @ w.T, np.abs(xd) @ np.abs(w).T


def tolerance(ref: np.ndarray, mag: np.ndarray, terms: int, dtype: torch.dtype) -> np.ndarray:
    tol = (terms + 2) * 2.0**-24 * mag * 1.01 + 1e-30
    return tol + (2.0**-8 * (np.abs(ref) + tol) if dtype == BF16 else 0.0)  # bfloat16: 8 significant bits


def problem(m: int, k: int, n: int, block: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    absmax = (torch.rand(n, k // block, generator=g) * 2 + 0.05).float()
    x = torch.randn(m, k, generator=g).to(dtype)
    return x, codes, absmax


def k_for(block: int) -> int:
    """K not a multiple of 64 where the block allows it (7 blocks of 32), else three blocks."""
    return 7 * block if block == 32 else 3 * block


def check(y: torch.Tensor, x, codes, absmax, table, block, terms: int) -> None:
    ref, mag = oracle(x, codes, absmax, table, block)
    err = np.abs(y.double().numpy() - ref)
    tol = tolerance(ref, mag, terms, x.dtype)
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert (err <= tol).all(), f"max error {err.max():.3g} (worst err/tol {(err / tol).max():.3g})"


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 16, 33, 64])
@pytest.mark.parametrize("block", [32, 64, 128, 256])
@pytest.mark.parametrize("fmt", ["nf4", "fp4"])
def test_linear_matches_float64(fmt: str, block: int, m: int, dtype: torch.dtype) -> None:
    k, n = k_for(block), 37
    x, codes, absmax = problem(m, k, n, block, dtype, seed=m * 1000 + block)
    table = TABLES[fmt]
    y = native_lut4.linear(x, codes, absmax, torch.from_numpy(table), block)
    kernel = native_lut4.kernel_for(m, dtype)
    if kernel is None:
        assert y is None
        return
    check(y, x, codes, absmax, table, block, 3 * k if kernel == "lut4_mm" else k)


def run(kernel: str, x: torch.Tensor, codes, absmax, table: torch.Tensor, block: int, threads: int = 1,
        ldx: int | None = None) -> torch.Tensor:
    m, k = x.shape[0], codes.shape[1] * 2
    n = codes.shape[0]
    out = torch.empty(m, n, dtype=x.dtype)
    getattr(_lut4, kernel)(x.data_ptr(), codes.data_ptr(), absmax.data_ptr(), table.data_ptr(), out.data_ptr(), m,
                           k, n, block, ldx or x.stride(0), n, "bfloat16" if x.dtype == BF16 else "float32", threads)
    return out


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("m,block,n", [(1, 64, 1), (4, 32, 17), (17, 128, 33), (65, 64, 19), (100, 256, 40)])
def test_kernels_at_every_m(kernel: str, m: int, block: int, n: int) -> None:
    """Both kernels are right at any M, including the M the policy sends elsewhere."""
    k = k_for(block)
    for dtype in ([BF16, torch.float32] if kernel == "lut4_mv" else [BF16]):
        x, codes, absmax = problem(m, k, n, block, dtype, seed=m + n)
        y = run(kernel, x, codes, absmax, torch.from_numpy(TABLES["nf4"]), block)
        check(y, x, codes, absmax, TABLES["nf4"], block, 3 * k if kernel == "lut4_mm" else k)


@pytest.mark.parametrize("kernel", KERNELS)
def test_single_weight_is_the_float32_product(kernel: str) -> None:
    """One nonzero weight per channel, x = 1 there: y is exactly fl32(table[c] * absmax) (then bfloat16)."""
    k, block, n = 256, 64, 32
    table = TABLES["nf4"]
    g = torch.Generator().manual_seed(7)
    absmax = torch.rand(n, k // block, generator=g).float() * 3 + 0.01
    codes = torch.full((n, k // 2), 0x77, dtype=torch.uint8)  # code 7 is 0.0 in NF4
    cols = torch.randint(0, k, (n,), generator=g)
    vals = [c for c in range(16) if c != 7]
    expect = np.zeros(n, dtype=np.float32)
    for j in range(n):
        c, col = vals[j % 15], int(cols[j])
        byte = int(codes[j, col // 2])
        codes[j, col // 2] = (byte & 0x0F) | (c << 4) if col % 2 == 0 else (byte & 0xF0) | c
        expect[j] = np.float32(table[c]) * np.float32(absmax[j, col // block].item())
    for dtype in ([BF16, torch.float32] if kernel == "lut4_mv" else [BF16]):
        m = 1 if kernel == "lut4_mv" else 5
        y = run(kernel, torch.ones(m, k, dtype=dtype), codes, absmax, torch.from_numpy(table), block)
        want = torch.from_numpy(expect).to(dtype).expand(m, n)
        assert torch.equal(y, want), (y[0] - want[0]).abs().max()


@pytest.mark.parametrize("kernel", KERNELS)
def test_three_terms_cancel_exactly(kernel: str) -> None:
    """table[0] = 1 + 2**-10 + 2**-20 needs its hi, mid and lo bfloat16 terms; with table[1] = -1, table[2] =
    -2**-10 and x = 1, every float32 partial sum is exact and y = absmax * 2**-20 (a power of two)."""
    k, block, n = 128, 32, 16
    table = torch.zeros(16, dtype=torch.float32)
    table[0], table[1], table[2] = 1 + 2.0**-10 + 2.0**-20, -1.0, -(2.0**-10)
    codes = torch.full((n, k // 2), 0x33, dtype=torch.uint8)
    codes[:, 0] = 0x01  # columns 0, 1: codes 0, 1
    codes[:, 1] = 0x23  # column 2: code 2
    absmax = torch.full((n, k // block), 2.0**-3)
    for dtype in ([BF16, torch.float32] if kernel == "lut4_mv" else [BF16]):
        y = run(kernel, torch.ones(3, k, dtype=dtype), codes, absmax, table, block)
        assert torch.equal(y, torch.full((3, n), 2.0**-23, dtype=dtype)), y[0]


@pytest.mark.parametrize("kernel", KERNELS)
def test_thread_count_and_row_pitch_do_not_change_results(kernel: str) -> None:
    k, block, n, m = 192, 64, 50, 20
    big, codes, absmax = problem(m, k + 32, n, block, BF16, seed=3)
    x = big[:, :k]  # row pitch K + 32
    codes = codes[:, : k // 2].contiguous()
    absmax = absmax[:, : k // block].contiguous()
    table = torch.from_numpy(TABLES["fp4"])
    one = run(kernel, x.contiguous(), codes, absmax, table, block)
    assert torch.equal(run(kernel, x, codes, absmax, table, block, threads=3, ldx=k + 32), one)


def test_policy_and_describe() -> None:
    assert native_lut4.unavailable_reason(256, 64, BF16) == ""
    assert "float16" in native_lut4.unavailable_reason(256, 64, torch.float16)
    assert "multiple of 32" in native_lut4.unavailable_reason(256, 48, BF16)
    assert "multiple of the absmax block" in native_lut4.unavailable_reason(320, 256, BF16)
    assert native_lut4.kernel_for(1, BF16) == "lut4_mv"
    assert native_lut4.kernel_for(native_lut4.max_m(BF16) + 1, BF16) is None
    if AMX:
        assert native_lut4.kernel_for(native_lut4.MV_MAX_M + 1, BF16) == "lut4_mm"
        assert "lut4_mm" in native_lut4.describe(4096, 64, BF16)
    assert "lut4_mv" in native_lut4.describe(4096, 64, BF16, m=1)
    assert "falls back" in native_lut4.describe(4096, 64, BF16, m=native_lut4.max_m(BF16) + 1)
    assert "float16" in native_lut4.describe(4096, 64, torch.float16)


def test_bad_inputs() -> None:
    x, codes, absmax = problem(2, 128, 8, 64, BF16, seed=1)
    table = torch.from_numpy(TABLES["nf4"])
    with pytest.raises(ValueError, match="codes uint8"):
        native_lut4.linear(x, codes.to(torch.int16), absmax, table, 64)
    with pytest.raises(ValueError, match="codes uint8"):
        native_lut4.linear(x, codes[:, :-1], absmax, table, 64)
    with pytest.raises(ValueError, match="absmax float32"):
        native_lut4.linear(x, codes, absmax[:, :1], table, 64)
    with pytest.raises(ValueError, match="absmax float32"):
        native_lut4.linear(x, codes, absmax.double(), table, 64)
    with pytest.raises(ValueError, match="table float32"):
        native_lut4.linear(x, codes, absmax, table[:15], 64)
    with pytest.raises(ValueError, match="x2"):
        native_lut4.linear(x[0], codes, absmax, table, 64)
    assert native_lut4.linear(x.half(), codes, absmax, table, 64) is None  # unsupported dtype: caller falls back
    assert native_lut4.linear(x.float().requires_grad_(), codes, absmax, table, 64) is None  # no backward
    assert native_lut4.linear(x, codes, absmax[:, :1].contiguous(), table, 96) is None  # K not a multiple of block
    assert native_lut4.linear(x[:0], codes, absmax, table, 64).shape == (0, 8)
    with pytest.raises(ValueError, match="block % 32"):
        run("lut4_mv", x, codes, absmax, table, 48)
    with pytest.raises(ValueError, match="dtype"):
        _lut4.lut4_mv(x.data_ptr(), codes.data_ptr(), absmax.data_ptr(), table.data_ptr(), x.data_ptr(), 2, 128, 8,
                      64, 128, 8, "float16", 1)


BNB_SCRIPT = """
import sys, torch, bitsandbytes.functional as F
torch.manual_seed(0)
out = {}
for qt in ("nf4", "fp4"):
    for block in (64, 128):
        w = torch.randn(24, 512) * 0.05
        q, qs = F.quantize_4bit(w, blocksize=block, quant_type=qt, compress_statistics=False,
                                quant_storage=torch.uint8)
        key = f"{qt}/{block}"
        out[key + "/packed"], out[key + "/absmax"], out[key + "/code"] = q, qs.absmax, qs.code
        out[key + "/deq"] = F.dequantize_4bit(q, qs)  # bitsandbytes' own float32 weight
torch.save(out, sys.argv[1])
"""


@pytest.fixture(scope="module")
def bnb_tensors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """bitsandbytes' packed bytes, absmax, table and own float32 dequantization, made in a subprocess (importing
    bitsandbytes imports triton, which must not happen inside the test process)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("needs bitsandbytes: pip install bitsandbytes==0.50.2")
    path = tmp_path_factory.mktemp("bnb") / "bnb.pt"
    subprocess.run([sys.executable, "-c", BNB_SCRIPT, str(path)], check=True, capture_output=True, timeout=300)
    return torch.load(path)


@pytest.mark.external
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_bitsandbytes_own_tensors(bnb_tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """Our kernels read bitsandbytes' packed bytes, absmax and table and match x @ deq^T in float64 (deq:
    bitsandbytes' own float32 dequantization) within the float32 bound."""
    t = bnb_tensors
    for key in ("nf4/64", "nf4/128", "fp4/64", "fp4/128"):
        block = int(key.split("/")[1])
        deq = t[key + "/deq"].double().numpy()
        n, k = deq.shape
        codes, absmax = t[key + "/packed"].view(n, k // 2), t[key + "/absmax"].view(n, k // block)
        for m in (1, native_lut4.MV_MAX_M + 1):
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
            y = native_lut4.linear(x, codes, absmax, t[key + "/code"].float(), block)
            if y is None:
                continue
            ref, mag = x.double().numpy() @ deq.T, np.abs(x.double().numpy()) @ np.abs(deq).T
            terms = 3 * k if native_lut4.kernel_for(m, dtype) == "lut4_mm" else k
            assert (np.abs(y.double().numpy() - ref) <= tolerance(ref, mag, terms, dtype)).all(), (key, m)
