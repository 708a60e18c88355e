"""The GGUF Triton kernels (dequant, gemv, skinny, gemm, dense) in Triton's CPU interpreter vs float64 oracles.

TRITON_INTERPRET=1 is set at collection, before anything imports the kernel bodies. The oracle decodes the
bytes with gguf-py (``gguf.quants.dequantize``), or for the 1-bit types with a few lines of numpy here; it
shares no code with src. Dequant must be bit-identical in float32; matmuls within the activation dtype's
rounding (``|y - ref| / |ref|``: float16 1e-3, bfloat16 1.5e-2 (the interpreter truncates to bfloat16),
float32 1e-5).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import functools

import numpy as np
import pytest
import torch

from qlinear.caps import Problem
from qlinear.kernels.gguf_triton import RUNNABLE, GGUFTritonKernel
from qlinear.layouts import gguf as G
from qlinear.target import Target
from tests.triton_interp import interpreted

INSTALL = "pip install -r requirements/triton-interpret.txt"
TOL = {torch.float16: 1e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-5}
TYPES = sorted(RUNNABLE)


@pytest.fixture(scope="module", autouse=True)
def interpreter():
    """Skip without triton; float32 dots for bfloat16 (the interpreter's numpy matmul would multiply
    bfloat16 bit patterns as integers)."""
    pytest.importorskip("triton", reason=f"triton is not installed: {INSTALL}")
    from qlinear.kernels.triton import gguf_mm

    with interpreted(gguf_mm.gemv_kernel):
        yield


def oracle(raw: np.ndarray, qtype: G.GGMLType, k: int) -> np.ndarray:
    """float32 weights ``[N, k]`` decoded without qlinear: gguf-py, or numpy for the 1-bit types."""
    if qtype in (G.GGMLType.Q1_0, G.GGMLType.Q1_0_G128):
        nb_bytes = 6 if qtype == G.GGMLType.Q1_0 else 18
        blocks = raw.reshape(-1, nb_bytes)
        d = blocks[:, :2].copy().view("<f2").astype(np.float32)
        bits = np.unpackbits(blocks[:, 2:], axis=1, bitorder="little").astype(np.float32)
        return (d * (bits * 2 - 1)).reshape(raw.shape[0], -1)[:, :k]
    gguf = pytest.importorskip("gguf", reason="gguf-py is the oracle: pip install -r requirements/nodeps-gguf.txt")
    with np.errstate(all="ignore"):
        return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype.value))[:, :k]


@functools.cache
def layer(qtype: G.GGMLType, n: int, k: int) -> tuple[GGUFTritonKernel, np.ndarray, np.ndarray]:
    """A layer with ggml-encoded random weights and a bias, its float64 oracle weight and bias (on its blocks:
    ``affine_runtime=False``, so Q4_K runs the block kernels at every K)."""
    rng = np.random.default_rng(qtype.value * 31 + n)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    lay = GGUFTritonKernel(G.scheme_for(qtype, k, n), bias=True, dtype=torch.float16, affine_runtime=False)
    lay.load_blocks(G.quantize(w, qtype), torch.from_numpy(rng.standard_normal(n).astype(np.float32)))
    lay.prepare()
    raw = lay.qweight.numpy()
    return lay, oracle(raw, qtype, k).astype(np.float64), lay.bias.double().numpy()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # random f16 scales include inf and NaN
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequant_is_bit_exact_on_random_bytes(qtype: G.GGMLType) -> None:
    from qlinear.kernels.triton import gguf_mm

    info = G.TYPES[qtype]
    k = 3 * info.block_size + 7  # a partial last block
    raw = np.random.default_rng(qtype.value).integers(0, 256, (5, info.row_bytes(k)), dtype=np.uint8)
    got = gguf_mm.dequantize(torch.from_numpy(raw), int(qtype), k, block_n=4).numpy()
    want = oracle(raw, qtype, k)
    assert got.shape == want.shape
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)) or \
        np.array_equal(got, want, equal_nan=True)  # NaN payloads may differ, nothing else


def forced(variant: str) -> tuple[object, int]:
    """Small tiles, split-K and several tiles, so masks, partial blocks and the reduction all run."""
    from qlinear.kernels.triton.gguf_configs import GConfig

    return {
        "gemv": (GConfig("gemv", 1, 16, 0, 3, 4, 1), 2),
        "gemv-vector": (GConfig("gemv", 1, 16, 0, 2, 4, 1, jt=0), 1),  # one 16-byte vector a thread
        "gemv-inthread": (GConfig("gemv", 1, 32, 0, 1, 4, 1, jt=1), 2),  # halfwords in-thread
        "skinny": (GConfig("skinny", 16, 16, 0, 2, 4, 1), 5),
        "gemm": (GConfig("gemm", 32, 32, 0, 1, 4, 1), 33),
        "dense": (GConfig("dense", 1, 16, 0, 1, 4, 1), 3),
    }[variant]


# K is a multiple of 32 but not of every step (partial steps and, for K-quants, a partial block)
CASES = [(t, v, dt) for t in TYPES for v, dt in (("gemv", torch.float16), ("skinny", torch.bfloat16),
                                                 ("gemm", torch.float16), ("dense", torch.bfloat16))]
CASES += [(G.GGMLType.Q4_K, "gemv", torch.float32), (G.GGMLType.Q4_0, "skinny", torch.float32),
          (G.GGMLType.Q6_K, "gemv", torch.bfloat16), (G.GGMLType.Q4_0, "gemv-vector", torch.float16),
          (G.GGMLType.Q6_K, "gemv-vector", torch.float16), (G.GGMLType.Q8_0, "gemv-vector", torch.bfloat16),
          (G.GGMLType.Q4_K, "gemv-inthread", torch.float16), (G.GGMLType.Q5_K, "gemv-inthread", torch.float16)]


@pytest.mark.parametrize(("qtype", "variant", "dtype"), CASES,
                         ids=lambda c: getattr(c, "name", None) or str(c).removeprefix("torch."))
def test_variant_matches_oracle(qtype: G.GGMLType, variant: str, dtype: torch.dtype) -> None:
    k = 640 if G.TYPES[qtype].block_size <= 128 else 600
    lay, w64, b64 = layer(qtype, 37, k)
    cfg, m = forced(variant)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
    y = lay.matmul(x, config=cfg)
    ref = x.double().numpy() @ w64.T + b64
    assert y.shape == (m, 37) and y.dtype == dtype
    err = float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))
    assert err < TOL[dtype], f"{qtype.name} {variant} {dtype}: relative error {err:.2e}"


def test_forward_picks_variants_and_keeps_shape() -> None:
    lay, w64, b64 = layer(G.GGMLType.Q4_K, 37, 600)
    for m in (1, 3, 40):
        x = torch.randn(2, m, 600, generator=torch.Generator().manual_seed(m)).half()
        y = lay(x)
        ref = x.double().numpy() @ w64.T + b64
        assert y.shape == (2, m, 37)
        assert np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref) < TOL[torch.float16]
    assert lay.config(1, torch.device("cpu")).variant == "gemv"  # type: ignore[attr-defined]
    assert lay.config(300, torch.device("cpu")).variant == "dense"  # type: ignore[attr-defined]
    assert np.array_equal(lay.dequantize().numpy(), w64.astype(np.float32))


@pytest.mark.parametrize("qtype", [G.GGMLType.Q4_K, G.GGMLType.Q6_K, G.GGMLType.Q4_0, G.GGMLType.Q5_1])
def test_dense_decoders_agree_bit_for_bit(monkeypatch, qtype: G.GGMLType) -> None:
    """The dense variant's transient rows: the Triton dequant kernel straight into bfloat16 equals the oracle's
    float32 weight (which ``dequantize`` matches bit for bit) rounded to bfloat16, as the torch decoders' cast does;
    rows 5..30 of 37."""
    from qlinear.kernels import gguf_triton

    lay, w64, _ = layer(qtype, 37, 512)
    want = torch.from_numpy(w64[5:30].astype(np.float32)).bfloat16()
    for decoder in ("triton", "torch"):
        monkeypatch.setattr(gguf_triton, "DENSE_DECODER", decoder)
        got = lay.dense_rows(5, 30, torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), decoder


def test_selection_reasons() -> None:
    cuda = Target.fake_cuda((9, 0), modules={"triton": True})
    for qt in ("Q4_K", "Q4_0", "Q6_K", "Q5_1", "Q1_0_G128", "Q8_0"):  # Q8_0: widened beyond the reference's 1/4/5/6
        p = Problem(G.scheme_for(qt, 4096, 4096), torch.float16)
        assert GGUFTritonKernel.reasons(p, cuda) == [], qt
    runs = {(qt, k, dt): GGUFTritonKernel.describe_runs(Problem(G.scheme_for(qt, k, 4096), dt), cuda)
            for qt, k, dt in (("Q4_K", 4096, torch.bfloat16), ("Q4_K", 4000, torch.bfloat16),
                              ("Q4_K", 4096, torch.float32), ("Q8_0", 4096, torch.float16),
                              ("Q6_K", 4096, torch.float16))}
    assert [" re-laid at load" in v for v in runs.values()] == [True, False, False, True, False]
    q2 = GGUFTritonKernel.reasons(Problem(G.scheme_for("Q2_K", 4096, 4096), torch.float16), cuda)
    assert any("qtype Q2_K not run by this kernel" in r for r in q2)
    cpu = GGUFTritonKernel.reasons(Problem(G.scheme_for("Q4_K", 4096, 4096)), Target.fake_cpu())
    assert any("device cpu" in r for r in cpu)


def test_input_errors() -> None:
    lay = layer(G.GGMLType.Q4_0, 37, 640)[0]
    with pytest.raises(ValueError, match="expected last dimension 640"):
        lay(torch.zeros(1, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="dtype torch.int32 not supported"):
        lay(torch.zeros(1, 640, dtype=torch.int32))


AFFINE_TYPES = (G.GGMLType.Q4_0, G.GGMLType.Q4_1, G.GGMLType.Q4_K)


@functools.cache
def affine_layer(qtype: G.GGMLType, n: int, k: int) -> tuple[GGUFTritonKernel, np.ndarray, np.ndarray]:
    """As ``layer`` but with ``affine_runtime``: the blocks also run on the GPTQ kernels (float offsets)."""
    base, w64, b64 = layer(qtype, n, k)
    lay = GGUFTritonKernel(G.scheme_for(qtype, k, n), bias=True, dtype=torch.float16, affine_runtime=True)
    lay.load_blocks(base.qweight, base.bias)
    lay.prepare()
    return lay, w64, b64


@pytest.mark.parametrize("qtype", AFFINE_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize(("variant", "m", "dtype"), [("gemv", 3, torch.float16), ("gemv4", 5, torch.bfloat16),
                                                     ("skinny2", 7, torch.bfloat16), ("gemm2", 37, torch.float16),
                                                     ("dense", 9, torch.bfloat16), ("gemv_tc", 9, torch.float16),
                                                     ("gemv_tc1", 1, torch.bfloat16), ("gemv_tcv", 11, torch.bfloat16)])
def test_affine_runtime_variants_match_oracle(qtype: G.GGMLType, variant: str, m: int, dtype: torch.dtype) -> None:
    """K = 600: a partial 32-group (and for Q4_K a partial super-block) at the end; N = 37: odd columns."""
    from qlinear.kernels.triton.configs import Config

    lay, w64, b64 = affine_layer(qtype, 37, 600)
    assert lay.affine_packed() is not None and lay.affine_packed().offsets is not None
    cfg = {"gemv": Config("gemv", 1, 32, 32, 3, 4, 1), "gemv4": Config("gemv", 4, 32, 32, 3, 4, 1),  # 4 rows a program
           "skinny2": Config("skinny2", 16, 32, 32, 2, 4, 1),
           "gemm2": Config("gemm2", 32, 32, 32, 3, 4, 1), "dense": Config("dense", 1, 32, 32, 1, 4, 1),
           "gemv_tc": Config("gemv_tc", 16, 32, 32, 3, 2, 1, prefetch=True),  # 2 row sets, 2 warps along K
           "gemv_tc1": Config("gemv_tc", 8, 64, 32, 2, 2, 1),
           "gemv_tcv": Config("gemv_tc", 16, 64, 128, 2, 2, 1, vector_params=True)}[variant]  # per-lane vectors
    x = torch.randn(m, 600, generator=torch.Generator().manual_seed(m)).to(dtype)
    y = lay.matmul(x, config=cfg)
    ref = x.double().numpy() @ w64.T + b64
    assert y.shape == (m, 37) and y.dtype == dtype
    err = float(np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref))
    assert err < TOL[dtype], f"{qtype.name} {variant} {dtype}: relative error {err:.2e}"
    assert int(lay._rt_lock.abs().sum()) == 0


def test_affine_runtime_forward_picks_gptq_variants_and_keeps_float32_on_blocks() -> None:
    lay, w64, b64 = affine_layer(G.GGMLType.Q4_K, 37, 600)
    for m in (1, 5, 40):
        x = torch.randn(m, 600, generator=torch.Generator().manual_seed(m)).half()
        ref = x.double().numpy() @ w64.T + b64
        assert np.linalg.norm(lay(x).double().numpy() - ref) / np.linalg.norm(ref) < TOL[torch.float16]
    x = torch.randn(2, 600, generator=torch.Generator().manual_seed(9))
    ref = x.double().numpy() @ w64.T + b64
    assert np.linalg.norm(lay(x).double().numpy() - ref) / np.linalg.norm(ref) < TOL[torch.float32]
    from qlinear.kernels.triton.qmm import qmm

    with pytest.raises(ValueError, match="variant skinny does not take additive offsets"):
        from qlinear.kernels.triton.configs import Config

        qmm(x.half(), lay.affine_packed(), Config("skinny", 16, 32, 64, 1, 4, 1))
    assert affine_layer(G.GGMLType.Q4_K, 37, 600)[0].state_dict().keys() == {"qweight", "bias"}  # blocks only


def test_q4_k_runtime_keeps_its_sub_scales_as_bytes() -> None:
    """Q4_K's runtime: uint8 sub-scales and mins per 32 and a float32 (d, -dmin) per 256 (K = 600: 19 groups,
    3 super-groups), so its parameters take ~2 bytes per 32 weights instead of the float32 pair's 8."""
    lay, _, _ = affine_layer(G.GGMLType.Q4_K, 37, 600)
    p = lay.affine_packed()
    assert p.scales.dtype == torch.uint8 and p.offsets.dtype == torch.uint8 and p.scales.shape[0] == 19
    assert p.supers is not None and p.supers.dtype == torch.float32 and tuple(p.supers.shape) == (6, p.np)
    assert int(p.scales.max()) < 64 and int(p.offsets.max()) < 64  # 6-bit fields
    q41 = affine_layer(G.GGMLType.Q4_1, 37, 600)[0].affine_packed()
    assert q41.supers is None and q41.scales.dtype == torch.float32


