"""Data-parallel training on PyTorch's own engine: ``torchrun`` + ``torch.distributed``.

What the training loop (``aiayn.train``) needs from the process group, in one place:

- ``World``: this process's ``rank`` / ``world_size`` / ``local_rank``, read from the
  variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``);
- ``init_process_group``: NCCL on CUDA, gloo on CPU;
- ``agree``: one all-reduce per step so every rank stops at the same update (a
  signal or the clock seen by one rank stops all of them; otherwise the others would
  wait forever in the next gradient all-reduce);
- ``torchrun_command``: the launcher line the ``train`` stage runs when
  ``train.nproc_per_node > 1`` (single node, ``--standalone``). Several nodes: run
  ``torchrun --nnodes N --nproc_per_node G --rdzv_backend c10d --rdzv_endpoint host:port
  -m aiayn.stages.train_worker ROOT PARAMS_JSON`` on each node yourself.

The data-order contract (world-size invariance) lives in ``aiayn.train``: every
rank walks the same global batch sequence and takes its shard of each update.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

__all__ = ["World", "world_from_env", "init_process_group", "agree", "all_reduce_sum", "barrier", "torchrun_command"]


@dataclass(frozen=True)
class World:
    """Where this process sits in the job. ``World()`` is the single-process job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """True on rank 0: the rank that validates, checkpoints and reports."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def world_from_env(env: dict[str, str] | None = None) -> World:
    """``World`` from ``torchrun``'s variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); ``World()`` without them.

    Raises ``ValueError`` on inconsistent values (e.g. ``RANK >= WORLD_SIZE``).
    """
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return World()
    world = World(rank=int(env.get("RANK", 0)), world_size=int(env["WORLD_SIZE"]),
                  local_rank=int(env.get("LOCAL_RANK", 0)))
    if not (0 <= world.rank < world.world_size) or world.local_rank < 0:
        raise ValueError(f"inconsistent torchrun environment: {world}")
    return world


def init_process_group(world: World, device: torch.device) -> str:
    """Join the process group (``env://`` rendezvous set up by torchrun); returns the backend.

    NCCL when ``device`` is CUDA (and sets this process's CUDA device to ``local_rank``),
    gloo on CPU. A no-op returning ``"none"`` for a single-process ``World``.
    """
    if not world.distributed:
        return "none"
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=world.rank, world_size=world.world_size)
    return backend


def agree(world: World, *flags: bool) -> tuple[bool, ...]:
    """Each flag, true on every rank when it is true on ANY rank (one all-reduce MAX for all of them)."""
    if not world.distributed:
        return tuple(bool(f) for f in flags)
    import torch.distributed as dist

    t = torch.tensor([int(f) for f in flags], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in t.tolist())


def all_reduce_sum(world: World, values: list[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64; identity on one process)."""
    if not world.distributed:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def barrier(world: World) -> None:
    """Wait for every rank (no-op on one process)."""
    if world.distributed:
        import torch.distributed as dist

        dist.barrier()


def _comm_device() -> torch.device:
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def torchrun_command(nproc_per_node: int, module: str, *args: str) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node N -m MODULE ARGS...`` (torchrun, one node).

    Uses this interpreter (``sys.executable``), so the launcher works from a venv without
    ``torchrun`` on ``PATH``. Raises ``ValueError`` if ``nproc_per_node < 1``.
    """
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
            "-m", module, *args]
