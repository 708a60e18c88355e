"""Every kernel class of the reference is declared, field by field, exactly as the reference's tables say.

The oracle is ``tests/data/reference_tables/*.tsv``, extracted verbatim from the reference page by ``extract.py``
and parsed here with no help from ``src``: a class row with no qlinear class, or any field that differs, fails.
"""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import pytest
import torch

from qlinear.caps import Problem, archs_from
from qlinear.enums import BACKEND, DEVICE, FORMAT, PLATFORM
from qlinear.kernels.base import QuantLinear
from qlinear.kernels.planned import PLANNED
from qlinear.spec import Scheme
from qlinear.target import DeviceInfo, Target

TABLES = Path(__file__).parent / "data" / "reference_tables"
#: written by the lead in qlinear/kernels/torch.py; skipped (only these two) while that module cannot be imported
LEAD_OWNED = ("TorchLinear", "TorchQuantEmbeddings")
DASH = "—"
#: Widenings of the reference that the owning file documents as deliberate: (class, field) -> values added.
#: Anything else that differs from the reference fails.
DELIBERATE = {
    ("TorchFP8Linear", "formats"): frozenset({FORMAT.HF_FP8, FORMAT.FLOAT_QUANTIZED, FORMAT.NAIVE_QUANTIZED}),
    ("TorchLinear", "dtypes"): frozenset({torch.float32}),
    ("TorchQuantEmbeddings", "dtypes"): frozenset({torch.float32}),
    ("AwqTorchLinear", "dtypes"): frozenset({torch.float32}),
    ("GGUFTritonKernel", "bits"): frozenset({8}),  # Q8_0: kernels/planned/gguf.py, TRITON_EXTRA_BITS
}


def read_table(name: str) -> list[dict[str, str]]:
    with open(TABLES / name, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))


BACKEND_ROWS = read_table("backend_classes.tsv")
CONTRACTS = {r["Class"]: r for r in read_table("contracts.tsv")}
OPERANDS = {r["Class"]: r for r in read_table("operands.tsv")}


def class_name(row: dict[str, str]) -> str:
    return row["Class and qlinear source"].split()[0]


ALL_CLASS_NAMES = [class_name(r) for r in BACKEND_ROWS]


# ------------------------------------------------------------------ independent parsers of the reference's cells
def parse_formats(cell: str) -> dict[FORMAT, int]:
    out = {}
    for item in cell.split(","):
        name, prio = item.split(":")
        out[FORMAT[name.strip()]] = int(prio)
    return out


def parse_ints(cell: str) -> frozenset[int] | None:
    return None if cell == DASH else frozenset(int(v) for v in cell.split(","))


def parse_bools(cell: str) -> frozenset[bool] | None:
    return None if cell == DASH else frozenset({"True": True, "False": False}[v.strip()] for v in cell.split(","))


def parse_bool(cell: str) -> bool:
    return {"True": True, "False": False}[cell]


def parse_dtypes(cell: str) -> frozenset[torch.dtype]:
    return frozenset(getattr(torch, v.strip()) for v in cell.split(","))


def parse_devices(cell: str) -> frozenset[DEVICE]:
    if cell == "ALL":
        return frozenset(DEVICE)
    return frozenset(DEVICE[v.strip()] for v in cell.split(","))


def kernel_named(name: str) -> type[QuantLinear]:
    """The class qlinear uses under that name: the implemented one where it exists, else the declared-only one."""
    from qlinear.kernels.registry import all_kernels

    by_name = {k.__name__: k for k in all_kernels()}
    if name not in by_name:
        pytest.fail(f"reference class {name} has no qlinear class")
    return by_name[name]


# ------------------------------------------------------------------ the tables themselves
def test_tables_cover_the_same_classes() -> None:
    assert len(ALL_CLASS_NAMES) == len(set(ALL_CLASS_NAMES)) == 55
    assert set(ALL_CLASS_NAMES) == set(CONTRACTS) == set(OPERANDS)


