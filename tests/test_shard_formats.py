"""Tensor-parallel cuts for every kernel family that builds on the CPU (tests/shard_cases.py), at world sizes 2 and 4,
column- and row-parallel, in one process (the gloo runs are tests/test_parallel.py's).

Each cut either works, and then the column shards' outputs side by side / the row shards' outputs summed (bias once)
equal the whole layer's forward, every shard is a layer of the whole layer's class, and its weight is exactly its
slice of the whole weight; or it is refused with a ShardError naming the reason and the world sizes that work, as
REFUSED lists (a new refusal fails here). Refusals that hold at every world size are documented in
docs/parallel.md's table of refused cuts. Also: the stored-tensor cuts' read-back check, the llama plan for a
consumer with a stored permutation, gloo runs of stored-format shards, ExLlamaV2 through the canonical form, and
slice-only loading of GGUF files and planar GPTQ (the same shards as the in-memory cut, ~1/world of the bytes).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.shard_cases import CASES, STORED, make_case

#: (case, dim, world) -> what the ShardError must say. Every other cut of CASES must work.
REFUSED = {
    **{("qqq_channel", "in", w): r"per token.*world sizes that work: \[1\]" for w in (2, 4)},
    **{("qqq_grouped", "in", w): r"per token.*world sizes that work: \[1\]" for w in (2, 4)},
    **{(c, "out", 4): r"multiples of 64 for QQQTorchLinear.*world sizes that work: \[1, 2\]"
       for c in ("qqq_channel", "qqq_grouped")},
    **{("exl2_ragged", "in", w): r"whole row groups of the stored order.*world sizes that work: \[1\]" for w in (2, 4)},
    **{("exl3_mcg_signs", d, 4): r"128-point Hadamard blocks.*world sizes that work: \[1, 2\]" for d in ("out", "in")},
    ("vptq_outliers_perm", "in", 4): r"codebook groups of 64 .*64 outlier columns.*world sizes that work: \[1, 2\]",
    ("vptq_norm_out", "in", 4): r"codebook groups of 128 .*world sizes that work: \[1, 2\]",
}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "parallel.md"


def _tolerance(dtype: torch.dtype) -> float:
    """|diff| / max |y| between the sharded and the whole forward: float32 sums in another order, or (float16
    activations) one float16 rounding of each shard's output."""
    return 2e-6 if dtype == torch.float32 else 2e-3


def _check_cut(layer: torch.nn.Module, x: torch.Tensor, world: int, dim: str) -> None:
    from qlinear.parallel.shard import shard

    whole = layer(x).float()
    scale = whole.abs().max().item()
    weight = layer.dequantize(torch.float32)
    parts = [shard(layer, r, world, dim) for r in range(world)]
    outs = []
    for p in parts:
        assert type(p.layer) is type(layer) and p.layer.scheme.format is layer.scheme.format
        o0, o1 = p.out_range
        cols = p.in_index if p.in_index is not None else torch.arange(*p.in_range)
        assert (o1 - o0, len(cols)) == (p.layer.out_features, p.layer.in_features)
        got = p.layer.dequantize(torch.float32)
        want = weight[o0:o1][:, cols]
        if layer.scheme.format.value == "exl3":  # float32 Hadamard products round by matrix shape (shard_stored)
            assert (got - want).abs().max() <= 1e-6 * want.abs().max()
        else:
            assert torch.equal(got, want)
        outs.append(p.layer(x if dim == "out" else x[:, cols]).float())
    if dim == "out":
        got = torch.cat(outs, dim=-1)
    else:
        got = sum(outs)
        assert all(p.layer.bias is None for p in parts)
        if parts[0].bias is not None:
            got = got + parts[0].bias.float()
    assert (got - whole).abs().max().item() <= _tolerance(x.dtype) * scale, (dim, world)


