"""Float-quantized layers on the GPU end to end: TritonFP8Linear / TritonFP4Linear built by the selector, checked
against the exact TorchFP8Linear / TorchFP4Linear on the CPU (float32), and the llm-compressor fixtures run
through ``from_pretrained`` on CUDA against the tool's own logits.

    python3 benchmarks/gpu_float_check.py --out benchmarks/results/h200-gpu_float_check-<date>.md

Error metric: ``|y - ref| / |ref|`` (Frobenius). Weight-only layers are held to the activation dtype's rounding
(float16 4e-3, bfloat16 1.6e-2); W8A8 layers to 3e-2 (the GPU quantizes activations as vLLM does, with a float32
scale, where the CPU reference follows compressed-tensors' activation-dtype arithmetic).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TOL = {torch.float16: 4e-3, torch.bfloat16: 1.6e-2}
W8A8_TOL = 3e-2
MS = (1, 5, 33, 300, 1100)


def cases():
    from qlinear.activations import ActQuant
    from qlinear.float_quant import quantize_fp8, quantize_mxfp4, quantize_nvfp4

    token = ActQuant(bits=8, element="float8_e4m3fn", strategy="token", scales="dynamic")
    return [  # name, maker, format, activations
        ("fp8 channel (naive)", lambda w: quantize_fp8(w), None, None),
        ("fp8 128x128 blocks (hf_fp8)", lambda w: quantize_fp8(w, block=(128, 128)), "hf_fp8", None),
        ("fp8 tensor bf16 scale", lambda w: quantize_fp8(w, block=tuple(w.shape), scale_dtype=torch.bfloat16),
         "float-quantized", None),
        ("fp8 e5m2 group 64", lambda w: quantize_fp8(w, element="e5m2", block=(1, 64)), None, None),
        ("fp8 GPTQModel divide", lambda w: quantize_fp8(w, rule="divide"), "fp8", None),
        ("fp8 W8A8 per-token", lambda w: quantize_fp8(w), "float-quantized", token),
        ("fp8 W8A8 blocks", lambda w: quantize_fp8(w, block=(128, 128)), "float-quantized", token),
        ("nvfp4", quantize_nvfp4, None, None),
        ("mxfp4", quantize_mxfp4, None, None),
    ]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


def check_layers(lines: list[str]) -> int:
    from qlinear.build import create_float_layer

    failed = 0
    lines += ["| case | K x N | dtype | kernel | " + " | ".join(f"M={m}" for m in MS) + " |",
              "|---|---|---|---|" + "---|" * len(MS)]
    for name, make, fmt, act in cases():
        for k, n in ((4096, 1000), (1536, 4096)):
            g = torch.Generator().manual_seed(k + n)
            fw = make(torch.randn(n, k, generator=g) * 0.02)
            bias = torch.randn(n, generator=g).to(torch.bfloat16)
            ref = create_float_layer(fw, format=fmt, dtype=torch.float32, bias=bias, activations=act)
            for dtype in (torch.bfloat16, torch.float16):
                gpu = create_float_layer(fw, format=fmt, device="cuda", dtype=dtype, bias=bias, activations=act)
                cells = []
                for m in MS:
                    x = torch.randn(m, k, generator=g)
                    want = ref(x.to(dtype).float())
                    got = gpu(x.to(dtype).cuda()).float().cpu()
                    err = rel(got, want)
                    ok = err < (W8A8_TOL if act is not None else TOL[dtype])
                    failed += not ok
                    cells.append(f"{err:.1e}" + ("" if ok else " FAIL"))
                lines.append(f"| {name} | {k}x{n} | {str(dtype)[6:]} | {type(gpu).__name__} | {' | '.join(cells)} |")
                print(lines[-1], flush=True)
    return failed


def check_fixtures(lines: list[str]) -> int:
    from safetensors.torch import load_file

    from qlinear.hf_model import backend_summary, from_pretrained

    failed = 0
    lines += ["", "| fixture | |logits - tool's| / |tool's| | kernels |", "|---|---|---|"]
    for path in sorted((ROOT / "tests" / "fixtures").glob("ct_*")):
        ref = load_file(str(path / "reference" / "tool_outputs.safetensors"))
        try:
            model = from_pretrained(path, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                logits = model(ref["input_ids"].cuda()).logits.float().cpu()
            err = rel(logits, ref["logits"])
            kinds = sorted({line.split("x ")[-1].strip() for line in backend_summary(model)})
            ok = err < 4e-2
        except Exception as exc:
            err, kinds, ok = float("nan"), [f"{type(exc).__name__}: {exc}"[:200]], False
        failed += not ok
        lines.append(f"| {path.name} | {err:.1e}{'' if ok else ' FAIL'} | {'; '.join(kinds)} |")
        print(lines[-1], flush=True)
    return failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    lines = [f"# Float layers on {torch.cuda.get_device_name()} (torch {torch.__version__})", ""]
    failed = check_layers(lines) + check_fixtures(lines)
    lines.append(f"\n{failed} failed")
    print(lines[-1])
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