def test_planned_lists_every_other_class_in_table_order_then_exl3() -> None:
    expected = [n for n in ALL_CLASS_NAMES if n not in LEAD_OWNED] + ["ExllamaV3Linear", "ExllamaV3TorchLinear"]
    assert [k.__name__ for k in PLANNED] == expected


@pytest.mark.parametrize("row", BACKEND_ROWS, ids=class_name)
def test_backend_and_devices(row: dict[str, str]) -> None:
    k = kernel_named(class_name(row))
    assert k.backend is BACKEND[row["BACKEND"]]
    assert k.caps.devices == parse_devices(row["Declared device families"])


@pytest.mark.parametrize("name", list(CONTRACTS))
def test_quantization_contract(name: str) -> None:
    row, caps = CONTRACTS[name], kernel_named(name).caps
    declared = parse_formats(row["Format: AUTO priority"])
    extra = DELIBERATE.get((name, "formats"), frozenset())
    assert {f: p for f, p in caps.formats.items() if f not in extra} == declared
    assert set(caps.formats) - set(declared) == extra
    bits = parse_ints(row["Bits"])
    assert caps.bits == (bits | DELIBERATE[(name, "bits")] if (name, "bits") in DELIBERATE else bits)
    assert caps.group_sizes == parse_ints(row["Group sizes"])
    assert caps.desc_act == parse_bools(row["desc_act"])
    assert caps.sym == parse_bools(row["sym"])
    assert caps.training is parse_bool(row["Training"])


@pytest.mark.parametrize("name", list(OPERANDS))
def test_operands_and_sharding(name: str) -> None:
    row, caps = OPERANDS[name], kernel_named(name).caps
    assert caps.dtypes == parse_dtypes(row["Activation dtypes"]) | DELIBERATE.get((name, "dtypes"), frozenset())
    assert caps.pack_dtypes == parse_dtypes(row["Pack word dtypes"])
    assert caps.in_divisible == int(row["Input divisibility"])
    assert caps.out_divisible == int(row["Output divisibility"])
    assert caps.auto_padding is parse_bool(row["Auto padding"])
    assert caps.sharded_load is parse_bool(row["Sharded load"])


def test_every_backend_is_claimed() -> None:
    from qlinear.kernels.registry import all_kernels

    claimed = {k.backend for k in PLANNED} | {k.backend for k in all_kernels()}
    try:
        torch_mod = importlib.import_module("qlinear.kernels.torch")
        claimed |= {getattr(torch_mod, n).backend for n in LEAD_OWNED}
    except ImportError:
        claimed.add(BACKEND.GPTQ_TORCH)  # the lead's TorchLinear, not importable yet
    assert set(BACKEND) - {BACKEND.AUTO} - claimed == set()


# ------------------------------------------------------------------ declarations from the family sections
ARCHS = {
    "MarlinLinear": archs_from((7, 5)),
    "AwqMarlinLinear": archs_from((8, 0)),
    "MacheteLinear": frozenset({(9, 0)}),
    "AwqMacheteLinear": frozenset({(9, 0)}),
    "SwordfishLinear": frozenset({(10, 0), (10, 3), (11, 0)}),
    "AwqSwordfishLinear": frozenset({(10, 0), (10, 3), (11, 0)}),
    "W4AFP8Linear": archs_from((8, 9)),
    "W4ANVFP4Linear": archs_from((12, 1)),
}


@pytest.mark.parametrize("k", PLANNED, ids=lambda k: k.__name__)
def test_section_declarations(k: type[QuantLinear]) -> None:
    assert k.implemented is False and k.__doc__
    assert k.caps.gpu_archs == ARCHS.get(k.__name__)
    if k.backend is BACKEND.MLX:
        assert set(k.caps.formats.values()) == {0}
        assert k.caps.devices == {DEVICE.MPS} and k.caps.platforms == {PLATFORM.DARWIN}
        assert "mlx" in k.caps.requires_modules
    elif "Swordfish" in k.__name__:
        assert k.caps.platforms == {PLATFORM.LINUX}
    else:
        assert k.caps.platforms == frozenset(PLATFORM)
    if "Triton" in k.__name__:
        assert k.caps.requires_modules.get("triton") == "triton>=3.4"


