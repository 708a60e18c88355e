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

import torch
import torch.distributed as dist


def torchrun_command(nproc: int, module_args: Sequence[str]) -> list[str]:
    """The command that runs ``python -m qlinear.cli <module_args>`` in ``nproc`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "qlinear.cli", *module_args]


def relaunch(nproc: int, module_args: Sequence[str]) -> int:
    """Run the worker processes and wait for them; their exit status (the first failure's) is returned."""
    return subprocess.run(torchrun_command(nproc, module_args), check=False).returncode


def init_rank(device: str, tp: int) -> tuple[int, str]:
    """Join the process group torchrun describes; returns (rank, this rank's device: ``cuda:<local rank>`` for a
    CUDA device). Refuses a world size other than ``tp``."""
    kind = torch.device(device).type
    local = int(os.environ.get("LOCAL_RANK", "0"))  # set by torchrun for every worker
    if kind == "cuda":
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if kind == "cuda" else "gloo")
    if dist.get_world_size() != tp:
        raise ValueError(f"--tp {tp}: the process group has {dist.get_world_size()} processes")
    return dist.get_rank(), device
