"""EXL2 (exllamav2's mixed-bit checkpoints): codec, Exl2TorchLinear and the checkpoint planner.

What is checked against what:

* packing: ``layouts/exl2.encode`` against ``tests/oracle/exl2_numpy.py``'s transcriptions of exllamav2 0.3.2's
  ``pack_columns_kernel`` (every width) and ``pack_rows_4_kernel``, word for word. exllamav2 packs EXL2 rows only
  in those CUDA kernels (``conversion/adaptivegptq.py`` calls ``ext_c.pack_columns`` / ``ext_c.pack_rows_4``), and
  its extension is JIT-built with nvcc, so nothing of the producer runs here: every fact is transcribed.
* decoding: ``layouts/exl2.dequantize`` against the oracle's transcription of ``make_q_matrix`` (``q_scale_max``
  divided by 256), ``dq_scale`` and the QMODE-0 bit reads of ``qdq_{2,3,4,5,6,8}.cuh``, bit for bit in float16
  (including maxima small enough to become subnormal after the division).
* a float64 reference (``(q - 2**(b-1)) * (qs + 1)**2 * q_scale_max / 256``, no float16 rounding) within float16
  rounding, and the layer's forward against the float64 product of the oracle's weight.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from qlinear.checkpoint import CheckpointError, load_checkpoint, plan_checkpoint
from qlinear.kernels.exl2 import Exl2TorchLinear
from qlinear.layouts import exl2
from qlinear.spec import Scheme
from tests.oracle import exl2_numpy as oracle

N = 64
PARAMS = [exl2.Exl2Params((8, 6, 5, 4, 3, 2), (32, 32, 32, 64, 32, 64)),
          exl2.Exl2Params((6, 4, 4, 2), (64, 128, 128, 16)),
          exl2.Exl2Params((3,), (96,), stored_perm=True),
          exl2.Exl2Params((5, 5, 4, 4, 4, 4, 3, 3, 3), (32,) * 8 + (64,))]  # runs of one width: one bit stream


def module(p: exl2.Exl2Params, seed: int, n: int = N) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """Random checkpoint tensors of one layer, plus the codes [K, N] and the scale codes (1..16) behind them."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.cat([torch.randint(0, 1 << b, (r, n), generator=g) for b, r in zip(p.group_bits, p.group_rows)])
    qscale = torch.randint(1, 17, (len(p.group_bits), n), generator=g)
    smax = torch.rand(len(p.group_bits), generator=g) * 0.02 + 1e-4  # small: subnormal once divided by 256
    perm = torch.randperm(p.in_features, generator=g)
    tensors = exl2.encode(codes, qscale - 1, smax.half(), perm, p, stored_perm=p.stored_perm)
    tensors["bias"] = (torch.randn(n, generator=g) * 0.1).half()
    return tensors, codes, qscale


def numpy_of(t: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in t.items()}


@pytest.mark.parametrize("p", PARAMS)
def test_packing_matches_pack_columns_and_pack_rows_4(p: exl2.Exl2Params) -> None:
    t, codes, qscale = module(p, 1)
    want, row = [], 0
    for b, r in zip(p.group_bits, p.group_rows):
        want.append(oracle.pack_columns(codes[row:row + r].numpy(), b))
        row += r
    assert np.array_equal(t["q_weight"].numpy().view(np.uint32), np.concatenate(want))
    assert np.array_equal(t["q_scale"].numpy().view(np.uint32), oracle.pack_rows_4(qscale.numpy()))
    assert t["q_groups"].dtype == torch.int16 and t["q_invperm"].dtype == torch.int32
    assert exl2.params_from(t["q_groups"], t["q_weight"].shape[0], p.in_features, p.stored_perm) == p


