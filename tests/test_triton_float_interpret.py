"""The float-weight Triton kernels (``fp8mm``/``fp8mv``, ``fp8_w8a8``, ``fp4mm``) in Triton's CPU interpreter,
every variant, against float64 numpy oracles written here from the format definitions.

TRITON_INTERPRET=1 is set at collection, before anything imports the kernel bodies (``triton.jit`` decides
interpreted-or-compiled when a body is defined; see test_triton_interpret.py). Tiny shapes: K and N are no
multiples of the tiles, several M tiles and split-K run, so masks, tails and the split-K reduction all run.

Two kinds of check: (1) one-hot activations pick single weights, so every code of a format (subnormals,
the largest magnitude, negative zero) must come out exactly, in every variant; (2) random layers against
``x @ dequant(w)^T`` in float64 (``|y - ref| / |ref|``, Frobenius: float16 4e-3, bfloat16 1.5e-2: the
interpreter rounds float32 -> bfloat16 by truncation).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"
TOL = {torch.float16: 4e-3, torch.bfloat16: 1.5e-2}
DTYPES = (torch.float16, torch.bfloat16)
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """Skip without triton; run the bodies interpreted, bfloat16 dots multiplied as float32."""
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import fp8mm

    with interpreted(fp8mm.fp8_dot_kernel):
        yield


# ---- oracles: value tables from the format definitions -------------------------------------------------

def e4m3fn(code: int) -> float:
    """1-4-3, bias 7, no infinities; S.1111.111 is NaN; exponent 0: subnormal ``m/8 * 2^-6``."""
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    v = m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if code & 0x80 else v


def e5m2(code: int) -> float:
    """1-5-2, bias 15, IEEE: exponent 31 is inf / NaN; exponent 0: subnormal ``m/4 * 2^-14``."""
    e, m = (code >> 2) & 0x1F, code & 0x3
    if e == 0x1F:
        return float("nan") if m else (-np.inf if code & 0x80 else np.inf)
    v = m / 4 * 2.0**-14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15)
    return -v if code & 0x80 else v


E4M3 = np.array([e4m3fn(c) for c in range(256)])
E5M2 = np.array([e5m2(c) for c in range(256)])
TABLE = {torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1(nibbles: np.ndarray) -> np.ndarray:
    return np.where(nibbles & 8, -1.0, 1.0) * E2M1[nibbles & 7]


def e8m0(codes: np.ndarray) -> np.ndarray:
    return 2.0 ** (codes.astype(np.float64) - 127)


def fp8_dequant(w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> np.ndarray:
    n, k = w.shape
    vals = TABLE[w.dtype][w.view(torch.uint8).numpy().astype(np.int64)]
    s = scale.double().numpy()
    rows, cols = np.arange(n) // block[0], np.arange(k) // block[1]
    return vals * s[rows[:, None], cols[None, :]]


def fp4_dequant(packed: torch.Tensor, scales: torch.Tensor, kind: str) -> np.ndarray:
    p = packed.numpy().astype(np.int64)
    codes = np.stack([p & 0xF, p >> 4], axis=-1).reshape(p.shape[0], -1)  # low nibble = even column
    if kind == "nvfp4":
        s, gs = E4M3[scales.view(torch.uint8).numpy().astype(np.int64)], 16
    else:
        s, gs = e8m0(scales.numpy()), 32
    return e2m1(codes) * np.repeat(s, gs, axis=1)


def rel_err(y: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))


# ---- inputs ------------------------------------------------------------------------------------------------

def finite_codes(fmt: torch.dtype) -> np.ndarray:
    table = TABLE[fmt]
    return np.array([c for c in range(256) if np.isfinite(table[c])], dtype=np.uint8)


def fp8_weight(n: int, k: int, fmt: torch.dtype, seed: int) -> torch.Tensor:
    """Random finite codes of ``fmt`` (every class: zeros, subnormals, normals), with the extremes planted."""
    rng = np.random.default_rng(seed)
    codes = rng.choice(finite_codes(fmt), size=(n, k))
    top = 0x7E if fmt == torch.float8_e4m3fn else 0x7B  # 448 / 57344
    codes[0, :4] = [0x01, 0x81, top, top | 0x80]  # smallest subnormals, largest magnitudes
    codes[1, :2] = [0x80, 0x07 if fmt == torch.float8_e4m3fn else 0x03]  # -0, largest subnormal
    return torch.from_numpy(codes).view(fmt)


def fp8_scales(n: int, k: int, block: tuple[int, int], seed: int, magnitude: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = (-(-n // block[0]), -(-k // block[1]))
    return (torch.rand(shape, generator=g) + 0.5) * magnitude


def one_hot(m: int, k: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Row ``i`` picks column ``i % cols``: ``y[i, n] = w[n, i % cols] * scale``, exactly."""
    x = torch.zeros(m, k, dtype=dtype)
    x[torch.arange(m), torch.arange(m) % cols] = 1
    return x