def test_build_kquant_names_what_it_expected() -> None:
    from qlinear.kernels.triton.layout import build_kquant

    codes = torch.zeros(4, 512, dtype=torch.uint8)
    sc = torch.zeros(4, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"sc, mins: expected uint8 \[4, 16\]"):
        build_kquant(codes, sc, sc.float(), torch.ones(4, 2), torch.ones(4, 2))
    with pytest.raises(ValueError, match=r"d, dmin: expected \[4, 2\] \(one per 8 groups of 32\)"):
        build_kquant(codes, sc, sc, torch.ones(4, 3), torch.ones(4, 2))


def test_affine_runtime_is_only_for_affine_4bit_types() -> None:
    lay, _, _ = layer(G.GGMLType.Q6_K, 37, 600)
    six = GGUFTritonKernel(G.scheme_for(G.GGMLType.Q6_K, 600, 37), bias=True, affine_runtime=True)
    six.load_blocks(lay.qweight, lay.bias)
    six.prepare()
    assert six.affine_packed() is None  # 16-value sub-blocks: the block kernels run it


def test_affine_runtime_reaches_layers_loaded_from_files(tmp_path, monkeypatch) -> None:
    """``load_checkpoint(..., affine_runtime=True)`` builds the affine runtime where the Triton kernel is chosen
    (selection forced here: the interpreter runs on a CPU target), leaves other kernels as they are, and is
    refused for checkpoints that are not GGUF."""
    import importlib

    import gguf

    from qlinear.checkpoint.load import load_checkpoint
    from qlinear.checkpoint.safetensors_io import CheckpointError

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((24, 256)) * 0.05).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("blk.0.attn_v.weight", G.quantize(w, "Q4_K"), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    on_cpu = load_checkpoint(tmp_path / "m.gguf", dtype=torch.float16, affine_runtime=True)["blk.0.attn_v"]
    assert type(on_cpu).__name__ == "GGUFTorchLinear"  # the CPU kernels have no such runtime
    sel = importlib.import_module("qlinear.select")  # the package exports a function of the same name
    monkeypatch.setattr(sel, "select", lambda *a, **k: type("C", (), {"kernel": GGUFTritonKernel})())
    raw = np.asarray(gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors[0].data)
    for flag in (False, None, True):  # None (the default) and True: Q4_K's runtime in place of its blocks
        lay = load_checkpoint(tmp_path / "m.gguf", dtype=torch.float16, affine_runtime=flag)["blk.0.attn_v"]
        assert isinstance(lay, GGUFTritonKernel) and (lay.affine_packed() is not None) is (flag is not False)
        assert lay.codes_replaced is (flag is not False) and np.array_equal(lay.blocks().numpy(), raw)
        x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1)).half()
        ref = x.double().numpy() @ oracle(raw, G.GGMLType.Q4_K, 256).astype(np.float64).T
        assert np.linalg.norm(lay(x).double().numpy() - ref) / np.linalg.norm(ref) < TOL[torch.float16]
    monkeypatch.undo()
    (tmp_path / "dir").mkdir()
    with pytest.raises((ValueError, CheckpointError), match="affine_runtime applies to .gguf files"):
        load_checkpoint(tmp_path / "dir", affine_runtime=True)