@pytest.mark.parametrize("case", CASES)
def test_every_cpu_family_cuts_exactly_or_refuses_as_listed(case: str) -> None:
    from qlinear.parallel.shard import ShardError, shard

    torch.manual_seed(0)
    layer, dtype = make_case(case)
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(11)).to(dtype)
    for world in (2, 4):
        for dim in ("out", "in"):
            want = REFUSED.get((case, dim, world))
            if want is None:
                _check_cut(layer, x, world, dim)
            else:
                with pytest.raises(ShardError, match=want):
                    shard(layer, 0, world, dim)


def test_refusals_at_every_world_size_are_in_the_docs_table() -> None:
    """A cut refused at every world size (``world sizes that work: [1]``) has its row, family and dimension, in
    docs/parallel.md's table of refused cuts (the family as the error names it)."""
    from qlinear.parallel.shard import ShardError, shard

    text = DOCS.read_text()
    for (case, dim, world), _ in REFUSED.items():
        if world != 2:
            continue
        layer, _ = make_case(case)
        with pytest.raises(ShardError) as err:
            shard(layer, 0, world, dim)
        if "world sizes that work: [1]" in str(err.value):
            family = re.search(r"\(([^()]+)\): cannot cut", str(err.value)).group(1)
            row = f"| {family} | {'column' if dim == 'out' else 'row'} |"
            assert row in text, (case, row)


def test_a_stored_cut_that_does_not_read_back_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back check runs in the cut itself: EXL3 tiles taken from the wrong place are caught."""
    from qlinear.enums import FORMAT
    from qlinear.parallel import shard_stored
    from qlinear.parallel.shard import ShardError, shard

    layer, _ = make_case("exl3_3inst")
    right = shard_stored._CUTS[FORMAT.EXL3]

    def shifted(lay, t, o0, o1, i0, i1):  # the neighbouring tiles, same shapes
        sch, out, index = right(lay, t, o0, o1, i0, i1)
        return sch, dict(out, trellis=t["trellis"][:, 8:16]), index

    monkeypatch.setitem(shard_stored._CUTS, FORMAT.EXL3, shifted)
    with pytest.raises(ShardError, match="does not read back as its slice"):
        shard(layer, 0, 4, "out")


@pytest.mark.parametrize("case", [c for c in STORED if not c.startswith("exl3")])
def test_stored_shards_hold_slices_of_the_stored_tensors(case: str) -> None:
    """Codes stay codes: every stored tensor of a column shard of EXL2 / VPTQ / ParoQuant is a slice of the whole
    layer's tensor of the same name along one axis, or the whole tensor (nothing re-encoded)."""
    from qlinear.parallel.shard import shard

    layer, _ = make_case(case)
    whole = layer.state_dict()
    part = shard(layer, 1, 2, "out").layer.state_dict()
    assert part.keys() == whole.keys()
    for name, t in part.items():
        w = whole[name]
        if t.shape == w.shape:
            assert torch.equal(t, w), name
            continue
        axis = next(a for a in range(t.dim()) if t.shape[a] != w.shape[a])
        piece = w.shape[axis] // 2
        assert t.shape[axis] == piece and torch.equal(t, w.narrow(axis, piece, piece)), name


def test_llama_plan_gathers_for_a_consumer_that_reads_through_a_stored_permutation() -> None:
    """An EXL2 (or permuted VPTQ) o_proj reads a permuted set of input features when row-cut, so the plan
    all-gathers its producers and row-cuts it on the whole input instead of a contiguous split."""
    from types import SimpleNamespace

    from qlinear.parallel.plan import llama_placements

    exl2_layer, _ = make_case("exl2_aligned")
    vptq_layer, _ = make_case("vptq_norm_out")  # no perm: a contiguous split works
    gptq, _ = make_case("gptq_v2_asym")
    config = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2)
    for consumer, how in ((exl2_layer, "row(whole input)"), (vptq_layer, "row")):
        schemes = {f"m.{p}": gptq.scheme for p in ("q_proj", "k_proj", "v_proj")} | {"m.o_proj": consumer.scheme}
        got = {p.name: p for p in llama_placements(schemes, config, 2)}
        assert got["m.o_proj"].how == how, got["m.o_proj"]
        assert got["m.q_proj"].how == ("column+gather" if how != "row" else "column")
        if how != "row":
            assert "stored permutation" in got["m.o_proj"].why