# ---- configs: small tiles so that masks, several tiles and split-K run ---------------------------------------

def fp8_cfg(variant: str, m: int, bits: bool = False, tma: bool = False):
    from qlinear.kernels.triton.fp_common import FConfig

    cfg = {"gemv": FConfig("gemv", 1 if m == 1 else 4, 16, 64, 2, 4, 1),
           "skinny": FConfig("skinny", 16, 32, 32, 2, 4, 1),
           "mma": FConfig("mma", 16, 32, 32, 1, 4, 1, group_m=2),
           "dense": FConfig("dense", 1, 16, 32, 1, 4, 1)}[variant]
    return FConfig(**{**cfg.as_dict(), "fp8_bits": bits, "tma": tma})


FP8_VARIANTS = ("gemv", "skinny", "mma", "dense")
M_OF = {"gemv": (1, 3), "skinny": (3, 17), "mma": (17, 40), "dense": (40, 17)}
# per-tensor, per-channel, group 32, 16x64 blocks (the 128x128 shape, shrunk), odd widths 48 and 40
BLOCKS = ("tensor", "channel", (1, 32), (16, 64), (1, 48), (1, 40))
N, K = 40, 96


def block_of(block: object, n: int, k: int) -> tuple[int, int]:
    return {"tensor": (n, k), "channel": (1, k)}.get(block, block)  # type: ignore[arg-type]