def test_exl3_declarations() -> None:
    from qlinear.kernels.planned.exllama_bitblas import ExllamaV3Linear, ExllamaV3TorchLinear

    for k in (ExllamaV3Linear, ExllamaV3TorchLinear):
        assert set(k.caps.formats) == {FORMAT.EXL3} and min(k.caps.formats.values()) > 0
        assert k.caps.bits == frozenset(range(1, 9))
        assert k.caps.group_sizes is None and k.caps.desc_act is None and k.caps.sym is None
    assert ExllamaV3Linear.caps.devices == {DEVICE.CUDA, DEVICE.ROCM}
    assert ExllamaV3TorchLinear.caps.devices == frozenset(DEVICE)
    assert ExllamaV3Linear.caps.formats[FORMAT.EXL3] > ExllamaV3TorchLinear.caps.formats[FORMAT.EXL3]


# ------------------------------------------------------------------ runtime reasons beyond Caps
def _named(name: str) -> type[QuantLinear]:
    return {k.__name__: k for k in PLANNED}[name]


def _problem(**scheme: object) -> Problem:
    base: dict[str, object] = dict(bits=4, group_size=128, in_features=4096, out_features=4096)
    base.update(scheme)
    return Problem(Scheme(**base), dtype=torch.bfloat16)  # type: ignore[arg-type]


def test_avx512_needs_the_bf16_flag_on_every_cpu() -> None:
    p = _problem()
    for name in ("TorchCpuAvx512Linear", "TorchCpuAvx512AwqLinear"):
        k = _named(name)
        assert any("avx512_bf16" in r for r in k.runtime_reasons(p, Target.fake_cpu(frozenset({"avx512f"}))))
        assert k.runtime_reasons(p, Target.fake_cpu(frozenset({"avx512f", "avx512_bf16"}))) == []


@pytest.mark.parametrize("name", ["AwqGEMVFastLinear", "LLMAwqLinear", "AwqGEMVLinear"])
def test_gemv_zeros_width_rule_rejects_group_16(name: str) -> None:
    k, t = _named(name), Target.fake_cuda((8, 0))
    fmt = {"AwqGEMVLinear": "gemv", "AwqGEMVFastLinear": "gemv_fast", "LLMAwqLinear": "llm-awq"}[name]
    assert k.runtime_reasons(_problem(method="awq", format=fmt, group_size=16), t)
    for gs in (32, 64, 128, -1):
        assert k.runtime_reasons(_problem(method="awq", format=fmt, group_size=gs), t) == []


def test_swordfish_rejects_zero_point_int8() -> None:
    k = _named("SwordfishLinear")
    reasons = k.runtime_reasons(_problem(bits=8, sym=False), Target.fake_cuda((10, 0)))
    assert any("8-bit with zero points" in r for r in reasons)


def test_retired_int8_awq_reports_its_migration() -> None:
    k = _named("TorchInt8AwqLinear")
    reasons = k.reasons(_problem(method="awq", format="gemm"), Target.fake_cpu())
    assert len(reasons) == 1 and "AwqTorchLinear" in reasons[0] and "awq_torch_aten" in reasons[0]


def test_planned_kernels_say_not_implemented_and_machete_needs_exact_sm90() -> None:
    k = _named("MacheteLinear")
    reasons = k.reasons(_problem(format="gptq"), Target((DeviceInfo(DEVICE.CUDA, 0, (10, 0)),)))
    assert "not implemented yet" in reasons and any("sm_100" in r for r in reasons)
    assert not any("sm_" in r for r in k.reasons(_problem(format="gptq"), Target.fake_cuda((9, 0))))
