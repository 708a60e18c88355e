"""What a checkpoint holds and which kernel would run each module here, from headers alone (no tensor data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..enums import BACKEND
from ..select import Choice, NoKernelError
from ..spec import Scheme
from ..target import Target
from .plan import plan_checkpoint
from .repack import choose


def why(choice: Choice) -> str:
    """One line: why the selector picked this kernel, naming the better-ranked ones it passed over."""
    if choice.kernel is None:
        tried = [v for v in choice.verdicts if v.priority]
        first = "; ".join(f"{v.kernel.backend.value}: {v.reasons[0]}" for v in tried[:3])
        return f"no kernel can run it here ({first}{'; ...' if len(tried) > 3 else ''})"
    chosen = next(v for v in choice.verdicts if v.kernel is choice.kernel)
    if choice.requested is not BACKEND.AUTO:
        return f"requested backend {choice.requested.value}"
    ahead = [v for v in choice.verdicts[:choice.verdicts.index(chosen)]
             if v.priority and "not implemented yet" not in v.reasons]
    line = f"highest AUTO priority ({chosen.priority}) that can run it here"
    if ahead:
        skipped = ", ".join(f"{v.kernel.backend.value} ({v.reasons[0]})" for v in ahead[:2])
        line += f"; passed over {skipped}{', ...' if len(ahead) > 2 else ''}"
    if choice.note:
        line += f"; {choice.note}"
    return line


def inspect_checkpoint(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
                       backend: BACKEND | str = BACKEND.AUTO) -> dict[str, Any]:
    """Every quantized module: format, bits, group size, shape, and the kernel the selector picks here (and why)."""
    target = Target.here(device)
    if Path(path).suffix.lower() == ".gguf":
        return _inspect_gguf(Path(path), target, dtype, backend)
    plan = plan_checkpoint(path)
    modules = [_row(name, mp.scheme, mp.has_bias, target, dtype, backend) for name, mp in plan.modules.items()]
    return {"path": str(path), "config_source": plan.config_source, "target": str(target),
            "dtype": str(dtype).removeprefix("torch."), "files": [f.name for f in plan.files],
            "other_tensors": len(plan.other), "modules": modules}


def _inspect_gguf(path: Path, target: Target, dtype: torch.dtype, backend: BACKEND | str) -> dict[str, Any]:
    from ..gguf_file import read_gguf
    from .gguf import FLOAT_TYPES

    f = read_gguf(path)
    weights = {n: t for n, t in f.layers().items() if t.type not in FLOAT_TYPES}
    modules = [{**_row(n, t.scheme(), f"{n}.bias" in f.tensors, target, dtype, backend), "qtype": t.type.name}
               for n, t in weights.items()]
    return {"path": str(path), "config_source": f"GGUF metadata (architecture {f.architecture})",
            "target": str(target), "dtype": str(dtype).removeprefix("torch."), "files": [path.name],
            "other_tensors": len(f.tensors) - len(weights) - sum(f"{n}.bias" in f.tensors for n in weights),
            "modules": modules}


def _row(name: str, s: Scheme, bias: bool, target: Target, dtype: torch.dtype,
         backend: BACKEND | str) -> dict[str, Any]:
    try:
        choice, run_as = choose(s, dtype, target, backend)
    except NoKernelError as err:
        choice, run_as = err.choice, s
    return {
        "module": name, "method": s.method.value, "format": s.format.value, "bits": s.bits,
        "group_size": -1 if s.channelwise else s.group_size, "sym": s.sym, "desc_act": s.desc_act,
        "pack_dtype": str(s.pack_dtype).removeprefix("torch."), "in_features": s.in_features,
        "out_features": s.out_features, "bias": bias,
        "element": None if s.element is None else s.element.value, "scale_block": s.scale_block,
        "activations": None if s.activations is None else s.activations.describe(),
        "backend": None if choice.kernel is None else choice.kernel.backend.value,
        "kernel": None if choice.kernel is None else choice.kernel.__name__, "why": why(choice),
        "runs_as": run_as.format.value,
    }
