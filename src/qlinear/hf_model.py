"""Real models end to end: a transformers causal LM whose linear layers are qlinear kernels.

``from_pretrained(path)`` takes a ``.gguf`` file (llama architecture) or a GPTQ / AWQ / compressed-tensors / FP8
safetensors directory.
For GGUF, transformers builds the fp32 model from the file (its own dequantization, our reference), then each
``nn.Linear`` whose weight is a quantized GGUF tensor is replaced by a GGUF kernel serving that tensor's own
blocks. llama.cpp's converter permutes the rows of q/k for its rope layout; GGML blocks never straddle rows,
so undoing that is a row permutation of the block bytes: exact, and free at run time. (transformers refuses any
quantization_config next to ``gguf_file=`` and its "gguf" quantizer is taken, so GGUF cannot go through
``hf_quantizer``.)
A safetensors directory goes through transformers' own ``from_pretrained`` with ``hf_quantizer.QlinearConfig``
where transformers' loader can read it (``_transformers_loads``); otherwise the model is assembled here.

transformers is an optional extra (``pip install 'qlinear[hf]'``), imported lazily. Loading a GGUF file
through transformers also needs ``accelerate`` (requirements/nodeps-hf.txt).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .enums import BACKEND
from .kernels.base import QuantLinear
from .model import set_submodule

INSTALL = "pip install 'qlinear[hf]' and pip install --no-deps -r requirements/nodeps-hf.txt"

#: transformers module suffix (llama family) -> GGUF layer suffix.
GGUF_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only: never reach for a hub
    try:
        import transformers
    except ImportError as err:
        raise ImportError(f"qlinear.hf_model needs transformers: {INSTALL}") from err
    return transformers


def gguf_layer_name(module: str, tied: bool = True) -> str | None:
    """``model.layers.3.mlp.up_proj`` -> ``blk.3.ffn_up``; ``lm_head`` -> ``output`` (``token_embd`` if tied)."""
    if module == "lm_head":
        return "token_embd" if tied else "output"
    parts = module.split(".")
    if parts[:2] != ["model", "layers"] or len(parts) != 5:
        return None
    suffix = GGUF_NAMES.get(".".join(parts[3:]))
    return None if suffix is None else f"blk.{parts[2]}.{suffix}"


def rope_rows(n_rows: int, n_head: int) -> torch.Tensor:
    """Index ``idx`` with ``gguf_rows = hf_rows[idx]``: llama.cpp's ``permute`` of q/k (per head, the two rope
    halves interleaved). So ``hf_rows = gguf_rows[argsort(idx)]``."""
    d = n_rows // n_head
    hf = torch.arange(n_rows).reshape(n_head, 2, d // 2)
    return hf.transpose(1, 2).reshape(-1)


def _from_gguf(file: Path, device: str | torch.device, dtype: torch.dtype, backend: str,
               affine_runtime: bool | None) -> nn.Module:
    from .gguf_file import read_gguf

    tf = _transformers()
    f = read_gguf(file)
    if f.architecture != "llama":
        raise ValueError(f"{file}: architecture {f.architecture!r}; only llama GGUF files are mapped to transformers")
    model = tf.AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32)
    return serve_gguf(model, f, device, dtype, backend, affine_runtime)


def serve_gguf(model: nn.Module, f: Any, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               backend: BACKEND | str = "auto", affine_runtime: bool | None = None) -> nn.Module:
    """Swap, in place, each ``nn.Linear`` of a transformers llama model built from the GGUF file ``f`` (a path or
    a ``GGUFFile``) for a kernel serving that tensor's own blocks (q/k rows put back in transformers' order).
    ``affine_runtime``: see ``GGUFFile.linear``."""
    from .checkpoint.gguf import FLOAT_TYPES
    from .gguf_file import GGUFFile, read_gguf

    f = f if isinstance(f, GGUFFile) else read_gguf(f)
    backend = str(BACKEND(backend).value)
    cfg = model.config
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    weights = f.layers()
    tied = "output" not in weights
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear):
            continue
        layer = gguf_layer_name(name, tied)
        if layer is None or layer not in weights or weights[layer].type in FLOAT_TYPES:
            continue
        kind = layer.rsplit(".", 1)[-1]
        rows = torch.argsort(rope_rows(mod.out_features, heads[kind])) if kind in heads else None
        set_submodule(model, name, f.linear(layer, backend=backend, device=device, dtype=dtype, rows=rows,
                                                  affine_runtime=affine_runtime))
    return _finish(model, device, dtype)


def _from_dir(root: Path, device: str | torch.device, dtype: torch.dtype, backend: str) -> nn.Module:
    """A GPTQ / AWQ / compressed-tensors / FP8 / ... directory: transformers' own ``from_pretrained`` with a
    ``QlinearConfig`` (``hf_quantizer``) where transformers' loader can read it, else ``_from_dir_direct``."""
    if _transformers_loads(root):
        return _from_dir_transformers(root, device, dtype, backend)
    return _from_dir_direct(root, device, dtype, backend)


