"""``qlinear run`` end to end on a real GPTQModel checkpoint (tests/fixtures/gptq_4bit_g32, a tiny llama).

The reference is built without qlinear: transformers' llama from the fixture's config.json, its float
tensors read with the ``safetensors`` package, and every quantized linear set to GPTQModel's own dequantized
weight (``reference/tool_outputs.safetensors``); greedy generation there must print the same text.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qlinear.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "gptq_4bit_g32"
PROMPT = "t5 t9 t13 t40"
NEW = 6

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers: pip install 'qlinear[hf]'")


def reference_generation() -> tuple[str, float]:
    """The text greedy decoding prints with the tool's weights, and the smallest top-1 logit margin on the way."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    cfg = json.loads((FIXTURE / "config.json").read_text())
    cfg.pop("quantization_config")
    model = LlamaForCausalLM(LlamaConfig(**cfg)).float().eval()
    state = {k: v.float() for k, v in load_file(FIXTURE / "model.safetensors").items()
             if not k.endswith(("qweight", "qzeros", "scales", "g_idx"))}
    state |= {k: v.float() for k, v in load_file(FIXTURE / "reference" / "tool_outputs.safetensors").items()
              if k.endswith(".weight")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if cfg.get("tie_word_embeddings"):
        model.tie_weights()
    tok = AutoTokenizer.from_pretrained(str(FIXTURE))
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=tok.eos_token_id,
                             output_logits=True, return_dict_in_generate=True)
    margin = min(float(torch.topk(step[0], 2).values.diff().abs()) for step in out.logits)
    return tok.decode(out.sequences[0], skip_special_tokens=True), margin


def test_run_prints_the_greedy_text_tokens_per_second_and_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(FIXTURE), "--prompt", PROMPT, "--max-new-tokens", str(NEW)]) == 0
    lines = capsys.readouterr().out.splitlines()
    expected, margin = reference_generation()
    # GPTQModel rounds its weights to float16 (relative 2**-11); ours are exact: logits move far less than this.
    assert margin > 1e-3, f"reference top-1 margin {margin:.2e} too small for a fair comparison"
    assert lines[0] == expected
    m = re.fullmatch(r"(\d+) tokens in ([\d.]+) s: ([\d.]+) tokens/s", lines[2])
    assert m and 1 <= int(m.group(1)) <= NEW and float(m.group(3)) > 0, lines[2]
    summary = lines[3:]
    assert sum(int(re.search(r"(\d+) x", ln).group(1)) for ln in summary) == 14  # 2 layers x 7 linears
    assert all("(gptq)" in ln for ln in summary)


def test_run_refuses_a_pickle_only_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text((FIXTURE / "config.json").read_text())
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not unpickled")
    assert main(["run", str(tmp_path), "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qlinear: error: ") and "pytorch_model.bin" in err and "pickle" in err, err
