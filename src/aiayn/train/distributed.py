"""Data-parallel training on PyTorch's own engine: ``torchrun`` + ``torch.distributed``.

What the training loop (``aiayn.train``) needs from the process group, in one place:

- ``World``: this process's ``rank`` / ``world_size`` / ``local_rank``, read from the
  variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``), and the device it trains on;
- ``init_process_group``: NCCL on CUDA, gloo on CPU;
- ``agree``: one all-reduce per step so every rank stops at the same update (a
  signal or the clock seen by one rank stops all of them; otherwise the others would
  wait forever in the next gradient all-reduce);
- ``shard_fsdp`` / ``full_state`` / ``load_full_optimizer_state``: FSDP2 (``fully_shard``) and
  the conversion between its sharded state and the one-process checkpoint format (full
  tensors, optimizer state keyed by parameter index), so a checkpoint written under FSDP
  resumes under DDP or on one process and back;
- ``torchrun_command``: the launcher line the ``train`` stage runs when
  ``train.nproc_per_node > 1`` (single node, ``--standalone``). Several nodes: run
  ``torchrun --nnodes N --nproc_per_node G --rdzv_backend c10d --rdzv_endpoint host:port
  --shutdown-timeout 600 -m aiayn.stages.train_worker ROOT PARAMS_JSON`` on each node yourself.

The data-order contract (world-size invariance) lives in ``aiayn.train``: every
rank walks the same global batch sequence and takes its shard of each update.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["World", "world_from_env", "rank_device", "init_process_group", "agree", "all_reduce_sum", "barrier", "torchrun_command",
           "shard_fsdp", "full_state", "load_full_optimizer_state"]


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


def rank_device(device: str, world: World) -> torch.device:
    """The device this rank trains on: ``cuda:<local_rank>`` for ``device`` ``"cuda"``, or ``"auto"`` when CUDA
    is available; the CPU otherwise (``train.device``: ``auto``, ``cpu`` or ``cuda``)."""
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return torch.device("cuda", world.local_rank) if use_cuda else torch.device("cpu")


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


#: Seconds torchrun lets the ranks run on after it passes on SIGTERM/SIGINT, before it SIGKILLs them (its
#: own default is 30 s): they finish the update in flight and rank 0 writes the checkpoint, which for the
#: base model on a slow CPU host takes longer than 30 s, and a killed rank loses the steps since the last one.
SHUTDOWN_GRACE_S = 600


def torchrun_command(nproc_per_node: int, module: str, *args: str,
                     shutdown_grace_s: int = SHUTDOWN_GRACE_S) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node N --shutdown-timeout S -m MODULE ARGS...``
    (torchrun, one node).

    Uses this interpreter (``sys.executable``), so the launcher works from a venv without
    ``torchrun`` on ``PATH``. ``shutdown_grace_s``: seconds the ranks get to stop after a signal
    (``SHUTDOWN_GRACE_S``). Raises ``ValueError`` if ``nproc_per_node < 1``.
    """
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be >= 1, got {nproc_per_node}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
            f"--shutdown-timeout={shutdown_grace_s}", "-m", module, *args]


def shard_fsdp(model: torch.nn.Module, world: World, device: torch.device) -> None:
    """FSDP2: ``fully_shard`` every encoder and decoder layer, then the root (embeddings, final norms).

    In place: the parameters become ``DTensor`` shards over a 1-D mesh of all ranks; create the
    optimizer afterwards. Gradients are reduce-scattered (averaged over ranks, like DDP).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world.world_size,))
    for name in ("encoder_layers", "decoder_layers"):
        for layer in getattr(model, name, []):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               param_names: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The full (unsharded) model and optimizer state of an FSDP2 model, on CPU, on rank 0.

    A collective: every rank must call it. Rank 0 gets ``(model_state, optimizer_state)`` in
    the one-process format (``optimizer.state_dict()`` keyed by parameter index, in the order
    of ``param_names``); the other ranks get empty dicts.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optim = get_optimizer_state_dict(model, optimizer, options=options)
    if not model_state:
        return {}, {}
    index = {name: i for i, name in enumerate(param_names)}
    state = {index[name]: per_param for name, per_param in optim["state"].items()}
    groups = [{**g, "params": [index[name] for name in g["params"]]} for g in optim["param_groups"]]
    return model_state, {"state": state, "param_groups": groups}


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                              param_names: list[str]) -> None:
    """Load a one-process optimizer state (keyed by parameter index) into an FSDP2 model's optimizer.

    Every rank passes the same full state (read from the checkpoint); each keeps its shard.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    by_name = {"state": {param_names[int(i)]: per_param for i, per_param in state["state"].items()},
               "param_groups": [{**g, "params": [param_names[int(i)] for i in g["params"]]}
                                for g in state["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, optim_state_dict=by_name,
                             options=StateDictOptions(full_state_dict=True))