def _gguf_file(path: Path) -> dict[str, torch.nn.Module]:
    """A llama-named GGUF file (a Q4_K column-parallel weight with a bias, a Q8_0 row-parallel one) written from
    qlinear's own ggml-exact blocks; returns the whole layers built the ordinary way."""
    import gguf

    from qlinear.gguf_file import read_gguf
    from tests.tp_cases import make_layer

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    layers = {"blk.0.attn_q": make_layer("gguf_q4_k", seed=8), "blk.0.ffn_down": make_layer("gguf_q8_0", seed=9)}
    for name, layer in layers.items():
        qtype = gguf.GGMLQuantizationType[layer.type_info.name]
        w.add_tensor(f"{name}.weight", layer.qweight.numpy(), raw_dtype=qtype)
    w.add_tensor("blk.0.attn_q.bias", layers["blk.0.attn_q"].bias.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = read_gguf(path)
    return {name: f.linear(name, dtype=torch.float32, share=False) for name in layers}


def test_gguf_ranks_read_their_blocks_as_the_in_memory_cut(tmp_path: Path) -> None:
    """load_gguf: rank r's shard of each planned layer holds the same blocks, bias and outputs as the in-memory cut of
    the whole layer; the rows or blocks were read from the memory map (the note says so)."""
    from qlinear.parallel.load_gguf import load_gguf
    from qlinear.parallel.shard import shard

    whole = _gguf_file(tmp_path / "m.gguf")
    x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(5))
    for world in (2, 4):
        for rank in range(world):
            got = load_gguf(tmp_path / "m.gguf", rank, world, dtype=torch.float32)
            assert got.keys() == whole.keys()
            for name, part in got.items():
                ref = shard(whole[name], rank, world, part.dim)
                assert (part.dim, part.out_range, part.in_range) == ("out" if "attn_q" in name else "in",
                                                                      ref.out_range, ref.in_range)
                assert torch.equal(part.layer.qweight, ref.layer.qweight), (name, world, rank)
                assert (part.bias is None) == (ref.bias is None) and "memory-mapped GGUF" in part.note
                xs = x[:, :part.layer.in_features] if part.dim == "out" else x[:, slice(*part.in_range)]
                assert torch.equal(part.layer(xs), ref.layer(xs))


def test_gguf_rank_copies_about_one_world_th_of_the_blocks(tmp_path: Path) -> None:
    """What a rank copies out of the file (numpy allocations, traced) is ~1/world of the layer's packed bytes."""
    import tracemalloc

    from qlinear.gguf_file import read_gguf
    from qlinear.parallel.load_gguf import load_gguf_shard

    _gguf_file(tmp_path / "m.gguf")
    f = read_gguf(tmp_path / "m.gguf")
    for name, dim in (("blk.0.attn_q", "out"), ("blk.0.ffn_down", "in")):
        total = f.layers()[name].nbytes
        for world in (2, 4):
            tracemalloc.start()
            load_gguf_shard(f, name, world - 1, world, dim, dtype=torch.float32)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert total / world * 0.9 < peak < total / world * 1.1 + 64 * 1024, (name, world, peak, total)


