"""Load a checkpoint's quantized modules as ready qlinear layers (and GGUF files through their reader).

Each module goes through the selector on its own (shapes differ, so kernels may too), its checkpoint
tensors are loaded into the kernel's buffers with strict key checking, then ``prepare()`` runs.
Nothing from the checkpoint is executed: only safetensors headers and raw bytes are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from ..enums import BACKEND, FORMAT
from ..kernels.base import QuantLinear
from ..select import NoKernelError
from ..spec import Scheme
from ..target import Target
from .plan import CheckpointPlan, ModulePlan, plan_checkpoint
from .repack import choose, repack_tensors
from .safetensors_io import CheckpointError, read_tensor


def build_layer(name: str, scheme: Scheme, tensors: Mapping[str, torch.Tensor], target: Target,
                dtype: torch.dtype = torch.float16, backend: BACKEND | str = BACKEND.AUTO) -> QuantLinear:
    """A prepared layer for one module's checkpoint tensors (names as in the checkpoint, without the prefix).

    A stored layout no kernel here runs (AWQ gemv on a CPU) is re-encoded losslessly first (``repack``).
    """
    try:
        choice, run_as = choose(scheme, dtype, target, backend)
        state = repack_tensors(tensors, scheme, run_as)
    except NoKernelError as err:
        raise CheckpointError(f"{name}: {err}") from err
    except ValueError as err:
        raise CheckpointError(f"{name}: {err}") from None
    scheme = run_as
    layer = choice.kernel(scheme, bias="bias" in tensors, dtype=dtype)
    if "bias" in state:
        want = state["scales"].dtype if scheme.format in (FORMAT.GEMM, FORMAT.MLX) else layer.bias.dtype
        cast = state["bias"].to(want)
        if not torch.equal(cast.double(), state["bias"].double()):
            raise CheckpointError(f"{name}.bias: {state['bias'].dtype} values are not exactly representable in "
                                  f"{want}, the dtype this layout keeps its bias in")
        state["bias"] = cast
    try:
        layer.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"{name}: {err}") from None
    layer = layer.to(target.devices[0].torch_device)
    try:
        layer.prepare()
    except ValueError as err:  # content a kernel cannot take that its declaration could not see (e.g. g_idx)
        raise CheckpointError(f"{name}: {choice.kernel.__name__} ({choice.backend.value}) cannot prepare this "
                              f"module: {err}; name another backend") from None
    layer.choice = choice
    return layer


def read_module(mp: ModulePlan) -> tuple[dict[str, torch.Tensor], Scheme]:
    """A module's checkpoint tensors (exactly as stored) and its scheme."""
    return {leaf: read_tensor(info) for leaf, info in mp.tensors.items()}, mp.scheme


def load_plan(plan: CheckpointPlan, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
              backend: BACKEND | str = BACKEND.AUTO) -> dict[str, QuantLinear]:
    """Build every quantized module of an already checked plan."""
    target = Target.here(device)
    layers = {}
    for name, mp in plan.modules.items():
        tensors, scheme = read_module(mp)
        layers[name] = build_layer(name, scheme, tensors, target, dtype, backend)
    return layers


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
                    backend: BACKEND | str = BACKEND.AUTO,
                    affine_runtime: bool | None = None) -> dict[str, QuantLinear]:
    """Every quantized module of a checkpoint, by its name in the checkpoint, as a prepared layer.

    ``path``: a Hugging Face style directory (config.json and/or quantize_config.json plus one
    ``*.safetensors`` file or shards with ``model.safetensors.index.json``), a single ``.safetensors``
    file (config read from its directory) or a ``.gguf`` file. ``dtype`` is the activation dtype the
    kernels are chosen for. Raises ``CheckpointError`` (a ``ValueError``) naming the file, module and
    tensor for anything that does not fit; pickle files (.bin, .pt) are refused, never unpickled.
    ``affine_runtime`` (GGUF files only): see ``GGUFFile.linear``.
    """
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return load_gguf(path, device=device, dtype=dtype, backend=backend, affine_runtime=affine_runtime)
    if affine_runtime:
        raise ValueError(f"{path}: affine_runtime applies to .gguf files (GGUF blocks on the GPU), not to this "
                         "checkpoint; GPTQ/AWQ layers already run in their own runtime layout")
    return load_plan(plan_checkpoint(path), device, dtype, backend)


def load_gguf(path: Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16,
              backend: BACKEND | str = BACKEND.AUTO,
                    affine_runtime: bool | None = None) -> dict[str, QuantLinear]:
    """GGUF files through ``qlinear.gguf_file`` (needs the ``gguf`` package: ``pip install 'qlinear[gguf]'``)."""
    from .gguf import load_gguf_layers

    return load_gguf_layers(path, device=device, dtype=dtype, backend=backend, affine_runtime=affine_runtime)
