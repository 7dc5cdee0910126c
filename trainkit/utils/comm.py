"""Rank and world queries, the per-machine process group, and object collectives.

Every function works without an initialised process group (a world of one process), so
library code calls them unconditionally. The only global state is the per-machine ("local")
process group, made by :func:`create_local_process_group`, forgotten by
:func:`reset_local_process_group` (tests).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

_LOCAL_PROCESS_GROUP: dist.ProcessGroup | None = None

__all__ = [
    "all_gather",
    "create_local_process_group",
    "gather",
    "get_local_process_group",
    "get_local_rank",
    "get_local_size",
    "get_rank",
    "get_world_size",
    "is_main_process",
    "reduce_dict",
    "reset_local_process_group",
    "shared_random_seed",
    "synchronize",
]


def _is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    """Return the number of processes in the job (1 without a process group)."""
    return dist.get_world_size() if _is_distributed() else 1


def get_rank() -> int:
    """Return this process's global rank (0 without a process group)."""
    return dist.get_rank() if _is_distributed() else 0


def create_local_process_group(num_workers_per_machine: int) -> None:
    """Create the per-machine process group; every rank of the job must call this.

    Ranks are assumed to be laid out machine by machine: machine ``m`` holds global ranks
    ``m * num_workers_per_machine ... (m + 1) * num_workers_per_machine - 1``, which is what
    :func:`trainkit.engine.launch` and ``torchrun`` produce.

    Args:
        num_workers_per_machine: processes on each machine.

    Raises:
        ValueError: If the world size is not a multiple of ``num_workers_per_machine``.

    Collective:
        ``new_group`` is called once per machine on every rank.
    """
    global _LOCAL_PROCESS_GROUP
    if _LOCAL_PROCESS_GROUP is not None:
        raise RuntimeError("the local process group was already created in this process")
    world_size = get_world_size()
    if num_workers_per_machine < 1 or world_size % num_workers_per_machine:
        raise ValueError(
            f"world size {world_size} is not a multiple of num_workers_per_machine="
            f"{num_workers_per_machine}; every machine must run the same number of processes."
        )
    if not _is_distributed():
        return
    machine = get_rank() // num_workers_per_machine
    for m in range(world_size // num_workers_per_machine):
        ranks = list(range(m * num_workers_per_machine, (m + 1) * num_workers_per_machine))
        group = dist.new_group(ranks)
        if m == machine:
            _LOCAL_PROCESS_GROUP = group


def reset_local_process_group() -> None:
    """Forget the process-group handles kept here (for tests that run several jobs per process)."""
    global _LOCAL_PROCESS_GROUP
    _LOCAL_PROCESS_GROUP = None
    _object_group.cache_clear()


def get_local_process_group() -> dist.ProcessGroup:
    """Return the process group of the ranks on this machine.

    Raises:
        RuntimeError: If :func:`create_local_process_group` was not called in a distributed job
            (also raised by :func:`get_local_size` and :func:`get_local_rank` then).
    """
    if _LOCAL_PROCESS_GROUP is None:
        raise RuntimeError(
            "the local process group is not created; launch() creates it, or call "
            "comm.create_local_process_group(num_workers_per_machine) after init_process_group()."
        )
    return _LOCAL_PROCESS_GROUP


def get_local_size() -> int:
    """Return the number of processes on this machine (1 without a process group or alone)."""
    # One process (e.g. the group shard_model starts for itself) has no local group to ask.
    if get_world_size() == 1:
        return 1
    return dist.get_world_size(group=get_local_process_group())


def get_local_rank() -> int:
    """Return this process's rank within its machine (0 without a process group or alone)."""
    if get_world_size() == 1:
        return 0
    return dist.get_rank(group=get_local_process_group())


def is_main_process() -> bool:
    """Return True on global rank 0."""
    return get_rank() == 0


def synchronize() -> None:
    """Block until every rank reaches this call; a no-op with one process.

    Collective:
        ``barrier`` over the default group.
    """
    if get_world_size() == 1:
        return
    if dist.get_backend() == dist.Backend.NCCL and torch.cuda.is_available():
        # Without device_ids NCCL guesses the device from the rank, which is wrong when
        # CUDA_VISIBLE_DEVICES reorders devices.
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


@functools.lru_cache
def _object_group() -> dist.ProcessGroup:
    # Objects travel as pickled bytes; gloo does that on the CPU without staging them through
    # GPU memory the way an NCCL group would.
    is_nccl = dist.get_backend() == dist.Backend.NCCL
    return dist.new_group(backend="gloo") if is_nccl else dist.group.WORLD


def _gather_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """The group objects are gathered over; None if it has one process (nothing to gather)."""
    if get_world_size() == 1:
        return None
    group = _object_group() if group is None else group
    return group if dist.get_world_size(group) > 1 else None


def all_gather(obj: Any, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Gather a picklable object from every rank of ``group`` onto every rank.

    Args:
        obj: any picklable object.
        group: a process group; ``None`` means all ranks (through a gloo group under NCCL).

    Returns:
        The objects of the ranks of ``group``, ordered by rank within the group.

    Collective:
        ``all_gather_object`` over ``group``.
    """
    group = _gather_group(group)
    if group is None:
        return [obj]
    output: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(output, obj, group=group)
    return output


def gather(obj: Any, dst: int = 0, group: dist.ProcessGroup | None = None) -> list[Any]:
    """Gather a picklable object from every rank of ``group`` onto global rank ``dst``.

    Args:
        obj, group: as for :func:`all_gather`.
        dst: the global rank that receives the list.

    Returns:
        On ``dst``, the objects ordered by rank within the group; on other ranks ``[]``.

    Collective:
        ``gather_object`` over ``group``.
    """
    group = _gather_group(group)
    if group is None:
        return [obj]
    output = [None] * dist.get_world_size(group) if get_rank() == dst else None
    dist.gather_object(obj, output, dst=dst, group=group)
    return [] if output is None else output


def shared_random_seed() -> int:
    """Return a random seed that is the same on every rank (rank 0's draw).

    Collective:
        ``all_gather`` over all ranks.
    """
    return all_gather(int(np.random.randint(2**31)))[0]


def reduce_dict(
    input_dict: dict[str, torch.Tensor], average: bool = True
) -> dict[str, torch.Tensor]:
    """Reduce a dict of scalar tensors to rank 0, summed or averaged over ranks.

    Args:
        input_dict: the same keys on every rank; values are scalar tensors.
        average: divide the sum by the world size.

    Returns:
        The reduced dict; only rank 0's values are meaningful.

    Collective:
        ``reduce`` over all ranks.
    """
    world_size = get_world_size()
    if world_size == 1:
        return input_dict
    with torch.no_grad():
        # Sort the keys so every rank stacks the values in the same order.
        names = sorted(input_dict.keys())
        values = torch.stack([input_dict[k].detach().reshape(()) for k in names])
        dist.reduce(values, dst=0)
        if dist.get_rank() == 0 and average:
            values /= world_size
        return dict(zip(names, values))