#: the float16 scale fields of a block (byte offsets) and the values a block holds
SCALES = {"Q4_K": ((0, 2), 256, 144), "Q8_0": ((0,), 32, 34)}


def random_rows(qtype: str, n: int, k: int, seed: int) -> torch.Tensor:
    """Random GGML bytes (every code and sub-scale bit random) with finite float16 scales."""
    at, block, size = SCALES[qtype]
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n, -(-k // block) * size), dtype=torch.uint8, generator=g)
    blocks = raw.view(n, -1, size)
    for a in at:
        d = (torch.rand(n, blocks.shape[1], generator=g) * 0.01 + 1e-3).half()
        blocks[:, :, a:a + 2] = d.unsqueeze(-1).view(torch.uint8)
    return raw


@pytest.mark.parametrize(("qtype", "k", "dtype"), [("Q4_K", 512, torch.float16), ("Q4_K", 512, torch.bfloat16),
                                                   ("Q8_0", 640, torch.bfloat16), ("Q8_0", 640, torch.float16)])
def test_runtime_replaces_blocks_losslessly(qtype: str, k: int, dtype: torch.dtype) -> None:
    """By default a Q4_K or Q8_0 layer of whole blocks keeps only its runtime form: the blocks come back bit for bit
    (state_dict, blocks(), a round trip through load_state_dict), every forward matches gguf-py's weight, float32
    inputs too (blocks re-encoded for the block kernels), and new blocks replace the old."""
    n = 37
    raw = random_rows(qtype, n, k, 1)
    w64 = oracle(raw.numpy(), G.ggml_type(qtype), k).astype(np.float64)
    lay = GGUFTritonKernel(G.scheme_for(qtype, k, n), dtype=dtype)
    lay.load_blocks(raw.clone())
    lay.prepare()
    assert lay.codes_replaced and "qweight" not in dict(lay.named_buffers()) and lay.affine_packed() is not None
    assert torch.equal(lay.state_dict()["qweight"], raw) and list(lay.state_dict()) == ["qweight"]
    assert torch.equal(lay.blocks(), raw) and torch.equal(lay.qweight, raw) and lay.codes_replaced
    assert np.array_equal(lay.dequantize().numpy(), w64.astype(np.float32))
    for m, x_dtype in ((1, dtype), (5, dtype), (40, dtype), (3, torch.float32)):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(x_dtype)
        ref = x.double().numpy() @ w64.T
        err = np.linalg.norm(lay(x).double().numpy() - ref) / np.linalg.norm(ref)
        assert err < TOL[x_dtype], (m, x_dtype, err)
    twin = GGUFTritonKernel(G.scheme_for(qtype, k, n), dtype=dtype)
    twin.load_blocks(random_rows(qtype, n, k, 2))
    twin.prepare()
    twin.load_state_dict(lay.state_dict())
    assert not twin.codes_replaced and torch.equal(twin.qweight, raw)
    twin.ensure_prepared()
    assert twin.codes_replaced and torch.equal(twin.blocks(), raw)
    lay.bfloat16().half().float()  # what model.to(dtype) does: the runtime keeps its dtypes, so nothing is rounded
    assert torch.equal(lay.blocks(), raw) and lay.affine_packed().scales.dtype == {"Q4_K": torch.uint8,
                                                                                  "Q8_0": torch.float16}[qtype]
    other = random_rows(qtype, n, k, 3)
    lay.load_blocks(other)
    assert lay(torch.ones(1, k, dtype=dtype)).shape == (1, n) and torch.equal(lay.blocks(), other)


def test_a_bias_changed_after_the_drop_rebuilds_the_runtime_from_the_read_back_blocks() -> None:
    qtype, k, n = "Q8_0", 640, 24
    raw = random_rows(qtype, n, k, 4)
    lay = GGUFTritonKernel(G.scheme_for(qtype, k, n), bias=True, dtype=torch.float16)
    lay.load_blocks(raw.clone(), torch.zeros(n))
    lay.prepare()
    old_anchor = lay.runtime_anchor()
    assert lay.codes_replaced
    with torch.no_grad():
        lay.bias.add_(1.0)  # a checkpoint tensor changed in place: the next forward prepares again
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(0)).half()
    ref = x.double().numpy() @ oracle(raw.numpy(), G.ggml_type(qtype), k).astype(np.float64).T + 1.0
    y = lay(x)
    assert lay.runtime_anchor() is not old_anchor and lay.codes_replaced and torch.equal(lay.blocks(), raw)
    assert np.linalg.norm(y.double().numpy() - ref) / np.linalg.norm(ref) < TOL[torch.float16]


