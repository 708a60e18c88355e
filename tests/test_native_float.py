"""The native extra's FP8 / FP4 weight kernels (``qlinear_native._float``) against a float64 oracle.

The oracle decodes the bytes in numpy float64 from the format definitions written out below (e4m3fn: 1-4-3 bias
7, 0x7F/0xFF NaN; e5m2: 1-5-2 bias 15 with inf/NaN; E2M1; E8M0 2**(e - 127), 255 NaN), independent of the C
tables; it is itself checked against torch's float8 dtypes for all 256 codes. Products are exact in the
kernels and summed in float32: the tolerance is 1e-5 of sum |x w| per output (plus half a bfloat16 ulp for
bfloat16 outputs). The exactness claims are checked without tolerance: one nonzero weight per channel (every
one of the 256 / 16 codes, subnormals, max, -0, NaN, inf) gives exactly x * value * scale, and a weight of
subnormal codes only is not flushed. ``fp8_mv`` / ``fp4_mv`` need AVX-512 with VBMI, ``fp8_mm`` / ``fp4_mm``
AMX-BF16; each is skipped where this CPU cannot run it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

_float = pytest.importorskip(
    "qlinear_native._float",
    reason="needs the native extra's float kernels: pip install ./native (from the repository root)")

BF16 = torch.bfloat16
MV = _float.available()
AMX = _float.amx_available()
FP8_KERNELS = [pytest.param("fp8_mv", marks=pytest.mark.skipif(not MV, reason="no AVX-512 VBMI")),
               pytest.param("fp8_mm", marks=pytest.mark.skipif(not AMX, reason="no AMX-BF16"))]
FP4_KERNELS = [pytest.param("fp4_mv", marks=pytest.mark.skipif(not MV, reason="no AVX-512 VBMI")),
               pytest.param("fp4_mm", marks=pytest.mark.skipif(not AMX, reason="no AMX-BF16"))]


# ---- oracle: the formats' definitions in float64 ----

def e4m3fn(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
    v = np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e - 7))
    return np.where((b & 0x7F) == 0x7F, np.nan, sign * v)


def e5m2(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 2) & 31, (b & 3).astype(np.float64)
    v = np.where(e == 0, m / 4 * 2.0**-14, (1 + m / 4) * 2.0 ** (e - 15))
    v = np.where(e == 31, np.where(m == 0, np.inf, np.nan), v)
    return sign * v


def e2m1(q: np.ndarray) -> np.ndarray:
    mag = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])[q & 7]
    return np.where(q & 8, -mag, mag)


def e8m0(b: np.ndarray) -> np.ndarray:
    b = b.astype(np.int64)
    return np.where(b == 255, np.nan, 2.0 ** (b - 127).astype(np.float64))


FP8 = {"e4m3fn": e4m3fn, "e5m2": e5m2}
FP4 = {"nvfp4": (16, e4m3fn), "mxfp4": (32, e8m0)}


def f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def fp8_weight(w8: np.ndarray, scale: np.ndarray, bk: int, fmt: str) -> np.ndarray:
    k = w8.shape[1]
    return FP8[fmt](w8) * np.repeat(scale.astype(np.float64), bk, 1)[:, :k]


def fp4_weight(codes: np.ndarray, sb: np.ndarray, fmt: str) -> np.ndarray:
    bs, dec = FP4[fmt]
    return e2m1(codes) * np.repeat(dec(sb), bs, 1)


def pack(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes [N, K] -> bytes [N, K/2], even column in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


# ---- calling the kernels ----

def run(kernel: str, x: torch.Tensor, w: np.ndarray, scale: np.ndarray, n: int, arg: float, fmt: str,
        out_dtype: torch.dtype = torch.float32, threads: int = 1, ldo: int | None = None) -> torch.Tensor:
    """``out[M, N]`` of one kernel; x may be a strided view (row pitch x.stride(0))."""
    m, k = x.shape
    ldo = ldo or n
    out = torch.full((m, ldo), float("nan"), dtype=out_dtype)
    wt, st = torch.from_numpy(np.ascontiguousarray(w)), torch.from_numpy(np.ascontiguousarray(scale))
    name = "float32" if out_dtype == torch.float32 else "bfloat16"
    getattr(_float, kernel)(x.data_ptr(), wt.data_ptr(), st.data_ptr(), out.data_ptr(), m, k, n, arg, x.stride(0), ldo,
                            fmt, name, threads)
    return out[:, :n]


def check(out: torch.Tensor, x: torch.Tensor, weight: np.ndarray, g: float = 1.0) -> None:
    xd = f64(x)
    ref = g * (xd @ weight.T)
    bound = 1e-5 * (np.abs(xd) @ np.abs(weight).T) * abs(g) + 1e-30
    if out.dtype == BF16:
        bound = bound + np.abs(ref) * 2.0**-8
    err = np.abs(f64(out) - ref)
    assert np.isfinite(ref).all()
    assert (err <= bound).all(), f"max err {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"


def activations(m: int, k: int, seed: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(BF16)


def random_fp8(rng: np.random.Generator, n: int, k: int, fmt: str) -> np.ndarray:
    w8 = rng.integers(0, 256, (n, k), dtype=np.uint8)
    bad = (w8 & 0x7F) == 0x7F if fmt == "e4m3fn" else ((w8 >> 2) & 31) == 31  # NaN / inf: tested apart
    w8[bad] ^= 0x40
    return w8


# ---- the oracle itself ----

def test_oracle_matches_torch_float8() -> None:
    codes = np.arange(256, dtype=np.uint8)
    for fmt, dtype in (("e4m3fn", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        ref = torch.from_numpy(codes).view(dtype).double().numpy()
        np.testing.assert_array_equal(FP8[fmt](codes), ref)
    assert e4m3fn(np.array([0x7E, 0x01, 0x08]))[0] == 448 and e4m3fn(np.array([0x01]))[0] == 2.0**-9
    assert e5m2(np.array([0x7B]))[0] == 57344 and e5m2(np.array([0x01]))[0] == 2.0**-16


# ---- FP8 ----

@pytest.mark.parametrize("kernel", FP8_KERNELS)
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("k,bk", [(256, 128), (320, 128), (192, 32), (256, 64), (288, 96), (224, 224), (4096, 4096),
                                  (160, 4096), (96, 32)])
def test_fp8_random(kernel: str, fmt: str, k: int, bk: int) -> None:
    rng = np.random.default_rng(k + bk)
    for m, n in ((1, 37), (2, 20), (3, 33), (17, 19)):
        w8 = random_fp8(rng, n, k, fmt)
        scale = rng.uniform(0.25, 4.0, (n, -(-k // bk))).astype(np.float32)
        x = activations(m, k, m + n)
        for dtype in (torch.float32, BF16):
            check(run(kernel, x, w8, scale, n, bk, fmt, dtype), x, fp8_weight(w8, scale, bk, fmt))


@pytest.mark.parametrize("kernel", FP8_KERNELS)
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_fp8_every_code_exact(kernel: str, fmt: str) -> None:
    """Channel c holds code c at column 3 c % K (zeros elsewhere): out = x[col] * value(c) * scale exactly,
    for all 256 codes: subnormals, max, -0, NaN and inf included."""
    n, k = 256, 320
    w8 = np.zeros((n, k), dtype=np.uint8)
    cols = (3 * np.arange(n)) % k
    w8[np.arange(n), cols] = np.arange(n)
    scale = np.full((n, 1), 0.5, dtype=np.float32)
    for m in (1, 3, 17):
        x = activations(m, k, m)
        x[:, cols] = torch.where(x[:, cols] == 0, torch.ones((), dtype=BF16), x[:, cols])
        ref = f64(x)[:, cols] * FP8[fmt](np.arange(n)) * 0.5
        out = f64(run(kernel, x, w8, scale, n, k, fmt))
        np.testing.assert_array_equal(out, ref)  # NaN where NaN, +-inf where inf, the rest bit-exact


@pytest.mark.parametrize("kernel", FP8_KERNELS)
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_fp8_subnormal_codes_not_flushed(kernel: str, fmt: str) -> None:
    """A weight of subnormal codes only (exponent field 0; a bit-shift decode would make them bfloat16
    denormals, which VDPBF16PS and AMX read as zero)."""
    rng = np.random.default_rng(7)
    n, k = 33, 512
    mant = 7 if fmt == "e4m3fn" else 3
    w8 = (rng.integers(1, mant + 1, (n, k)) | (rng.integers(0, 2, (n, k)) << 7)).astype(np.uint8)
    scale = np.ones((n, 1), dtype=np.float32)
    x = activations(2, k, 1)
    weight = fp8_weight(w8, scale, k, fmt)
    out = run(kernel, x, w8, scale, n, k, fmt)
    assert (np.abs(f64(out)) > 0).mean() > 0.9
    check(out, x, weight)


@pytest.mark.parametrize("kernel", FP8_KERNELS)
def test_fp8_strides_threads_and_bf16_rounding(kernel: str) -> None:
    rng = np.random.default_rng(3)
    m, k, n = 5, 256, 70
    w8 = random_fp8(rng, n, k, "e4m3fn")
    scale = rng.uniform(0.5, 2.0, (n, 2)).astype(np.float32)
    x = activations(m, k + 40, 2)[:, 8:8 + k]  # row pitch K + 40
    ref = run(kernel, x.contiguous(), w8, scale, n, 128, "e4m3fn")
    strided = run(kernel, x, w8, scale, n, 128, "e4m3fn", ldo=n + 5)
    two = run(kernel, x, w8, scale, n, 128, "e4m3fn", threads=2)
    bf = run(kernel, x, w8, scale, n, 128, "e4m3fn", BF16)
    assert torch.equal(strided, ref) and torch.equal(two, ref)
    assert torch.equal(bf, ref.to(BF16))  # one rounding, to nearest even
    check(ref, x, fp8_weight(w8, scale, 128, "e4m3fn"))


@pytest.mark.skipif(not (MV and AMX), reason="needs both kernels")
def test_fp8_large_m_and_kernels_agree() -> None:
    rng = np.random.default_rng(5)
    m, k, n = 70, 384, 48
    w8 = random_fp8(rng, n, k, "e5m2")
    scale = rng.uniform(0.5, 2.0, (n, 3)).astype(np.float32)
    x = activations(m, k, 9)
    weight = fp8_weight(w8, scale, 128, "e5m2")
    for kernel in ("fp8_mv", "fp8_mm"):
        check(run(kernel, x, w8, scale, n, 128, "e5m2"), x, weight)


# ---- FP4 ----

def random_fp4(rng: np.random.Generator, n: int, k: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    bs = FP4[fmt][0]
    if fmt == "nvfp4":  # finite e4m3 scales of both signs, subnormal ones included
        sign = (rng.integers(0, 2, (n, k // bs)) << 7).astype(np.uint8)
        sb = rng.integers(0, 0x7F, (n, k // bs), dtype=np.uint8) | sign
    else:
        sb = rng.integers(110, 140, (n, k // bs), dtype=np.uint8)
    return codes, sb


@pytest.mark.parametrize("kernel", FP4_KERNELS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("k", [32, 64, 96, 128, 224, 4096])
def test_fp4_random(kernel: str, fmt: str, k: int) -> None:
    rng = np.random.default_rng(k)
    for m, n in ((1, 37), (2, 20), (3, 33), (17, 19)):
        codes, sb = random_fp4(rng, n, k, fmt)
        x = activations(m, k, m + n)
        for dtype in (torch.float32, BF16):
            out = run(kernel, x, pack(codes), sb, n, 0.375, fmt, dtype)
            check(out, x, fp4_weight(codes, sb, fmt), 0.375)


@pytest.mark.parametrize("kernel", FP4_KERNELS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_every_code_and_scale_exact(kernel: str, fmt: str) -> None:
    """Channel s has every scale block at scale byte s (all 256, NaN ones included) and one nonzero code per
    block, cycling through the 16 codes: out = g * sum of the blocks' x * e2m1 * scale, each term exact, with
    x powers of two so that the float32 sum is exact too."""
    bs, dec = FP4[fmt]
    n, blocks = 256, 16
    k = bs * blocks
    codes = np.zeros((n, k), dtype=np.uint8)
    for b in range(blocks):
        codes[:, b * bs + (5 * b) % bs] = (np.arange(n) + b) % 16
    sb = np.repeat(np.arange(n, dtype=np.uint8)[:, None], blocks, 1)
    x = torch.from_numpy(2.0 ** np.random.default_rng(1).integers(-3, 4, (3, k))).to(BF16)
    out = f64(run(kernel, x, pack(codes), sb, n, 1.0, fmt))
    ref = f64(x) @ fp4_weight(codes, sb, fmt).T
    nan = np.isnan(dec(np.arange(n)))
    assert np.isnan(out[:, nan]).all()
    ok = ~nan
    if fmt == "mxfp4":  # 2**-127 .. 2**127 times up to 6 * 8 * 16: compare where float32 holds the result
        ok &= (np.arange(n) >= 8) & (np.arange(n) <= 240)
    np.testing.assert_array_equal(out[:, ok], ref[:, ok])


@pytest.mark.parametrize("kernel", FP4_KERNELS)
def test_mxfp4_extreme_scales(kernel: str) -> None:
    """E8M0 bytes 0, 1, 253, 254 (outside the range where the AMX kernel folds them into bfloat16 exactly:
    it computes those channel groups with the exact AVX-512 kernel) and 255 (NaN) in some channels."""
    rng = np.random.default_rng(11)
    n, k, m = 48, 128, 3
    codes, sb = random_fp4(rng, n, k, "mxfp4")
    sb[5, 1], sb[20, 0], sb[21, 3], sb[40, 2] = 0, 1, 253, 255
    sb[20, 1:], sb[21, :3] = 1, 253  # channels 20, 21: all blocks extreme (others too would overflow float32)
    sb[22] = 254
    codes[22] = 1  # 0.5 * 2**127 per column: float32 overflows only past 2**128
    pick = np.random.default_rng(4).integers(0, 4, (m, k))
    x = torch.from_numpy(np.array([1.0, -1.0, 1.5, -1.5])[pick] * 2.0**-8).to(BF16)  # channel 22 <= 1.5 * 2**125
    weight = fp4_weight(codes, sb, "mxfp4")
    out = f64(run(kernel, x, pack(codes), sb, n, 1.0, "mxfp4"))
    assert np.isnan(out[:, 40]).all()
    keep = np.arange(n) != 40
    xd = f64(x)
    ref = xd @ weight[keep].T
    bound = 1e-5 * (np.abs(xd) @ np.abs(weight[keep]).T) + 2.0**-140  # float32 subnormal sums
    assert (np.abs(out[:, keep] - ref) <= bound).all()
    assert (out[:, 20] != 0).all() and np.isfinite(out[:, 22]).all()


@pytest.mark.parametrize("kernel", FP4_KERNELS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_strides_threads_and_bf16_rounding(kernel: str, fmt: str) -> None:
    rng = np.random.default_rng(13)
    m, k, n = 6, 256, 70
    codes, sb = random_fp4(rng, n, k, fmt)
    x = activations(m, k + 40, 2)[:, 8:8 + k]
    packed = pack(codes)
    ref = run(kernel, x.contiguous(), packed, sb, n, 0.5, fmt)
    assert torch.equal(run(kernel, x, packed, sb, n, 0.5, fmt, ldo=n + 3), ref)
    assert torch.equal(run(kernel, x, packed, sb, n, 0.5, fmt, threads=2), ref)
    assert torch.equal(run(kernel, x, packed, sb, n, 0.5, fmt, BF16), ref.to(BF16))
    check(ref, x, fp4_weight(codes, sb, fmt), 0.5)


@pytest.mark.skipif(not (MV and AMX), reason="needs both kernels")
def test_fp4_large_m_and_kernels_agree() -> None:
    rng = np.random.default_rng(17)
    m, k, n = 70, 256, 40
    for fmt in ("nvfp4", "mxfp4"):
        codes, sb = random_fp4(rng, n, k, fmt)
        x = activations(m, k, 3)
        for kernel in ("fp4_mv", "fp4_mm"):
            check(run(kernel, x, pack(codes), sb, n, 2.0, fmt), x, fp4_weight(codes, sb, fmt), 2.0)


# ---- argument checks ----

@pytest.mark.skipif(not MV, reason="no AVX-512 VBMI")
def test_bad_arguments() -> None:
    x = torch.zeros(2, 256, dtype=BF16)
    w = torch.zeros(8, 256, dtype=torch.uint8)
    s = torch.ones(8, 2)
    out = torch.zeros(2, 8)
    p = (x.data_ptr(), w.data_ptr(), s.data_ptr(), out.data_ptr())

    def fp8(*rest: object) -> None:
        _float.fp8_mv(*p, *rest)

    with pytest.raises(ValueError, match="K % 32 == 0"):
        fp8(2, 250, 8, 128, 256, 8, "e4m3fn", "float32", 1)
    with pytest.raises(ValueError, match="bk % 32 == 0"):
        fp8(2, 256, 8, 48, 256, 8, "e4m3fn", "float32", 1)
    with pytest.raises(ValueError, match="ldx >= K"):
        fp8(2, 256, 8, 128, 128, 8, "e4m3fn", "float32", 1)
    with pytest.raises(ValueError, match="M > 0"):
        fp8(0, 256, 8, 128, 256, 8, "e4m3fn", "float32", 1)
    with pytest.raises(ValueError, match="'e4m3fn' or 'e5m2', got 'e4m3'"):
        fp8(2, 256, 8, 128, 256, 8, "e4m3", "float32", 1)
    with pytest.raises(ValueError, match="out_dtype 'float32' or 'bfloat16', got 'float16'"):
        fp8(2, 256, 8, 128, 256, 8, "e4m3fn", "float16", 1)
    with pytest.raises(ValueError, match="threads >= 1, got 0"):
        fp8(2, 256, 8, 128, 256, 8, "e4m3fn", "float32", 0)
    with pytest.raises(ValueError, match="non-null"):
        _float.fp8_mv(0, *p[1:], 2, 256, 8, 128, 256, 8, "e4m3fn", "float32", 1)
    with pytest.raises(ValueError, match="'nvfp4' or 'mxfp4', got 'e4m3fn'"):
        _float.fp4_mv(*p, 2, 256, 8, 1.0, 256, 8, "e4m3fn", "float32", 1)
    with pytest.raises(ValueError, match="K % 32 == 0"):
        _float.fp4_mv(*p, 2, 48, 8, 1.0, 256, 8, "nvfp4", "float32", 1)
    with pytest.raises(TypeError):
        _float.fp4_mv(*p, 2, 256, 8, 1.0, 256, 8, "nvfp4", "float32")
