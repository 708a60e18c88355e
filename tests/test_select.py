"""The selector: golden explain tables, AUTO vs explicit, every device ordinal checked, clear failures."""

from __future__ import annotations

import pytest
import torch

from qlinear import BACKEND, FORMAT, NoKernelError, Problem, Scheme, Target, explain, select
from qlinear.enums import DEVICE
from qlinear.target import DeviceError, DeviceInfo


def problem(fmt: str = "gptq_v2", bits: int = 4, group_size: int = 128, k: int = 4096, n: int = 11008,
            sym: bool = True, desc_act: bool = False, dtype: torch.dtype = torch.bfloat16, **kw) -> Problem:
    return Problem(Scheme(bits=bits, group_size=group_size, in_features=k, out_features=n, sym=sym,
                          desc_act=desc_act, format=FORMAT(fmt), **kw), dtype)


def test_golden_fake_sm90(golden) -> None:
    target = Target.fake_cuda((9, 0), name="H100-like", modules={"triton": True})
    golden("explain_fake_sm90.txt", explain(problem(), target).explain())


def test_golden_fake_cpu_without_extras(golden) -> None:
    golden("explain_fake_cpu.txt", explain(problem(), Target.fake_cpu()).explain())


def test_golden_this_machine(golden, monkeypatch: pytest.MonkeyPatch) -> None:
    from qlinear.kernels import cpu_int4, native_int4

    monkeypatch.setattr(native_int4, "_MODULE", False)  # the "runs:" line as without the optional native extra
    monkeypatch.setattr(cpu_int4, "_NATIVE", False)
    golden("explain_this_machine.txt", explain(problem(), Target.here("cpu")).explain())


def test_auto_picks_torch_on_plain_cpu_and_lists_every_candidate() -> None:
    choice = select(problem(), Target.fake_cpu())
    assert choice.kernel.__name__ == "TorchLinear"
    names = [v.kernel.__name__ for v in choice.verdicts]
    assert "TorchQuantEmbeddings" in names and "MarlinLinear" in names
    prios = [v.priority for v in choice.verdicts]
    assert prios == sorted(prios, reverse=True)
    emb = next(v for v in choice.verdicts if v.kernel.__name__ == "TorchQuantEmbeddings")
    assert "excluded from selection" in emb.reasons[0]


def test_priority_zero_is_explicit_only() -> None:
    choice = explain(problem(bits=8), Target.fake_cpu())
    int8 = next(v for v in choice.verdicts if v.kernel.__name__ == "TorchInt8Linear")
    assert int8.priority == 0 and int8.reasons[0].startswith("explicit only")


def test_explicit_backend_validates_and_raises_with_table() -> None:
    with pytest.raises(NoKernelError) as info:
        select(problem(), Target.fake_cpu(), BACKEND.GPTQ_MARLIN)
    text = str(info.value)
    assert "MarlinLinear" in text and "device cpu not supported" in text and "chosen: none" in text
    assert select(problem(), Target.fake_cpu(), "gptq_torch").kernel.__name__ == "TorchLinear"


def test_every_gpu_ordinal_is_checked() -> None:
    mixed = Target((DeviceInfo(DEVICE.CUDA, 0, (9, 0), "a"), DeviceInfo(DEVICE.CUDA, 1, (7, 0), "b")),
                   modules={"triton": True})
    choice = explain(problem(), mixed, BACKEND.GPTQ_MARLIN)
    reasons = " ".join(choice.verdicts[0].reasons)
    assert "cuda:1 (sm_70): sm_70 not among declared GPU architectures" in reasons
    assert "cuda:0" not in reasons


def test_reasons_name_each_mismatch() -> None:
    choice = explain(problem(bits=3, group_size=16, sym=False, desc_act=True, dtype=torch.float32), Target.fake_cpu())
    aten = next(v for v in choice.verdicts if v.kernel.__name__ == "TorchAtenLinear")
    text = "; ".join(aten.reasons)
    for expected in ("3-bit not supported", "group size 16 not supported", "activation dtype float32 not supported",
                     "lacks torch.ops.aten._weight_int4pack_mm_for_cpu"):
        assert expected in text


def test_planar_needs_multiples_of_32() -> None:
    with pytest.raises(NoKernelError, match="in_features 100 not a multiple of 32"):
        select(problem("gptq_p", bits=5, group_size=-1, k=100, n=64), Target.fake_cpu())


def test_device_that_does_not_exist_is_an_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(DeviceError, match="sees no CUDA device"):
        Target.here("cuda:3")
    with pytest.raises(DeviceError, match="cannot parse device"):
        Target.here("gpu0")


def test_auto_keeps_float32_layers_on_exact_kernels() -> None:
    here = Target.here("cpu")
    choice = explain(problem(dtype=torch.float32), here)
    fused = next(v for v in choice.verdicts if v.kernel.__name__ == "TorchFusedLinear")
    assert any("computes in bfloat16" in r for r in fused.reasons)
    assert choice.kernel.__name__ in ("TorchLinear",)
    explicit = explain(problem(dtype=torch.float32), here, BACKEND.GPTQ_TORCH_FUSED)
    assert all("computes in bfloat16" not in r for r in explicit.verdicts[0].reasons)
