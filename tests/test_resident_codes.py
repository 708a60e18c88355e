"""CPU int4 layers keep the codes once: ``qweight`` is dropped when the runtime is built (``resident_codes.py``).

What is checked against what:

* the words read back after a forward (``layer.qweight``, ``state_dict()``) against the checkpoint tensors the layer
  was loaded with, word for word (GPTQ v1 and v2, act-order ``g_idx``, asymmetric zeros; AWQ GEMM), and their
  float64 decode by the numpy oracle against the weight;
* resident bytes: the layer's buffers plus its runtime, against the codes held twice before;
* writes after the drop (``load_state_dict``, ``load_affine``, a scale changed in place) reach the next forward;
* a runtime whose bytes cannot be read back (the op's private layout) keeps ``qweight``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from qlinear import Target, create_layer, quantize_rtn
from qlinear.kernels import cpu_int4, int4pack_runtime
from tests.oracle import awq_numpy, gptq_numpy

HERE = Target.here("cpu")
CASES = [("gptq_v2", cpu_int4.TorchAtenLinear, False, False), ("gptq", cpu_int4.TorchAtenLinear, False, True),
         ("gptq_v2", cpu_int4.TorchCpuAvx512Linear, True, False), ("gemm", cpu_int4.TorchAtenAwqLinear, False, False)]
N, K = 96, 256


def weight(seed: int) -> torch.Tensor:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(seed)) * 0.02
    w[:, ::8] = -0.05  # zero points above 0 (GPTQ v1 cannot hold z = 0)
    return w


def layer_of(fmt: str, cls: type, desc_act: bool, sym: bool, seed: int = 0) -> tuple[object, dict]:
    if cls.target_reasons(HERE):
        pytest.skip(f"{cls.__name__} cannot run here: {cls.target_reasons(HERE)}")
    q = quantize_rtn(weight(seed), bits=4, group_size=64, sym=sym, desc_act=desc_act)
    lay = create_layer(q, format=fmt, backend=cls.backend, dtype=torch.bfloat16, bias=torch.randn(N) * 0.1)
    assert type(lay) is cls
    return lay, {k: v.clone() for k, v in lay.state_dict().items()}


def oracle_weight(fmt: str, sd: dict) -> np.ndarray:
    t = {k: (v.float() if v.dtype == torch.bfloat16 else v).numpy() for k, v in sd.items() if k != "bias"}
    if fmt == "gemm":
        return awq_numpy.dequantize("gemm", t, 4, K, N, 64)
    return gptq_numpy.dequantize_checkpoint(t, 4, K, N, fmt)


def forward(lay: object, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(3, K, generator=torch.Generator().manual_seed(seed)).bfloat16()
    with torch.no_grad():
        return x, lay(x)


def close(y: torch.Tensor, x: torch.Tensor, w: np.ndarray, bias: torch.Tensor) -> bool:
    ref = x.double().numpy() @ w.T + bias.double().numpy()
    return float(np.abs(y.double().numpy() - ref).max()) <= 1.5e-2 * float(np.abs(ref).max())


@pytest.mark.parametrize(("fmt", "cls", "desc_act", "sym"), CASES)
def test_words_dropped_and_read_back_word_for_word(fmt: str, cls: type, desc_act: bool, sym: bool) -> None:
    lay, file = layer_of(fmt, cls, desc_act, sym)
    x, y = forward(lay)
    assert lay.codes_replaced and "qweight" not in dict(lay.named_buffers())
    assert torch.equal(lay.qweight, file["qweight"])
    sd = lay.state_dict()
    assert sd.keys() == file.keys() and all(torch.equal(sd[k], v) for k, v in file.items())
    assert lay.codes_replaced  # saving rebuilt a transient copy only
    w = oracle_weight(fmt, sd)
    assert close(y, x, w, file["bias"])
    np.testing.assert_array_equal(lay.dequantize(torch.float64).numpy(), w)


def test_resident_bytes_hold_the_codes_once() -> None:
    lay, file = layer_of("gptq_v2", cpu_int4.TorchAtenLinear, False, False)
    forward(lay)
    kept = sum(b.numel() * b.element_size() for b in lay.buffers())
    runtime = sum(t.numel() * t.element_size() for t in lay._rt.tensors())
    codes = N * K // 2
    assert kept < codes // 4  # scales, zeros, g_idx, bias: no words
    padded = lay._rt.n_pad * lay._rt.k_pad // 2  # N padded to the kernels' block of 64
    assert padded <= runtime < padded * 1.2  # the codes once, plus bf16 scale/offset pairs
    assert file["qweight"].numel() * 4 == codes  # what was kept beside the runtime before


def test_writes_after_the_drop_reach_the_next_forward() -> None:
    lay, _ = layer_of("gptq_v2", cpu_int4.TorchAtenLinear, False, False)
    forward(lay)
    _, file2 = layer_of("gptq_v2", cpu_int4.TorchAtenLinear, False, False, seed=5)
    lay.load_state_dict(file2)
    assert not lay.codes_replaced and torch.equal(lay.qweight, file2["qweight"])
    x, y = forward(lay)
    assert lay.codes_replaced and close(y, x, oracle_weight("gptq_v2", file2), file2["bias"])

    with torch.no_grad():
        lay.scales.mul_(2)  # in place: the runtime is rebuilt from the read-back words and the new scales
    x, y = forward(lay, 2)
    doubled = dict(file2, scales=file2["scales"] * 2)
    assert close(y, x, oracle_weight("gptq_v2", doubled), file2["bias"])
    assert torch.equal(lay.qweight, file2["qweight"])

    q = quantize_rtn(weight(9), bits=4, group_size=64, sym=False)
    lay.load_affine(q)
    x, y = forward(lay, 3)
    assert close(y, x, q.dequantize(torch.float64).numpy(), file2["bias"])
    twin = copy.deepcopy(lay)
    assert torch.equal(twin.qweight, lay.qweight) and torch.equal(twin(x), y)


def test_a_runtime_that_cannot_be_read_back_keeps_the_words(monkeypatch: pytest.MonkeyPatch) -> None:
    lay, file = layer_of("gptq_v2", cpu_int4.TorchAtenLinear, False, False)
    if not lay._rt.op:
        pytest.skip("the int4pack op is missing here: the runtime is always in readable blocks")
    monkeypatch.setattr(int4pack_runtime, "BLOCKS", ())  # the op's bytes match no block layout: block 0
    lay.prepare()
    assert lay._rt.block == 0 and not lay.codes_replaced
    assert torch.equal(lay.qweight, file["qweight"]) and "qweight" in dict(lay.named_buffers())