def test_planar_gptq_reads_slices_of_whole_blocks(tmp_path: Path) -> None:
    """Planar GPTQ (gptq_p) tensors are contiguous per 32-code block and its cut rule keeps blocks whole (6-bit
    words alone would allow 16): every allowed cut reads slices, the same tensors as the in-memory cut, ~1/world of
    the bytes."""
    import tracemalloc

    from qlinear.affine import quantize_rtn
    from qlinear.build import create_layer
    from qlinear.checkpoint.module_plan import ModulePlan
    from qlinear.checkpoint.safetensors_io import read_header, write_file
    from qlinear.parallel.load import load_shard
    from qlinear.parallel.shard import ShardError, shard

    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(2))
    layer = create_layer(quantize_rtn(w, 6, 64, sym=False), format="gptq_p", dtype=torch.float32)
    state = {k: v.contiguous() for k, v in layer.state_dict().items() if v is not None}
    total = sum(v.numel() * v.element_size() for v in state.values())
    write_file(tmp_path / "m.safetensors", state)
    mp = ModulePlan("m", layer.scheme, read_header(tmp_path / "m.safetensors")[0])
    with pytest.raises(ShardError, match=r"packed words \(32 codes\).*world sizes that work: \[1, 2, 4, 8\]$"):
        load_shard(mp, 1, 16, "out", dtype=torch.float32)
    for world, dim in ((2, "out"), (8, "out"), (4, "in")):
        tracemalloc.start()
        part = load_shard(mp, 1, world, dim, dtype=torch.float32)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert "read as slices" in part.note, (world, dim)
        ref = shard(layer, 1, world, dim).layer.state_dict()
        got = part.layer.state_dict()
        assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in got), (world, dim)
        assert total / world * 0.9 < peak < total / world * 1.1 + 64 * 1024, (world, dim, peak, total)


@pytest.mark.parametrize("case", STORED)
def test_stored_formats_load_whole_then_cut_on_their_tensors(tmp_path: Path, case: str) -> None:
    """A rank loading an EXL2 / EXL3 / VPTQ / ParoQuant module reads it whole and gets the stored-tensor cut."""
    from qlinear.checkpoint.module_plan import ModulePlan
    from qlinear.checkpoint.safetensors_io import read_header, write_file
    from qlinear.parallel.load import load_shard
    from qlinear.parallel.shard import ShardError, shard

    layer, dtype = make_case(case)
    write_file(tmp_path / "m.safetensors", {k: v.contiguous() for k, v in layer.state_dict().items()})
    mp = ModulePlan("m", layer.scheme, read_header(tmp_path / "m.safetensors")[0])
    for dim in ("out", "in"):
        if (case, dim, 2) in REFUSED:
            with pytest.raises(ShardError):
                load_shard(mp, 1, 2, dim, dtype=dtype)
            continue
        part, ref = load_shard(mp, 1, 2, dim, dtype=dtype), shard(layer, 1, 2, dim)
        got, want = part.layer.state_dict(), ref.layer.state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got), (case, dim)
        assert "read whole, then cut" in part.note and f"cut on the stored {layer.scheme.format.value}" in part.note


def _stored_worker(rank: int, world: int, rendezvous: str, cases: tuple[str, ...]) -> None:
    import torch.distributed as dist

    from qlinear.parallel.layers import ColumnParallelLinear, RowParallelLinear
    from tests.test_parallel import _init

    _init(rank, world, rendezvous)
    try:
        for case in cases:
            layer, dtype = make_case(case)
            x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(1)).to(dtype)
            whole = layer(x).float()
            scale = whole.abs().max().item()
            col = ColumnParallelLinear.from_layer(layer)
            assert (col(x).float() - whole).abs().max().item() <= _tolerance(dtype) * scale, (case, "column")
            row = RowParallelLinear.from_layer(layer)
            assert (row(x).float() - whole).abs().max().item() <= _tolerance(dtype) * scale, (case, "row")
            assert ("through the layout's permutation" in row.explain()) == (row.in_index is not None), case
        dist.barrier()  # no rank tears gloo down while another is still sending
    finally:
        dist.destroy_process_group()


def test_stored_format_shards_run_column_and_row_parallel_over_gloo() -> None:
    """Two gloo processes: the column- and row-parallel wrappers around EXL2 (permuted rows: the row shard gathers
    its features), EXL3, VPTQ (permuted input) and ParoQuant shards give the whole layer's output."""
    from tests.test_parallel import _spawn

    _spawn(_stored_worker, 2, ("exl2_aligned", "exl3_mcg_signs", "vptq_outliers_perm", "paroquant"))