@pytest.mark.parametrize("p", PARAMS)
def test_decode_matches_reconstruct_kernel_bit_for_bit(p: exl2.Exl2Params) -> None:
    t, codes, qscale = module(p, 2)
    a = numpy_of(t)
    want = oracle.exl2_weight(a["q_weight"], a["q_invperm"], a["q_scale"], a["q_scale_max"], a["q_groups"],
                              p.in_features)
    got = exl2.dequantize(t, p, N)
    assert np.array_equal(got.numpy().view(np.uint16), want.T.copy().view(np.uint16))
    # float64, no float16 rounding anywhere: within two float16 roundings (plus subnormal spacing)
    zero = torch.cat([torch.full((r,), 1 << (b - 1)) for b, r in zip(p.group_bits, p.group_rows)])
    gid = torch.cat([torch.full((r,), i) for i, r in enumerate(p.group_rows)])
    scale = qscale.double() ** 2 * (t["q_scale_max"].double() / 256)[:, None]
    w64 = ((codes.double() - zero[:, None]) * scale[gid])[t["q_invperm"].long()].t()
    assert (got.double() - w64).abs().max() <= 2e-3 * w64.abs().max() + 2 ** -23


def direct(t: dict[str, torch.Tensor], p: exl2.Exl2Params) -> Exl2TorchLinear:
    s = Scheme(bits=p.max_bits, group_size=-1, in_features=p.in_features, out_features=N, method="exl2",
               format="exl2", layout_params=p)
    layer = Exl2TorchLinear(s, bias=True)
    layer.load_state_dict(t, strict=True)
    return layer


@pytest.mark.parametrize("p", PARAMS)
def test_forward_matches_float64_product(p: exl2.Exl2Params) -> None:
    t, _, _ = module(p, 3)
    a = numpy_of(t)
    w = torch.from_numpy(oracle.exl2_weight(a["q_weight"], a["q_invperm"], a["q_scale"], a["q_scale_max"],
                                            a["q_groups"], p.in_features).astype(np.float64))
    layer = direct(t, p)
    x = torch.randn(3, p.in_features)
    ref = x.double() @ w + t["bias"].double()
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 3e-3), (torch.bfloat16, 2e-2)):
        y = layer(x.to(dtype))
        assert y.dtype == dtype
        assert (y.double() - ref).abs().max() <= tol * ref.abs().max()
    assert torch.equal(layer.dequantize(torch.float16), exl2.dequantize(t, p, N))


def write(root: Path, modules: dict[str, dict[str, torch.Tensor]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    tensors = {f"{m}.{leaf}": v for m, leaves in modules.items() for leaf, v in leaves.items()}
    tensors["model.embed_tokens.weight"] = torch.zeros(4, 8, dtype=torch.float16)
    save_file(tensors, str(root / "model.safetensors"))
    cfg = {"quant_method": "exl2", "version": "0.3.2", "bits": 4.25, "head_bits": 6,
           "calibration": {"rows": 115, "length": 2048, "dataset": "(default)"}}
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": cfg}))
    return root


def test_checkpoint_directory_loads_and_runs(tmp_path: Path) -> None:
    mods = {"model.layers.0.mlp.up_proj": (PARAMS[0], 4), "model.layers.0.self_attn.q_proj": (PARAMS[2], 5)}
    leaves = {name: module(p, seed)[0] for name, (p, seed) in mods.items()}
    root = write(tmp_path / "ckpt", leaves)
    plan = plan_checkpoint(root)
    assert sorted(plan.modules) == sorted(mods)
    for name, (p, _) in mods.items():
        assert plan.modules[name].scheme.layout_params == p
    layers = load_checkpoint(root)  # AUTO on this CPU: the int4 parts (bfloat16 arithmetic, tests/test_exl2_cpu.py)
    exact = load_checkpoint(root, backend="exl2_torch")
    for name, (p, _) in mods.items():
        layer = layers[name]
        assert isinstance(layer, Exl2TorchLinear) and type(exact[name]) is Exl2TorchLinear
        assert sorted(layer.state_dict()) == sorted(leaves[name])
        x = torch.randn(2, p.in_features).half()
        want = direct(leaves[name], p)(x)
        assert torch.equal(exact[name](x), want)
        assert float((layer(x) - want).float().norm() / want.float().norm()) < 1.5e-2


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda t: t.__setitem__("q_scale", t["q_scale"][:, :4].contiguous()), "q_scale: found shape [6, 4]"),
    (lambda t: t.__setitem__("q_groups", torch.tensor([2, 0, 3, 4, 4, 7, 5, 15, 6, 20, 8, 26], dtype=torch.int16)),
     "increase"),
    (lambda t: t.__setitem__("q_groups", torch.tensor([8, 0, 6, 8, 5, 14, 4, 19, 3, 27, 7, 30], dtype=torch.int16)),
     "group 5 has bit width 7"),
    (lambda t: t.pop("q_invperm"), "q_invperm: expected a 1-D [in_features] integer tensor, found nothing"),
])
def test_planner_names_the_bad_tensor(tmp_path: Path, edit, needle: str) -> None:
    t, _, _ = module(PARAMS[0], 6)
    edit(t)
    root = write(tmp_path / "ckpt", {"model.layers.0.mlp.up_proj": t})
    with pytest.raises(CheckpointError, match="model.layers.0.mlp.up_proj") as err:
        plan_checkpoint(root)
    assert needle in str(err.value)