def test_q8_0_runtime_is_gptq_8bit_g32() -> None:
    """Q8_0's form: 8-bit words, the constant zero 128, the float16 d per 32 as the scale (8.5 bits a weight, as
    the blocks): the GPTQ variants without offsets run it."""
    lay = GGUFTritonKernel(G.scheme_for("Q8_0", 640, 37), dtype=torch.float16)
    lay.load_blocks(random_rows("Q8_0", 37, 640, 4))
    lay.prepare()
    p = lay.affine_packed()
    assert (p.bits, p.zero_const, p.group, p.offsets, p.scales.dtype) == (8, 128, 32, None, torch.float16)


def test_q4_k_keeps_its_blocks_where_the_runtime_would_not_replace_them() -> None:
    """Blocks stay: ``affine_runtime=False``; a partial super-block (K = 600); float32 activations; a non-finite d
    (a NaN's float16 payload need not survive the runtime's float32)."""
    n = 21
    cases = {"off": (512, torch.float16, False, False), "partial": (600, torch.float16, None, False),
             "float32": (512, torch.float32, None, False), "nan": (512, torch.bfloat16, None, True)}
    for name, (k, dtype, flag, nan) in cases.items():
        raw = random_rows("Q4_K", n, -(-k // 256) * 256, 4)
        if nan:
            raw.view(n, -1, 144)[3, 0, 0:2] = torch.tensor([float("nan")], dtype=torch.float16).view(torch.uint8)
        lay = GGUFTritonKernel(G.scheme_for("Q4_K", k, n), dtype=dtype, affine_runtime=flag)
        lay.load_blocks(raw)
        lay.prepare()
        assert not lay.codes_replaced and torch.equal(lay.qweight, raw), name
        assert lay.affine_packed() is None, name


def test_q4_k_replaced_blocks_shard_and_report_their_device() -> None:
    """Code that reads a GGUF layer's bytes goes through ``blocks()``: a column-parallel shard of a replaced layer
    holds its rows' blocks exactly."""
    from qlinear.parallel.shard import shard

    n, k = 32, 512
    raw = random_rows("Q4_K", n, k, 5)
    lay = GGUFTritonKernel(G.scheme_for("Q4_K", k, n), dtype=torch.float16)
    lay.load_blocks(raw)
    lay.prepare()
    assert lay.codes_replaced and lay.weight_device == torch.device("cpu")
    part = shard(lay, 1, 2, "out", backend="gguf_torch")  # the interpreter runs on a CPU target
    assert torch.equal(part.layer.qweight, raw[16:])


def test_explain_call_names_the_form_and_the_variant_the_forward_runs() -> None:
    """Q4_K: the runtime's variant (as ``runtime_config`` gives it), the offset-less variants ruled out by name; a
    Q6_K layer: its block variant."""
    lay = GGUFTritonKernel(G.scheme_for("Q4_K", 512, 37), dtype=torch.float16)
    lay.load_blocks(random_rows("Q4_K", 37, 512, 6))
    cpu = torch.device("cpu")
    for m in (1, 9, 100, 3000):
        head, first, *rest = lay.explain_call(m, "cpu").splitlines()
        cfg = lay.runtime_config(lay.affine_packed(), m, torch.float16, cpu)
        assert head == "Q4_K on the GPTQ kernels (blocks replaced by the two-level Q4_K form)"
        assert first.startswith(f"M={m}: {cfg.variant} — "), first
        assert "  skinny: adds no per-group offset (GGUF minimums)" in rest
        assert any(line.startswith("  gemm5: ") and "no CUDA device" in line for line in rest)  # offsets: fine
    six = layer(G.GGMLType.Q6_K, 37, 600)[0]
    assert six.explain_call(40, "cpu").startswith(f"M=40: {six.config(40, cpu).variant} on the Q6_K blocks")


def test_offset_layouts_route_past_the_gptq_table_above_m8() -> None:
    """Above M=8 a Q4_K runtime takes the offset crossovers measured for it (gemv_tc to 16, skinny2 to 32, gemm2 to
    64, dense above: results/h100-gguf_crossover-2026-12-06.md), not the GPTQ table's choices, most of which cannot
    add offsets; Q8_0's form (no offsets) keeps the table."""
    from qlinear.kernels.affine_offsets import OFFSET_CROSSOVERS

    assert OFFSET_CROSSOVERS == {"gemm5": 1024, "gemv_tc": 16, "skinny2": 32, "gemm2": 64}
    cpu = torch.device("cpu")
    lay = GGUFTritonKernel(G.scheme_for("Q4_K", 512, 64), dtype=torch.bfloat16)
    lay.load_blocks(random_rows("Q4_K", 64, 512, 7))
    lay.prepare()
    got = {m: lay.runtime_config(lay.affine_packed(), m, torch.bfloat16, cpu).variant for m in (12, 20, 50, 100, 5000)}
    assert got == {12: "gemv_tc", 20: "skinny2", 50: "gemm2", 100: "dense", 5000: "dense"}
    x = torch.randn(100, 512, generator=torch.Generator().manual_seed(3)).bfloat16()
    ref = x.double().numpy() @ oracle(lay.blocks().numpy(), G.GGMLType.Q4_K, 512).astype(np.float64).T
    assert np.linalg.norm(lay(x).double().numpy() - ref) / np.linalg.norm(ref) < TOL[torch.bfloat16]