@pytest.mark.parametrize("bits", [False, True], ids=["native", "bits"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("fmt", FP8, ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_fp8_every_code_exact(variant: str, fmt: torch.dtype, dtype: torch.dtype, bits: bool) -> None:
    """Columns 0..3 of the weight hold every finite code; one-hot rows pick them: the outputs are the decoded
    codes times a power-of-two scale, bit for bit (both decodes: the hardware conversion and bit arithmetic)."""
    from qlinear.kernels.triton.fp8mm import fp8_linear

    codes = finite_codes(fmt)
    n, k, m = 64, 48, 17 if variant in ("mma", "dense") else 4
    w = np.zeros((n, k), dtype=np.uint8)
    w[:, :4] = np.resize(codes, (4, n)).T
    w = torch.from_numpy(w).view(fmt)
    scale = torch.full((1, 1), 0.125)
    y = fp8_linear(one_hot(m, k, 4, dtype), w, scale, (n, k), config=fp8_cfg(variant, m, bits))
    expect = TABLE[fmt][w.view(torch.uint8).numpy()[:, np.arange(m) % 4].T.astype(np.int64)] * 0.125
    assert torch.equal(y, torch.from_numpy(expect).to(dtype)), (y.double().numpy() - expect)


@pytest.mark.parametrize("block", BLOCKS, ids=str)
@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_fp8_linear_matches_oracle(variant: str, block: object) -> None:
    """Every variant x scale granularity, in both formats and both activation dtypes (M from the variant's
    range, bias on half the runs); the split-K counters are left at zero."""
    from qlinear.kernels.triton.fp8mm import fp8_linear

    for i, (fmt, dtype) in enumerate((f, d) for f in FP8 for d in DTYPES):
        m = M_OF[variant][i % 2]
        blk = block_of(block, N, K)
        w = fp8_weight(N, K, fmt, seed=i)
        scale = fp8_scales(N, K, blk, i, 2.0**-6 if fmt == torch.float8_e4m3fn else 2.0**-12)
        x = torch.randn(m, K, generator=torch.Generator().manual_seed(m)).to(dtype)
        bias = torch.randn(N, generator=torch.Generator().manual_seed(i)).to(dtype) if i % 2 else None
        lock = torch.zeros(64, dtype=torch.int32)
        y = fp8_linear(x, w, scale, blk, bias, config=fp8_cfg(variant, m), lock=lock)
        ref = x.double().numpy() @ fp8_dequant(w, scale, blk).T + (0 if bias is None else bias.double().numpy())
        assert y.shape == (m, N) and y.dtype == dtype
        assert rel_err(y, ref) < TOL[dtype], (fmt, dtype, m)
        assert int(lock.abs().sum()) == 0


@pytest.mark.parametrize("variant", ["skinny", "mma"])
def test_fp8_tma_descriptors_match_oracle(variant: str) -> None:
    """x and w tiles through TMA tensor descriptors (out-of-range rows and the K tail read 0)."""
    from qlinear.kernels.triton.fp8mm import fp8_linear

    w = fp8_weight(N, K, torch.float8_e4m3fn, 7)
    scale = fp8_scales(N, K, (16, 32), 7, 2.0**-6)
    x = torch.randn(17, K, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    y = fp8_linear(x, w, scale, (16, 32), config=fp8_cfg(variant, 17, tma=True))
    assert rel_err(y, x.double().numpy() @ fp8_dequant(w, scale, (16, 32)).T) < TOL[torch.bfloat16]


def test_fp8_default_choice_runs_each_m() -> None:
    """No config: the variant and tiles come from ``choose_variant`` / ``fp8_config`` (the H200 heuristics)."""
    from qlinear.kernels.triton.fp8mm import choose_variant, fp8_config, fp8_linear

    assert [choose_variant(m, 4096, 4096) for m in (1, 2, 5, 32, 33, 512, 513)] == [
        "gemv", "skinny", "skinny", "skinny", "mma", "mma", "dense"]
    for m, v in ((1, "gemv"), (2, "gemv"), (4, "gemv"), (16, "skinny"), (64, "mma"), (300, "mma")):
        cfg = fp8_config(v, m, 14336, 4096)
        assert cfg.variant == v and cfg.block_k % 16 == 0 and cfg.split_k >= 1
    w = fp8_weight(N, K, torch.float8_e4m3fn, 1)
    scale = fp8_scales(N, K, (1, K), 1, 2.0**-6)
    for m in (1, 3):
        x = torch.randn(m, K, dtype=torch.float16)
        assert rel_err(fp8_linear(x, w, scale, (1, K)), x.double().numpy() @ fp8_dequant(w, scale, (1, K)).T) < 4e-3


# ---- W8A8 ----------------------------------------------------------------------------------------------------

def e4m3_rne(v: np.ndarray) -> np.ndarray:
    """Round float values (already within +-448) to the nearest e4m3 code, ties to the even code."""
    codes = np.arange(0x7F)  # non-negative finite codes, increasing values
    vals = E4M3[codes]
    a = np.abs(v)
    i = np.clip(np.searchsorted(vals, a), 1, len(vals) - 1)
    lo, hi = vals[i - 1], vals[i]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (codes[i] % 2 == 0))
    out = np.where(pick_hi, codes[i], codes[i - 1]).astype(np.uint8)
    return np.where(np.signbit(v), out | 0x80, out).astype(np.uint8)


def test_quantize_per_token_matches_rne_oracle() -> None:
    """Scales ``max|x| / 448`` (floored at 1/(448*512): an all-zero row), codes ``rne(clamp(x / s))`` bit for bit,
    in the one-pass (row in registers) and the two-pass (K > 8192) kernels."""
    from qlinear.kernels.triton import fp8_w8a8

    g = torch.Generator().manual_seed(0)
    for k in (200, 8200):
        x = torch.randn(5, k, generator=g) * torch.tensor([1.0, 1e-3, 0.0, 300.0, 1.0])[:, None]
        x[0, :6] = torch.tensor([-0.0, 1e-9, 2.0**-16, -2.0**-16, 1e4, 7.3e-3])
        x[2] = 0.0
        x = x.to(torch.bfloat16)
        xq, sx = fp8_w8a8.quantize_fp8_per_token(x)
        xf = x.float().numpy()
        s = np.maximum(np.abs(xf).max(axis=1) / np.float32(448), np.float32(1 / (448 * 512))).astype(np.float32)
        assert np.array_equal(sx.numpy(), s)
        q = np.clip(xf / s[:, None], -448, 448)
        assert np.array_equal(xq.view(torch.uint8).numpy(), e4m3_rne(q.astype(np.float64)))
        assert not xq.view(torch.uint8)[2].any()  # the zero row quantizes to +0


W8A8_BLOCKS = ("tensor", "channel", (16, 32), (1, 64))


@pytest.mark.parametrize("block", W8A8_BLOCKS, ids=str)
@pytest.mark.parametrize("variant", ["skinny", "mma"])
def test_w8a8_matches_oracle(variant: str, block: object) -> None:
    """``(xq w) * sx * w_scale`` against the float64 product of the returned ``xq, sx`` (checked above) and the
    decoded weights, per block column (128x128 blocks' step-wise scaling, shrunk), bias on half the runs."""
    from qlinear.kernels.triton.fp8_w8a8 import fp8_w8a8_linear, quantize_fp8_per_token
    from qlinear.kernels.triton.fp_common import FConfig

    for i, dtype in enumerate(DTYPES):
        m = (1, 3, 17, 40)[i + (2 if variant == "mma" else 0)]
        blk = block_of(block, N, K)
        w = fp8_weight(N, K, torch.float8_e4m3fn, 10 + i)
        ws = fp8_scales(N, K, blk, i, 2.0**-6)
        x = torch.randn(m, K, generator=torch.Generator().manual_seed(i)).to(dtype)
        bias = torch.randn(N).to(dtype) if i else None
        cfg = FConfig(variant, 16, 32, 64, 2 if variant == "skinny" else 1, 4, 1, group_m=2)
        y = fp8_w8a8_linear(x, w, ws, blk, bias, config=cfg)
        xq, sx = quantize_fp8_per_token(x)
        xd = E4M3[xq.view(torch.uint8).numpy().astype(np.int64)] * sx.double().numpy()[:, None]
        ref = xd @ fp8_dequant(w, ws, blk).T + (0 if bias is None else bias.double().numpy())
        assert y.dtype == dtype and rel_err(y, ref) < TOL[dtype], (dtype, m)


def test_w8a8_tma_and_default_configs() -> None:
    from qlinear.kernels.triton.fp8_w8a8 import (
        choose_w8a8_variant,
        fp8_w8a8_linear,
        quantize_fp8_per_token,
        w8a8_config,
    )
    from qlinear.kernels.triton.fp_common import FConfig

    assert [choose_w8a8_variant(m, 4096, 4096) for m in (1, 64, 65, 4096)] == ["skinny", "skinny", "mma", "mma"]
    for m in (1, 16, 33, 64, 128, 256, 1024, 4096):
        cfg = w8a8_config(choose_w8a8_variant(m, 14336, 4096), m, 14336, 4096)
        assert cfg.block_k % 32 == 0 and cfg.block_n % 64 == 0
    w = fp8_weight(N, K, torch.float8_e4m3fn, 3)
    ws = fp8_scales(N, K, (1, K), 3, 2.0**-6)
    x = torch.randn(9, K).to(torch.float16)
    xq, sx = quantize_fp8_per_token(x)
    ref = (E4M3[xq.view(torch.uint8).numpy().astype(np.int64)] * sx.double().numpy()[:, None]) @ fp8_dequant(
        w, ws, (1, K)).T
    for cfg in (FConfig("mma", 16, 32, 32, 1, 4, 1, tma=True), None):
        assert rel_err(fp8_w8a8_linear(x, w, ws, (1, K), config=cfg), ref) < TOL[torch.float16]


# ---- FP4 -----------------------------------------------------------------------------------------------------

def fp4_scales(kind: str, n: int, k: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    if kind == "nvfp4":  # every positive finite e4m3 code, subnormals included
        codes = rng.integers(0x01, 0x7F, size=(n, k // 16)).astype(np.uint8)
        return torch.from_numpy(codes).view(torch.float8_e4m3fn)
    lo, hi = (112, 138) if dtype == torch.float16 else (90, 160)  # within the activation dtype's range
    return torch.from_numpy(rng.integers(lo, hi, size=(n, k // 32)).astype(np.uint8))


FP4_CFG = {"gemv": (16, 64, 2), "skinny": (32, 64, 2), "mma": (32, 64, 1), "dense": (16, 64, 1)}


def fp4_cfg(variant: str, m: int):
    from qlinear.kernels.triton.fp_common import FConfig

    bn, bk, split = FP4_CFG[variant]
    bm = (1 if m == 1 else 4) if variant == "gemv" else 16
    return FConfig(variant, bm, bn, bk, split, 4, 1, group_m=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_fp4_every_code_exact(variant: str, kind: str, dtype: torch.dtype) -> None:
    """Bytes 0..3 of each row hold every byte value across the rows (all 16 x 16 nibble pairs, negative zero
    0x8 included); one-hot rows pick columns 0..7: outputs are ``e2m1 * scale * global_mul`` bit for bit."""
    from qlinear.kernels.triton.fp4mm import fp4_linear

    n, k, m = 64, 96, 17 if variant in ("mma", "dense") else 8
    packed = np.zeros((n, k // 2), dtype=np.uint8)
    packed[:, :4] = np.arange(256, dtype=np.uint8).reshape(n, 4)
    packed = torch.from_numpy(packed)
    scales = fp4_scales(kind, n, k, 5, dtype)
    y = fp4_linear(one_hot(m, k, 8, dtype), packed, scales, kind, 0.5, config=fp4_cfg(variant, m))
    expect = (fp4_dequant(packed, scales, kind)[:, np.arange(m) % 8] * 0.5).T
    assert torch.equal(y, torch.from_numpy(expect).to(dtype)), (y.double().numpy() - expect)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("variant", FP8_VARIANTS)
def test_fp4_linear_matches_oracle(variant: str, kind: str, dtype: torch.dtype) -> None:
    from qlinear.kernels.triton.fp4mm import fp4_linear

    n, k = 40, 160  # 160: no multiple of the 64-weight steps; 40: no multiple of the N tiles
    for j, m in enumerate(M_OF[variant]):
        g = torch.Generator().manual_seed(m)
        packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
        scales = fp4_scales(kind, n, k, m, dtype)
        gmul = 1 / 448 if kind == "nvfp4" else 1.0
        x = torch.randn(m, k, generator=g).to(dtype)
        bias = torch.randn(n, generator=g).to(dtype) if j else None
        lock = torch.zeros(64, dtype=torch.int32)
        y = fp4_linear(x, packed, scales, kind, gmul, bias, config=fp4_cfg(variant, m), lock=lock)
        ref = x.double().numpy() @ fp4_dequant(packed, scales, kind).T * gmul
        ref = ref + (0 if bias is None else bias.double().numpy())
        assert y.shape == (m, n) and y.dtype == dtype
        assert rel_err(y, ref) < TOL[dtype], m
        assert int(lock.abs().sum()) == 0


def test_fp4_default_choice_runs() -> None:
    from qlinear.kernels.triton.fp4mm import choose_fp4_variant, fp4_config, fp4_linear, mxfp4_scale_errors

    assert [choose_fp4_variant(m, 4096, 4096) for m in (1, 4, 16, 256, 4096)] == [
        "gemv", "skinny", "skinny", "mma", "dense"]
    assert all(fp4_config(v, m, 14336, 4096).block_k % 32 == 0 for v, m in
               (("gemv", 1), ("gemv", 4), ("skinny", 16), ("mma", 64), ("mma", 512)))
    packed = torch.randint(0, 256, (40, 48), dtype=torch.uint8)
    scales = fp4_scales("mxfp4", 40, 96, 1, torch.bfloat16)
    x = torch.randn(2, 96, dtype=torch.bfloat16)
    ref = x.double().numpy() @ fp4_dequant(packed, scales, "mxfp4").T
    assert rel_err(fp4_linear(x, packed, scales, "mxfp4", 1.0), ref) < TOL[torch.bfloat16]
    assert mxfp4_scale_errors(scales) == []
    bad = scales.clone()
    bad[3, 1] = 255
    assert mxfp4_scale_errors(bad) == ["mxfp4 scales: 1 of 120 are 255 (E8M0 NaN)"]


# ---- bad input ------------------------------------------------------------------------------------------------

def test_bad_inputs_name_the_tensor() -> None:
    from qlinear.kernels.triton.fp4mm import fp4_linear
    from qlinear.kernels.triton.fp8_w8a8 import fp8_w8a8_linear, fp8_w8a8_mm, quantize_fp8_per_token
    from qlinear.kernels.triton.fp8mm import fp8_linear

    x = torch.randn(3, 96, dtype=torch.float16)
    w = fp8_weight(40, 96, torch.float8_e4m3fn, 0)
    s = torch.ones(1, 1)
    cases = [
        (lambda: fp8_linear(x.float(), w, s, (40, 96)), "x: expected dtype float16 or bfloat16, found float32"),
        (lambda: fp8_linear(x[:, ::2], w[:, :48], s, (40, 48)), "x: expected a contiguous tensor"),
        (lambda: fp8_linear(x[0], w, s, (40, 96)), "x: expected a 2-D"),
        (lambda: fp8_linear(x, w.view(torch.uint8), s, (40, 96)), "w: expected dtype float8_e4m3fn or float8_e5m2"),
        (lambda: fp8_linear(x, w[:, :64].contiguous(), s, (40, 64)), r"w: expected shape \[N, 96\]"),
        (lambda: fp8_linear(x, w, torch.ones(2, 1), (40, 96)), r"scale: expected shape \[1, 1\], found \[2, 1\]"),
        (lambda: fp8_linear(x, w, s.double(), (40, 96)), "scale: expected dtype float32, found float64"),
        (lambda: fp8_linear(x, w, s, (0, 96)), r"block: expected \(bn, bk\)"),
        (lambda: fp8_linear(x, w, s, (40, 96), torch.ones(41)), r"bias: expected shape \[40\], found \[41\]"),
        (lambda: fp8_linear(x, w, s, (40, 96), variant="fast"), "variant: expected one of gemv, skinny, mma, dense"),
        (lambda: fp8_w8a8_linear(x, w.view(torch.float8_e5m2), s, (40, 96)), "w: expected dtype float8_e4m3fn"),
        (lambda: fp8_w8a8_mm(x, torch.ones(3), w, s, (40, 96)), "xq: expected dtype float8_e4m3fn, found float16"),
        (lambda: fp8_w8a8_mm(w, torch.ones(7), w, s, (40, 96)), r"sx: expected shape \[40\], found \[7\]"),
        (lambda: fp8_w8a8_linear(x, w, torch.ones(40, 3), (1, 40)), "block: expected bk >= K or a multiple of 32"),
        (lambda: fp8_w8a8_linear(x, w, torch.ones(40, 2), (1, 40)), r"w_scale: expected shape \[40, 3\]"),
        (lambda: quantize_fp8_per_token(torch.ones(3, 4, dtype=torch.int32)), "x: expected dtype float16"),
    ]
    packed = torch.zeros(40, 48, dtype=torch.uint8)
    sc = torch.ones(40, 6).to(torch.float8_e4m3fn)
    cases += [
        (lambda: fp4_linear(x, packed, sc, "fp4", 1.0), "kind: expected 'nvfp4' or 'mxfp4', found 'fp4'"),
        (lambda: fp4_linear(x, packed, sc, "nvfp4", torch.ones(1)), "global_mul: expected a python float"),
        (lambda: fp4_linear(x, packed.int(), sc, "nvfp4", 1.0), "packed: expected dtype uint8, found int32"),
        (lambda: fp4_linear(x, packed[:, :40].contiguous(), sc, "nvfp4", 1.0), r"packed: expected shape \[N, 48\]"),
        (lambda: fp4_linear(x, packed, sc.view(torch.uint8), "nvfp4", 1.0), "scales: expected dtype float8_e4m3fn"),
        (lambda: fp4_linear(x, packed, sc[:, :3], "nvfp4", 1.0), r"scales: expected shape \[40, 6\]"),
        (lambda: fp4_linear(x, packed, torch.ones(40, 3, dtype=torch.uint8), "mxfp4", 1.0, torch.ones(40, 1)),
         r"bias: expected shape \[40\]"),
        (lambda: fp4_linear(x[:, :40].contiguous(), packed[:, :20], sc[:, :3], "nvfp4", 1.0),
         "x: expected K a multiple of 16"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


@pytest.mark.parametrize("dtype", DTYPES)
def test_w4afp8_matches_oracle(dtype: torch.dtype) -> None:
    """GPTQ 4-bit sym g128 words times per-token E4M3 activations: against the float64 product of the returned
    ``xq, sx`` (the quantizer is checked bit for bit above) and the GPTQ oracle's dequantized weight."""
    from qlinear import quantize_rtn
    from qlinear.kernels.triton.fp8_w8a8 import quantize_fp8_per_token
    from qlinear.kernels.triton.w4afp8 import w4afp8_linear
    from qlinear.layouts import gptq
    from tests.oracle.gptq_numpy import dequantize_checkpoint

    k, n = 256, 72
    q = quantize_rtn(torch.randn(n, k, generator=torch.Generator().manual_seed(5)) * 0.02, bits=4, group_size=128)
    t = gptq.to_checkpoint(q, "gptq_v2")
    w64 = dequantize_checkpoint({kk: v.numpy() for kk, v in t.items()}, 4, k, n, "gptq_v2")
    bias = torch.randn(n).to(dtype)
    for m in (1, 17, 40):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        y = w4afp8_linear(x, t["qweight"], t["scales"], bias, block_n=32)
        xq, sx = quantize_fp8_per_token(x)
        xd = E4M3[xq.view(torch.uint8).numpy().astype(np.int64)] * sx.double().numpy()[:, None]
        ref = xd @ w64.T + bias.double().numpy()
        assert y.dtype == dtype and rel_err(y, ref) < TOL[dtype], (dtype, m)
    with pytest.raises(ValueError, match=r"w4afp8_linear: x: expected K a multiple of 128, found K = 96"):
        w4afp8_linear(torch.zeros(2, 96, dtype=dtype), t["qweight"][:12], t["scales"][:1])
