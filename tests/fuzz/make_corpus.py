"""Write the fuzz seed corpus (``tests/fuzz/corpus``): small valid inputs for every reader.

- ``checkpoint/<fixture>/``: one quantized module of a producer-made fixture (GPTQModel, AutoAWQ, llm-compressor,
  transformers + bitsandbytes), its tensors copied byte for byte into a one-module safetensors file, with the
  fixture's own config files. Small seeds keep each fuzz input cheap to load.
- ``gguf/*.gguf``: files written by gguf-py's ``GGUFWriter`` (llama.cpp's writer) with Q4_0, Q4_1, Q8_0 and F16
  tensors, string and array metadata.

    .venv/bin/python tests/fuzz/make_corpus.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"
CORPUS = HERE / "corpus"
SEEDS = ("gptq_4bit_g32", "gptq_4bit_g32_desc_act", "awq_gemm_4bit_g32", "ct_w4a16_g32", "ct_nvfp4", "bnb_nf4",
         "qqq_4bit_g128", "ct_fp8_block")
CONFIGS = ("config.json", "quantize_config.json")


def one_module(fixture: str) -> None:
    from qlinear.checkpoint.plan import plan_checkpoint
    from qlinear.checkpoint.safetensors_io import read_tensor, write_file

    plan = plan_checkpoint(FIXTURES / fixture)
    mod = next(iter(plan.modules.values()))
    out = CORPUS / "checkpoint" / fixture
    out.mkdir(parents=True, exist_ok=True)
    tensors = {f"{mod.name}.{leaf}": read_tensor(info) for leaf, info in mod.tensors.items()}
    write_file(out / "model.safetensors", tensors)
    for name in CONFIGS:
        if (FIXTURES / fixture / name).is_file():
            shutil.copy2(FIXTURES / fixture / name, out / name)


def gguf_files() -> None:
    import gguf

    out = CORPUS / "gguf"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for qtype in (gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1,
                  gguf.GGMLQuantizationType.F16):
        path = out / f"{qtype.name.lower()}.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_string("general.name", "fuzz-seed")
        w.add_uint32("llama.block_count", 1)
        w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "bc"])
        w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.5])
        for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
            data = rng.standard_normal((4, 256)).astype(np.float32)
            raw = gguf.quants.quantize(data, qtype)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    for fixture in SEEDS:
        one_module(fixture)
    gguf_files()
    print("\n".join(str(p.relative_to(HERE)) for p in sorted(CORPUS.rglob("*")) if p.is_file()))
