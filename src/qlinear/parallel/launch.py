"""``qlinear run --tp N``: relaunch through torchrun (``torch.distributed.run``) with N processes; in each, join the
process group (NCCL for CUDA devices, gloo for the CPU) and cut the model by the llama plan.

torchrun is the launcher people already use: it sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR for
``init_process_group``'s default ``env://`` rendezvous, so nothing here is a transport of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def torchrun_command(nproc: int, module_args: Sequence[str]) -> list[str]:
    """The command that runs ``python -m qlinear.cli <module_args>`` in ``nproc`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "qlinear.cli", *module_args]


def relaunch(nproc: int, module_args: Sequence[str]) -> int:
    """Run the worker processes and wait for them; their exit status (the first failure's) is returned."""
    return subprocess.run(torchrun_command(nproc, module_args), check=False).returncode


def join_process_group(backend: str, **kwargs: Any) -> None:
    """``dist.init_process_group(backend, **kwargs)``, after importing ``torch.distributed.nn``.

    That module's functions take ``group=group.WORLD`` defaults, evaluated when it is first imported. Imported after
    the group exists (transformers imports it while loading a model), it holds the default group for good:
    ``destroy_process_group`` then cannot free it, gloo's worker threads run on into interpreter exit, and one that
    releases a finished collective's tensor there aborts the process ("terminate called without an active
    exception", SIGABRT) now and then. Imported first, the defaults are ``None`` and the group is freed on destroy.
    """
    import torch.distributed.nn  # noqa: F401  (for its import-time defaults, see above)

    dist.init_process_group(backend, **kwargs)


def init_rank(device: str, tp: int) -> tuple[int, str]:
    """Join the process group torchrun describes; returns (rank, this rank's device: ``cuda:<local rank>`` for a
    CUDA device). Refuses a world size other than ``tp``."""
    kind = torch.device(device).type
    local = int(os.environ.get("LOCAL_RANK", "0"))  # set by torchrun for every worker
    if kind == "cuda":
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        join_process_group("nccl" if kind == "cuda" else "gloo")
    if dist.get_world_size() != tp:
        raise ValueError(f"--tp {tp}: the process group has {dist.get_world_size()} processes")
    return dist.get_rank(), device