def _transformers_loads(root: Path) -> bool:
    """transformers finds the weights (``model.safetensors`` or its index, not e.g. AutoGPTQ's
    ``gptq_model-4bit-32g.safetensors``) and the checkpoint quantizes linear layers only (mlx-lm also quantizes
    embeddings, which ``_from_dir_direct`` serves dense)."""
    from .checkpoint.plan import read_quant_config
    from .checkpoint.plan_mlx import SOURCE as MLX_SOURCE
    from .checkpoint.safetensors_io import CheckpointError

    if not (root / "config.json").is_file() or not any(
            (root / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")):
        return False
    try:
        return read_quant_config(root)[1] != MLX_SOURCE
    except CheckpointError:
        return False  # the direct path plans it and reports the problem


def _from_dir_transformers(root: Path, device: str | torch.device, dtype: torch.dtype, backend: str) -> nn.Module:
    """``AutoModelForCausalLM.from_pretrained(root, quantization_config=QlinearConfig(...))``, strict about the
    tensors as ``_from_dir_direct`` is. transformers keeps the float buffers it computes in float32 (rotary
    ``inv_freq``) where ``_finish`` would cast them; the model is only moved."""
    from . import hf_quantizer
    from .checkpoint.safetensors_io import CheckpointError

    tf = _transformers()
    hf_quantizer.register()
    config = hf_quantizer.QlinearConfig(backend=backend, dtype=dtype, device=device)
    model, info = tf.AutoModelForCausalLM.from_pretrained(str(root), quantization_config=config, dtype=dtype,
                                                          output_loading_info=True)
    missing, unexpected, mismatched = (sorted(info[k]) for k in ("missing_keys", "unexpected_keys",
                                                                  "mismatched_keys"))
    if missing or unexpected or mismatched:
        raise CheckpointError(f"{root}: tensors do not fit the {model.config.model_type} model: missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}, mismatched {mismatched[:5]}")
    return model.to(device).requires_grad_(False).eval()  # as _finish leaves the float modules


def _from_dir_direct(root: Path, device: str | torch.device, dtype: torch.dtype, backend: str) -> nn.Module:
    """The architecture from config.json (no weights fetched), the quantized modules as qlinear layers, every
    other tensor (embeddings, norms, an unquantized head) from the safetensors files."""
    from .checkpoint.load import load_plan
    from .checkpoint.plan import plan_checkpoint
    from .checkpoint.safetensors_io import CheckpointError, read_tensor

    tf = _transformers()
    plan = plan_checkpoint(root)
    if plan.model_config is None:
        raise CheckpointError(f"{root}: no config.json: transformers needs the model architecture")
    cfg = dict(plan.model_config)
    config = tf.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: read_tensor(v) for k, v in plan.other.items()}
    embeddings = {n for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
    for name, layer in load_plan(plan, device, dtype, backend).items():
        if name in embeddings:  # mlx-lm quantizes embeddings too: they are served dense
            state[f"{name}.weight"] = layer.dequantize(torch.float32).cpu()
        else:
            set_submodule(model, name, layer)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        missing = [k for k in missing if k != "lm_head.weight"]
    served = [n + "." for n, m in model.named_modules() if isinstance(m, QuantLinear)]  # leaves may hold dots
    missing = [k for k in missing if not k.startswith(tuple(served))]
    if missing or unexpected:
        raise CheckpointError(f"{root}: tensors do not fit the {config.model_type} model: missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False) and isinstance(model.get_output_embeddings(), nn.Linear):
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return _finish(model, device, dtype)


def _finish(model: nn.Module, device: str | torch.device, dtype: torch.dtype) -> nn.Module:
    from .model import move_unquantized

    move_unquantized(model, device, dtype)
    return model.eval()


def from_pretrained(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    backend: BACKEND | str = "auto", gguf_file: str | None = None,
                    affine_runtime: bool | None = None) -> nn.Module:
    """A transformers causal LM whose quantized linear layers are qlinear kernels (``served_layers(model)``).

    ``path``: a ``.gguf`` file, a directory plus ``gguf_file``, or a GPTQ / AWQ / compressed-tensors / FP8
    safetensors directory with a config.json. ``dtype`` is the activation dtype of every kernel and of the float
    modules.
    ``affine_runtime`` (GGUF only): which layers of the Triton GGUF kernel run on the GPTQ kernels' affine runtime
    (``GGUFFile.linear``; by default Q4_K's and Q8_0's lossless forms in place of their blocks).
    """
    path = Path(path)
    if gguf_file is not None:
        path = path / gguf_file
    backend = str(BACKEND(backend).value)
    if path.suffix.lower() == ".gguf":
        return _from_gguf(path, device, dtype, backend, affine_runtime)
    if affine_runtime:
        raise ValueError(f"{path}: affine_runtime applies to GGUF files, not to a safetensors directory")
    return _from_dir(path, device, dtype, backend)


def load_tokenizer(path: str | Path, gguf_file: str | None = None) -> Any:
    """The tokenizer of a GGUF file (from its metadata) or of a directory (tokenizer.json)."""
    tf = _transformers()
    path = Path(path) if gguf_file is None else Path(path) / gguf_file
    if path.suffix.lower() == ".gguf":
        return tf.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return tf.AutoTokenizer.from_pretrained(str(path))


def quantize_model(model: nn.Module, bits: int = 4, group_size: int = 128, skip: tuple[str, ...] = ("lm_head",),
                   device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                   backend: BACKEND | str = "auto", clip_search: bool = True,
                   sym: bool = True) -> dict[str, QuantLinear]:
    """RTN (GPTQ grid) every ``nn.Linear`` except ``skip``, in place, as GPTQ v2 layers. The head stays float
    by default, as GPTQ checkpoints usually keep it: at 4 bits it costs far more quality than a block layer."""
    from .model import quantize_linears

    return quantize_linears(model, bits=bits, group_size=group_size, sym=sym, backend=backend, device=device,
                            dtype=dtype, clip_search=clip_search, skip=skip)


def served_layers(model: nn.Module) -> dict[str, QuantLinear]:
    """Every qlinear layer of ``model`` by module name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


def backend_summary(model: nn.Module) -> list[str]:
    """One line per (layer kind, backend, format): how many layers a backend serves."""
    counts: dict[tuple[str, str, str], int] = {}
    for name, m in served_layers(model).items():
        parts = name.split(".")
        kind = ".".join(parts[3:]) if parts[:2] == ["model", "layers"] else name
        fmt = getattr(m.scheme, "qtype", None) or m.scheme.format.value
        key = (kind, str(getattr(m.backend, "value", m.backend)), str(getattr(fmt, "name", fmt)))
        counts[key] = counts.get(key, 0) + 1
    return [f"  {k:<18} {n:>3} x {b} ({f})" for (k, b, f), n in counts.items()]
