"""The 4-bit look-up-table kernels (``kernels/triton/lut4.py``: bitsandbytes NF4 / FP4) in Triton's CPU interpreter,
every variant, against float64 numpy oracles written here from the format's definition.

TRITON_INTERPRET=1 is set at collection, before anything imports the kernel bodies. Oracles: the NF4 table as
published with QLoRA (bitsandbytes' ``get_4bit_type('nf4')``), the FP4 table from bitsandbytes' definition (E2M1
magnitudes 0, 0.0625, 8, 12, 4, 6, 2, 3 over 12, bit 3 the sign), the byte order from bitsandbytes (column ``2j``
in the high nibble). Checks: (1) one-hot rows pick single weights, so every code comes out exactly (the kernels
document the table as float16 values: ``np.float16(table)`` here), (2) random layers against ``x @ W^T`` in float64
with the float32 table, (3) the ``prmt`` decode's PTX text run by a small emulator of the PTX ISA's ``prmt``,
``lop3``, shift and ``cvt`` semantics (the interpreter cannot run inline PTX), (4) bad shapes and inputs refused
with messages naming what was expected, (5) bitsandbytes' own quantizer and dequantizer (external).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

from tests.triton_interp import interpreted

INSTALL = "pip install --no-deps -r requirements/nodeps-triton.txt"
TOL = {torch.float16: 4e-3, torch.bfloat16: 1.5e-2}  # the interpreter truncates float32 -> bfloat16
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
FP4_MAG = (0.0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0)
FP4 = tuple(v / 12 for v in FP4_MAG) + tuple(-v / 12 for v in FP4_MAG)
TABLES = {"nf4": NF4, "fp4": FP4}


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """Skip without triton; run the bodies interpreted, bfloat16 dots multiplied as float32."""
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import lut4

    with interpreted(lut4.lut4_dot_kernel):
        yield


# ---- oracle and inputs ------------------------------------------------------------------------------------------

def unpack(codes: torch.Tensor) -> np.ndarray:
    """``[N, K/2]`` bytes -> ``[N, K]`` codes: column ``2j`` is the high nibble of byte ``j``."""
    b = codes.numpy().astype(np.int64)
    return np.stack([b >> 4, b & 15], axis=-1).reshape(b.shape[0], -1)


def dequant(codes: torch.Tensor, absmax: torch.Tensor, table: tuple[float, ...], block: int) -> np.ndarray:
    return np.asarray(table)[unpack(codes)] * np.repeat(absmax.double().numpy(), block, axis=1)


def layer(n: int, k: int, block: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    return codes, torch.rand(n, k // block, generator=g) * 0.1 + 0.01


def rel_err(y: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))


def cfg(variant: str, m: int):
    """Small tiles: several N tiles, masked N and K tails, and split-K where K allows."""
    from qlinear.kernels.triton.fp_common import FConfig

    return {"gemv": FConfig("gemv", 1 if m == 1 else 4, 16, 64, 2, 4, 1),
            "skinny": FConfig("skinny", 16, 32, 32, 2, 4, 1),
            "mma": FConfig("mma", 16, 32, 32, 1, 4, 1, group_m=2),
            "dense": FConfig("dense", 1, 16, 64, 1, 4, 1)}[variant]


VARIANTS = ("gemv", "skinny", "mma", "dense")
DTYPES = (torch.float16, torch.bfloat16)


# ---- exact decode -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["nf4", "fp4"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_code_exact(variant: str, name: str) -> None:
    """Columns 0..15 hold all 256 code pairs; one-hot rows pick each weight: ``float16(table[c]) * absmax``
    (absmax a power of two) comes out bit for bit, which also pins the nibble order."""
    from qlinear.kernels.triton import lut4

    n, k, block = 256, 128, 64
    codes = torch.zeros(n, k // 2, dtype=torch.uint8)
    codes[:, :8] = torch.arange(256, dtype=torch.uint8)[:, None]  # byte j = (c(2j) << 4) | c(2j + 1)
    absmax = torch.full((n, k // block), 0.5)
    absmax[:, 1] = 4.0
    m = 16
    x = torch.zeros(m, k, dtype=torch.float16)
    x[torch.arange(m), torch.arange(m)] = 1
    rt = lut4.prepare_lut4(codes, absmax, block)
    y = lut4.lut4_linear(x, rt, torch.tensor(TABLES[name]), config=cfg(variant, m))
    t16 = np.asarray(TABLES[name], dtype=np.float16).astype(np.float64)
    expect = (t16[unpack(codes)[:, :m]] * 0.5).T
    assert torch.equal(y, torch.from_numpy(expect).to(torch.float16)), np.abs(y.double().numpy() - expect).max()


def test_gemv_rows_and_blocks_exact() -> None:
    """The GEMV over 1, 2 and 4 rows a program: one-hot rows in several scale blocks (absmax differs per block)."""
    from qlinear.kernels.triton import lut4
    from qlinear.kernels.triton.fp_common import FConfig

    n, k, block = 40, 256, 64
    codes, _ = layer(n, k, block, 3)
    absmax = torch.tensor([0.25, 1.0, 2.0, 0.5]).repeat(n, 1)
    rt = lut4.prepare_lut4(codes, absmax, block)
    cols = np.array([5, 70, 130, 255])
    for rows, m in ((1, 1), (2, 3), (4, 4), (4, 7)):
        x = torch.zeros(m, k, dtype=torch.float16)
        x[torch.arange(m), torch.from_numpy(cols[np.arange(m) % 4])] = 1
        y = lut4.lut4_linear(x, rt, torch.tensor(NF4), config=FConfig("gemv", rows, 16, 64, 3, 4, 1))
        t16 = np.asarray(NF4, dtype=np.float16).astype(np.float64)
        c = cols[np.arange(m) % 4]
        expect = (t16[unpack(codes)[:, c]] * absmax.double().numpy()[:, c // block]).T
        assert torch.equal(y, torch.from_numpy(expect).to(torch.float16)), (rows, m)
        assert int(rt.lock.abs().sum()) == 0


# ---- random layers against float64 ------------------------------------------------------------------------------

CASES = [(1, 128, 32, 64), (3, 256, 96, 128), (17, 256, 96, 64), (3, 128, 32, 128), (17, 128, 32, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_layers_match_float64(variant: str, dtype: torch.dtype) -> None:
    """M 1 / 3 / 17, K 128 / 256, N 32 / 96, blocks 64 / 128, NF4 and FP4, bias on half the runs, the default
    config and the small one above: ``x @ (table[c] * absmax)^T (+ bias)`` within the dtype's tolerance."""
    from qlinear.kernels.triton import lut4

    for i, (m, k, n, block) in enumerate(CASES):
        name = ("nf4", "fp4")[i % 2]
        codes, absmax = layer(n, k, block, i)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(10 + i)).to(dtype)
        bias = torch.randn(n, generator=torch.Generator().manual_seed(i)).to(dtype) if i % 2 else None
        rt = lut4.prepare_lut4(codes, absmax, block)
        ref = x.double().numpy() @ dequant(codes, absmax, TABLES[name], block).T
        ref = ref + (0 if bias is None else bias.double().numpy())
        for config in (None, cfg(variant, m)):
            y = lut4.lut4_linear(x, rt, torch.tensor(TABLES[name]), bias, variant=variant, config=config)
            assert y.shape == (m, n) and y.dtype == dtype
            assert rel_err(y, ref) < TOL[dtype], (variant, m, k, n, block, name, config)
        assert int(rt.lock.abs().sum()) == 0