def test_exllamav2_layers_cut_through_the_canonical_form() -> None:
    """ExLlamaV2 (CUDA-declared, but its buffers decode on the CPU) cuts through AffineWeight like GPTQ; on the CPU
    the shards run on the selector's kernel (``backend="auto"``), act-order rows sorted by group. Another kernel
    sums differently in float16, so the shards' output is held to the float64 product of the whole weight."""
    from qlinear.parallel.shard import shard
    from tests.test_exllamav2 import layer, weight

    whole = layer(weight(32, True))
    x = torch.randn(3, whole.in_features, generator=torch.Generator().manual_seed(4)).half()
    weight_whole = whole.dequantize(torch.float32)
    y = x.double() @ weight_whole.double().t()
    for dim in ("out", "in"):
        parts = [shard(whole, r, 2, dim, backend="auto") for r in range(2)]
        outs = []
        for p in parts:
            cols = p.in_index if p.in_index is not None else torch.arange(*p.in_range)
            assert torch.equal(p.layer.dequantize(torch.float32), weight_whole[slice(*p.out_range)][:, cols])
            outs.append(p.layer(x if dim == "out" else x[:, cols]).float())
        got = torch.cat(outs, -1) if dim == "out" else sum(outs)
        assert (got - y).abs().max().item() <= 5e-3 * y.abs().max().item(), dim


def _exl2_llama(root: Path) -> None:
    """A one-layer EXL2 llama directory (every linear layer EXL2 with a random input permutation; row groups that
    split K in two), as tests/test_exl2.py writes one."""
    import json

    import transformers as tf
    from safetensors.torch import save_file

    from qlinear.layouts import exl2
    from tests.test_exl2 import module

    cfg = tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=96, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    by_k = {64: exl2.Exl2Params((6, 4, 4), (32, 16, 16)), 128: exl2.Exl2Params((5, 4, 3), (32, 32, 64))}
    tensors = {}
    for i, (name, mod) in enumerate(model.named_modules()):
        if isinstance(mod, torch.nn.Linear):
            t, _, _ = module(by_k[mod.in_features], 200 + i, n=mod.out_features)
            del t["bias"]
            tensors.update({f"{name}.{leaf}": v for leaf, v in t.items()})
        elif not list(mod.children()) and isinstance(getattr(mod, "weight", None), torch.Tensor):
            tensors[f"{name}.weight"] = mod.weight.data.clone()
    save_file(tensors, str(root / "model.safetensors"))
    config = cfg.to_dict() | {"quantization_config": {"quant_method": "exl2", "version": "0.3.2", "bits": 4.3,
                                                      "head_bits": 6}}
    (root / "config.json").write_text(json.dumps(config))


def _exl2_model_worker(rank: int, world: int, rendezvous: str, root: str) -> None:
    import torch.distributed as dist

    from qlinear.hf_model import from_pretrained
    from qlinear.parallel.hf import from_pretrained_tp
    from tests.test_parallel import _init

    _init(rank, world, rendezvous)
    try:
        ids = torch.tensor([[5, 9, 13, 40, 7, 2]])
        with torch.inference_mode():
            whole = from_pretrained(root)(ids).logits
            model, placements = from_pretrained_tp(root)
            tp = model(ids).logits
        hows = {p.how for p in placements}
        assert hows == {"column+gather", "row(whole input)"}, hows
        assert (tp - whole).abs().max().item() <= 1e-5 * whole.abs().max().item()
        dist.barrier()  # no rank tears gloo down while another is still sending
    finally:
        dist.destroy_process_group()


def test_exl2_llama_runs_tensor_parallel_with_permuted_row_shards(tmp_path: Path) -> None:
    """An EXL2 llama at tp=2 (two gloo processes): o_proj / down_proj read their inputs through the stored
    permutation, so the plan gathers the producers and row-cuts them on the whole input; logits equal one process's."""
    pytest.importorskip("transformers", reason="pip install 'qlinear[hf]'")
    pytest.importorskip("accelerate", reason="pip install --no-deps -r requirements/nodeps-hf.txt")
    from tests.test_parallel import _spawn

    _exl2_llama(tmp_path)
    _spawn(_exl2_model_worker, 2, str(tmp_path))
