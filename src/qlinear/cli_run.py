"""``qlinear run PATH --prompt ...``: greedy generation with a real model served by qlinear kernels."""

from __future__ import annotations

import argparse
import time


def cmd_run(args: argparse.Namespace) -> int:
    """Load PATH (a .gguf file or a GPTQ / AWQ / compressed-tensors / FP8 directory) through ``qlinear.hf_model``
    and generate greedily."""
    import torch

    from .hf_model import backend_summary, from_pretrained, load_tokenizer
    from .select import parse_dtype

    model = from_pretrained(args.path, device=args.device, dtype=parse_dtype(args.dtype), backend=args.backend)
    tok = load_tokenizer(args.path)
    ids = tok(args.prompt, return_tensors="pt").input_ids.to(args.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                             pad_token_id=tok.eos_token_id)
    dt = time.perf_counter() - t0
    new = out[0, ids.shape[1]:]
    print(tok.decode(out[0], skip_special_tokens=True))  # whole sequence: the tokenizer spaces the seam
    print(f"\n{len(new)} tokens in {dt:.2f} s: {len(new) / dt:.1f} tokens/s")
    print("\n".join(backend_summary(model)))
    return 0


def add_run_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="generate text with a .gguf file or a quantized safetensors directory "
                                   "(needs qlinear[hf])")
    p.add_argument("path", help="a .gguf file or a quantized checkpoint directory with config.json")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", help="activation dtype: float32, bfloat16, float16")
    p.add_argument("--backend", default="auto")
    p.set_defaults(func=cmd_run)