def test_auto_variants_and_large_table() -> None:
    """AUTO picks a variant by M; a table beyond float16's range is scaled by a power of two and back (exact)."""
    from qlinear.kernels.triton import lut4

    codes, absmax = layer(48, 128, 32, 5)
    big = tuple(v * 3.0e5 for v in NF4)
    rt = lut4.prepare_lut4(codes, absmax, 32)
    for m in (1, 3, 40, 200):
        assert lut4.choose_lut4_variant(m, 48, 128) in lut4.VARIANTS
        x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m)).to(torch.float16)
        y = lut4.lut4_linear(x.float().to(torch.bfloat16), rt, torch.tensor(big))
        ref = x.double().numpy() @ dequant(codes, absmax, big, 32).T
        assert rel_err(y, ref) < TOL[torch.bfloat16], m


def test_table_changed_in_place_is_seen() -> None:
    """The prepared table forms are keyed by the table's version: an in-place edit changes the output."""
    from qlinear.kernels.triton import lut4

    codes, absmax = layer(32, 128, 64, 6)
    rt = lut4.prepare_lut4(codes, absmax, 64)
    table = torch.tensor(NF4)
    x = torch.randn(1, 128, generator=torch.Generator().manual_seed(0)).to(torch.float16)
    y1 = lut4.lut4_linear(x, rt, table)
    table.mul_(2.0)
    y2 = lut4.lut4_linear(x, rt, table)
    assert torch.allclose(y2.double(), 2 * y1.double(), rtol=2e-3, atol=1e-3)