def test_content_errors_raise_value_errors() -> None:
    p = PARAMS[1]
    t, _, _ = module(p, 7)
    bad = dict(t, q_scale_max=t["q_scale_max"].clone())
    bad["q_scale_max"][1] = float("nan")
    with pytest.raises(ValueError, match="q_scale_max: found NaN"):
        exl2.dequantize(bad, p, N)
    bad = dict(t, q_invperm=torch.zeros_like(t["q_invperm"]))
    with pytest.raises(ValueError, match="q_invperm: expected a permutation"):
        direct(bad, p).prepare()
    with pytest.raises(ValueError, match="does not fill whole int32 rows"):
        exl2.Exl2Params((3, 2), (40, 16))
    with pytest.raises(ValueError, match=r"q_weight: expected 45 rows .* found 100"):
        exl2.params_from(t["q_groups"], 100, p.in_features)
    layer = direct(t, p)
    with pytest.raises(ValueError, match="expected last dimension 336"):
        layer(torch.randn(1, 7))


def test_tiny_llama_directory_serves_through_transformers(tmp_path: Path) -> None:
    """A one-layer Llama whose every linear layer (lm_head included, as exllamav2 quantizes it) is EXL2: served by
    ``hf_model.from_pretrained`` it gives the logits of the float32 model holding the decoded weights."""
    tf = pytest.importorskip("transformers", reason="transformers is not installed: pip install 'qlinear[hf]'")
    from qlinear.hf_model import backend_summary, from_pretrained

    h, inter = 64, 128
    cfg = tf.LlamaConfig(hidden_size=h, intermediate_size=inter, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=96, tie_word_embeddings=False)
    torch.manual_seed(0)
    ref = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    by_k = {h: exl2.Exl2Params((6, 4, 4), (32, 16, 16)), inter: exl2.Exl2Params((5, 4, 3), (32, 64, 32))}
    tensors = {}
    for i, (name, mod) in enumerate(ref.named_modules()):
        if isinstance(mod, torch.nn.Linear):
            n, k = mod.weight.shape
            t, _, _ = module(by_k[k], 100 + i, n=n)
            del t["bias"]
            mod.weight.data.copy_(exl2.dequantize(t, by_k[k], n).float())
            tensors.update({f"{name}.{leaf}": v for leaf, v in t.items()})
        elif not list(mod.children()) and isinstance(getattr(mod, "weight", None), torch.Tensor):
            tensors[f"{name}.weight"] = mod.weight.data.clone()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = cfg.to_dict() | {"quantization_config": {"quant_method": "exl2", "version": "0.3.2", "bits": 4.3,
                                                      "head_bits": 6}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    served = from_pretrained(tmp_path)
    summary = "\n".join(backend_summary(served))
    assert re.search(r"lm_head\s+1 x exl2_torch \(exl2\)", summary), summary
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.inference_mode():
        a, b = served(ids).logits, ref(ids).logits
    assert ((a - b).abs().max() / b.abs().max()).item() < 1e-5
