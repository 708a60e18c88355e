"""vLLM's compiled Marlin and Machete ops, found and loaded without importing vLLM.

vLLM's wheel ships its CUDA ops in ``vllm/_C_stable_libtorch.abi3.so``, built against torch's stable C ABI; loading
that file with ``torch.ops.load_library`` registers ``torch.ops._C.marlin_gemm`` and friends without the rest of
vLLM (whose import pulls in a serving engine). ``use_library(path)`` names a copy explicitly (a wheel unpacked
elsewhere); otherwise an installed ``vllm`` package is looked up. A missing library is a reason with the fix,
never an import error. Schemas are those of vLLM 0.33.0 (benchmarks/results/marlin_golden_2026-12-04.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from ..target import Target

INSTALL = ("pip install vllm==0.33.0 (qlinear loads its op library vllm/_C_stable_libtorch.abi3.so without "
           "importing vLLM), or qlinear.kernels.vllm_ops.use_library(PATH) with that file")
LIBRARY_NAMES = ("_C_stable_libtorch.abi3.so",)
#: path -> '' once loaded, or the error it raised (each file is tried once per process)
_tried: dict[str, str] = {}
_NAN_IEEE = 1 << 50  # vLLM ScalarType.id fields: exponent 8 | mantissa 8 | signed 1 | bias 32 | finite 1 | nan 8


def scalar_type_id(bits: int, bias: int) -> int:
    """vLLM's id of the unsigned integer type ``uint{bits}b{bias}`` (bias 0: plain ``uint{bits}``)."""
    return _NAN_IEEE | (bits << 8) | (bias << 17)


def _load(path: Path) -> str:
    key = str(path)
    if key not in _tried:
        try:
            torch.ops.load_library(key)
            _tried[key] = ""
        except Exception as err:  # wrong torch ABI, CPU-only torch, missing CUDA runtime: report it
            _tried[key] = f"{type(err).__name__}: {err}"
    return _tried[key]


def use_library(path: str | Path) -> None:
    """Load vLLM's op library from ``path`` (raise ``RuntimeError`` saying why when it does not load)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"vLLM op library {p}: no such file (expected vllm/_C_stable_libtorch.abi3.so)")
    err = _load(p)
    if err:
        raise RuntimeError(f"vLLM op library {p} did not load: {err}")


def installed_paths() -> list[Path]:
    """The op library files of an installed ``vllm`` package (found without importing it)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(d) / n for d in spec.submodule_search_locations for n in LIBRARY_NAMES if (Path(d) / n).is_file()]


def op_reasons(names: tuple[str, ...], target: Target) -> list[str]:
    """Why ``torch.ops._C.<name>`` for each of ``names`` is unavailable on ``target``; ``[]`` when all are.

    On a live target the installed vLLM library is loaded on first need (a fake target answers from its ``ops``).
    """
    missing = [n for n in names if not target.has_op(f"_C.{n}")]
    if missing and target.ops is None:
        errors = [f"{p}: {e}" for p in installed_paths() if (e := _load(p))]
        missing = [n for n in missing if not target.has_op(f"_C.{n}")]
        if missing and errors:
            return [f"vLLM's op library did not load ({'; '.join(errors)})"]
    if not missing:
        return []
    return [f"vLLM op {', '.join('torch.ops._C.' + n for n in missing)} not loaded: {INSTALL}"]


def call(name: str, **values: object) -> torch.Tensor:
    """Call ``torch.ops._C.<name>`` by argument name in its schema's order: arguments not given take their
    default, optional ones ``None``; versions of vLLM differ in a few (the repack lost its ``perm`` in 0.33)."""
    packet = getattr(torch.ops._C, name)
    args = []
    for a in packet.default._schema.arguments:
        if a.name in values:
            args.append(values[a.name])
        elif a.has_default_value():
            args.append(a.default_value)
        elif isinstance(a.type, torch.OptionalType):
            args.append(None)
        else:
            raise TypeError(f"vLLM op {name}: no value for its argument {a.name!r} ({packet.default._schema})")
    return packet(*args)