# ---- the prmt decode, emulated --------------------------------------------------------------------------------

def run_ptx(text: str, regs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The PTX subset of the decode, per the PTX ISA: ``prmt.b32`` default mode (selector nibble: bits 0-2 pick
    a byte of ``b:a``, bit 3 replicates that byte's sign), ``lop3.b32`` (bit ``(a << 2) | (b << 1) | c`` of the
    LUT), ``and``/``shl``/``shr.u32``, ``mov.b32 {lo, hi}`` unpacking, ``cvt.f32.f16``. Values are uint64."""
    regs = dict(regs)

    def val(tok: str) -> np.ndarray:
        return regs[tok] if tok in regs else np.uint64(int(tok, 0))

    for line in text.splitlines():
        line = line.strip().rstrip(";")
        if line in ("{", "}") or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32":
            lo, hi, src = re.fullmatch(r"\{(\w+), (\w+)\}, (\S+)", rest).groups()
            regs[lo], regs[hi] = val(src) & 0xFFFF, (val(src) >> 16) & 0xFFFF
            continue
        dst, *args = (a.strip() for a in rest.split(","))
        a = [val(t) for t in args]
        if op == "and.b32":
            out = a[0] & a[1]
        elif op == "shl.b32":
            out = (a[0] << a[1]) & 0xFFFFFFFF
        elif op == "shr.u32":
            out = a[0] >> a[1]
        elif op == "prmt.b32":
            both, out = (a[1] << 32) | a[0], np.zeros_like(a[0])
            for i in range(4):
                sel = (a[2] >> np.uint64(4 * i)) & 0xF
                byte = (both >> ((sel & 7) * 8)) & 0xFF
                byte = np.where(sel & 8, np.where(byte & 0x80, 0xFF, 0), byte).astype(np.uint64)
                out = out | (byte << np.uint64(8 * i))
        elif op == "lop3.b32":
            out = np.zeros_like(a[0])
            for bit in range(32):
                idx = (((a[0] >> bit) & 1) << 2) | (((a[1] >> bit) & 1) << 1) | ((a[2] >> bit) & 1)
                out = out | (((a[3] >> idx) & 1) << np.uint64(bit))
        elif op == "cvt.f32.f16":
            out = a[0].astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32).astype(np.uint64)
        else:
            raise AssertionError(f"unexpected PTX op {op}")
        regs[dst] = out
    return regs


@pytest.mark.parametrize("name", ["nf4", "fp4"])
def test_prmt_decode_emulated(name: str) -> None:
    """The decode's PTX on every byte value in every byte position: the 8 outputs are ``float16(table[c])`` of
    columns ``8w .. 8w+7`` in order, the same values the gather decode loads."""
    from qlinear.kernels.triton import lut4

    rt = lut4.prepare_lut4(torch.zeros(1, 16, dtype=torch.uint8), torch.ones(1, 1), 32)
    _, tb, p2 = lut4._table_forms(rt, torch.tensor(TABLES[name]))
    assert p2 == 1.0
    rng = np.random.default_rng(0)
    raw = np.concatenate([np.repeat(np.arange(256, dtype=np.uint8)[:, None], 4, 1),
                          rng.integers(0, 256, (512, 4), dtype=np.uint8)])
    regs = {"$8": raw.copy().view(np.uint32)[:, 0].astype(np.uint64)}
    regs.update({f"${9 + i}": np.full(len(raw), int(tb[i]) & 0xFFFFFFFF, dtype=np.uint64) for i in range(8)})
    out = run_ptx(lut4.prmt_asm(), regs)
    got = np.stack([out[f"${i}"].astype(np.uint32).view(np.float32) for i in range(8)], axis=1)
    codes = np.stack([raw >> 4, raw & 15], axis=-1).reshape(len(raw), 8)
    want = np.asarray(TABLES[name], dtype=np.float16).astype(np.float32)[codes]
    assert np.array_equal(got, want)


# ---- refusals ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("k", "n", "block", "needle"), [
    (128, 32, 48, "power of two >= 32"), (128, 32, 16, "power of two >= 32"), (96, 32, 64, "multiple of block 64"),
    (0, 32, 64, "multiple of block"), (128, 0, 64, "N = 0"), (128, 32, True, "power of two")])
def test_unsupported_shapes(k: int, n: int, block: int, needle: str) -> None:
    from qlinear.kernels.triton import lut4

    assert needle in lut4.unsupported(k, n, block)
    if n and k:
        with pytest.raises(ValueError, match=re.escape(needle)):
            lut4.prepare_lut4(torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(n, 1), block)
    assert lut4.unsupported(256, 33, 128) == ""


def test_bad_inputs_named() -> None:
    from qlinear.kernels.triton import lut4

    codes, absmax = layer(32, 128, 64, 0)
    with pytest.raises(ValueError, match="codes: expected dtype uint8, found int8"):
        lut4.prepare_lut4(codes.view(torch.int8), absmax, 64)
    with pytest.raises(ValueError, match=r"absmax: expected shape \[32, 2\], found \[32, 4\]"):
        lut4.prepare_lut4(codes, torch.ones(32, 4), 64)
    rt = lut4.prepare_lut4(codes, absmax, 64)
    x = torch.zeros(2, 128, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"x: expected shape \[M, 128\]"):
        lut4.lut4_linear(torch.zeros(2, 64, dtype=torch.float16), rt, torch.tensor(NF4))
    with pytest.raises(ValueError, match=r"table: expected shape \[16\], found \[8\]"):
        lut4.lut4_linear(x, rt, torch.zeros(8))
    with pytest.raises(ValueError, match="table: expected 16 finite values"):
        lut4.lut4_linear(x, rt, torch.full((16,), float("nan")))
    with pytest.raises(ValueError, match="decode: expected 'gather' off CUDA"):
        lut4.lut4_linear(x, rt, torch.tensor(NF4), decode="prmt")
    with pytest.raises(ValueError, match="variant: expected one of gemv, skinny, mma, dense"):
        lut4.lut4_linear(x, rt, torch.tensor(NF4), variant="tc")
    with pytest.raises(ValueError, match=r"bias: expected shape \[32\]"):
        lut4.lut4_linear(x, rt, torch.tensor(NF4), torch.zeros(31, dtype=torch.float16))


# ---- bitsandbytes' own quantizer ----------------------------------------------------------------------------------

@pytest.mark.external
@pytest.mark.parametrize(("quant_type", "block"), [("nf4", 64), ("fp4", 128)])
def test_bitsandbytes_layer(quant_type: str, block: int) -> None:
    """bnb's ``quantize_4bit`` bytes, absmax and ``quant_state.code`` straight into ``prepare_lut4``; the output
    against ``x @ dequantize_4bit(...)^T`` (bnb's own decode, in float32)."""
    bf = pytest.importorskip("bitsandbytes.functional", reason="bitsandbytes missing: pip install bitsandbytes")
    from qlinear.kernels.triton import lut4

    n, k = 96, 256
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1))
    q, st = bf.quantize_4bit(w, blocksize=block, quant_type=quant_type, compress_statistics=False)
    assert torch.allclose(st.code, torch.tensor(TABLES[quant_type]), atol=1e-7)  # our oracle's table is bnb's
    rt = lut4.prepare_lut4(q.view(n, k // 2), st.absmax.view(n, k // block), block)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    ref = x.double().numpy() @ bf.dequantize_4bit(q, st).double().numpy().T
    for variant in VARIANTS:
        y = lut4.lut4_linear(x, rt, st.code, variant=variant)
        assert rel_err(y, ref) < TOL[torch.float16], variant


# ---- the kernel class on a transformers + bitsandbytes checkpoint ------------------------------------------------

@pytest.mark.parametrize("fixture", ["bnb_nf4_dq", "bnb_fp4", "bnb_nf4_dq_b128"])
def test_triton_class_matches_the_exact_kernel_on_producer_files(fixture: str) -> None:
    """``BitsAndBytesTritonLinear`` loads each module's checkpoint tensors as they are and gives what the exact
    ``BitsAndBytesTorchLinear`` gives (float16 activations; the interpreter stands in for the GPU)."""
    from qlinear.checkpoint import load_checkpoint
    from qlinear.kernels.triton_bnb import BitsAndBytesTritonLinear

    path = Path(__file__).parent / "fixtures" / fixture
    exact = load_checkpoint(path, backend="bitsandbytes_torch", dtype=torch.float16)
    checked = 0
    for name, ref_layer in exact.items():
        if ref_layer.scheme.in_features % ref_layer.scheme.blocksize:
            continue
        layer = BitsAndBytesTritonLinear(ref_layer.scheme, bias=ref_layer.bias is not None, dtype=torch.float16)
        layer.load_state_dict(ref_layer.state_dict())
        x = torch.randn(3, ref_layer.in_features, generator=torch.Generator().manual_seed(5)).to(torch.float16)
        y, ref = layer(x), ref_layer(x)
        assert rel_err(y, ref.double().numpy()) < TOL[torch.float16], name
        checked += 1
    assert checked >= 4
