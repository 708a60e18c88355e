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

    rank, placements = 0, None
    if args.tp > 1 and not args.tp_worker:  # tensor parallel: relaunch as torchrun workers (qlinear.parallel.launch)
        from .parallel.launch import relaunch

        return relaunch(args.tp, ["run", str(args.path), "--prompt", args.prompt, "--max-new-tokens",
                                  str(args.max_new_tokens), "--device", args.device, "--dtype", args.dtype,
                                  "--backend", args.backend, "--tp", str(args.tp), "--tp-worker"])
    if args.tp > 1:
        from .parallel.launch import init_rank

        rank, args.device = init_rank(args.device, args.tp)
    if args.tp > 1 and not str(args.path).lower().endswith(".gguf"):  # each rank reads only its slices
        from .parallel.hf import from_pretrained_tp

        model, placements = from_pretrained_tp(args.path, device=args.device, dtype=parse_dtype(args.dtype),
                                               backend=args.backend)
    else:
        model = from_pretrained(args.path, device=args.device, dtype=parse_dtype(args.dtype), backend=args.backend)
    if args.tp > 1 and placements is None:  # a GGUF file: read whole, then cut
        from .parallel.plan import apply_llama_plan

        placements = apply_llama_plan(model)
    tok = load_tokenizer(args.path)
    ids = tok(args.prompt, return_tensors="pt").input_ids.to(args.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                             pad_token_id=tok.eos_token_id)
    dt = time.perf_counter() - t0
    new = out[0, ids.shape[1]:]
    if args.tp > 1:
        import torch.distributed as dist

        dist.barrier()  # no rank tears gloo/NCCL down while another is still sending
        dist.destroy_process_group()
        if rank:
            return 0
    print(tok.decode(out[0], skip_special_tokens=True))  # whole sequence: the tokenizer spaces the seam
    print(f"\n{len(new)} tokens in {dt:.2f} s: {len(new) / dt:.1f} tokens/s")
    print("\n".join(backend_summary(model)))
    if placements is not None:
        from .parallel.plan import summary

        print(f"tensor parallel over {args.tp} processes: {summary(placements)}")
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
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel processes (relaunched through torchrun; "
                                                     "NCCL on CUDA, gloo on the CPU)")
    p.add_argument("--tp-worker", action="store_true", help=argparse.SUPPRESS)  # set on the relaunched workers
    p.set_defaults(func=cmd_run)
