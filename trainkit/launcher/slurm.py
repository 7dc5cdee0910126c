"""Reading a SLURM job step's environment: ranks, nodes and the rendezvous address.

``srun python tools/train_net.py ...`` starts one task per process; SLURM tells each who it
is (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``), how many there are
(``SLURM_STEP_NUM_TASKS``, ``SLURM_STEP_TASKS_PER_NODE``) and where (``SLURM_STEP_NODELIST``).
The first node of the step (task 0's under SLURM's default block distribution) hosts the
rendezvous store. Everything here is a pure function of the environment, tested without SLURM.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from trainkit.utils.errors import UsageError

__all__ = ["SlurmEnvironmentError", "expand_nodelist", "rendezvous_port", "slurm_variables"]

# Ports 20000-29999: below Linux's ephemeral range (32768+), so a port derived from the job
# id does not collide with the outgoing connections of the same machine.
_PORT_BASE = 20000
_PORT_SPAN = 10000


class SlurmEnvironmentError(UsageError, ValueError):
    """The SLURM step cannot be run as one process per task; the message says what to change."""


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM's compressed host list, keeping zero padding and order.

    ``"node[01-03,07],gpu-a"`` gives ``["node01", "node02", "node03", "node07", "gpu-a"]``;
    several bracket groups in one name give their product (``"r[1-2]n[1-2]"``).

    Raises:
        SlurmEnvironmentError: On unbalanced brackets or a malformed range.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        parts = re.split(r"(\[[^\]]*\])", item)
        if any(c in p for p in parts[::2] for c in "[]"):
            raise SlurmEnvironmentError(f"cannot read the SLURM node list {nodelist!r}")
        choices = [_expand_brackets(p, nodelist) if p.startswith("[") else [p] for p in parts]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item for item in items if item]


def _expand_brackets(group: str, nodelist: str) -> list[str]:
    names = []
    for part in group[1:-1].split(","):
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise SlurmEnvironmentError(f"cannot read the range {part!r} in {nodelist!r}")
        names += [str(number).zfill(len(low)) for number in range(int(low), int(high or low) + 1)]
    return names


def rendezvous_port(environ: Mapping[str, str]) -> int:
    """Return ``MASTER_PORT`` if set, else a port in 20000-29999 derived from the job id."""
    if environ.get("MASTER_PORT"):
        return int(environ["MASTER_PORT"])
    return _PORT_BASE + int(environ.get("SLURM_JOB_ID", "0")) % _PORT_SPAN


def _tasks_per_node(environ: Mapping[str, str]) -> list[int]:
    """Expand ``SLURM_STEP_TASKS_PER_NODE`` (``"2(x3),1"``) to one count per node."""
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE", "")
    counts = []
    for item in filter(None, spec.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if match is None:
            raise SlurmEnvironmentError(f"cannot read SLURM_STEP_TASKS_PER_NODE={spec!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def slurm_variables(environ: Mapping[str, str], num_gpus_per_machine: int) -> dict[str, str] | None:
    """Return torchrun's variables for this task if it runs in an ``srun`` step of several tasks.

    With them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``) a SLURM task joins the job like a process torchrun started. None when not
    under ``srun`` (no ``SLURM_STEP_ID``), with a single task, or when each task is one
    launcher per node (``--ntasks-per-node 1`` with ``--num-gpus`` above 1, the detectron2
    way): :func:`~trainkit.launcher.launch` then starts the processes itself.

    Raises:
        SlurmEnvironmentError: If the tasks per node differ between nodes, disagree with
            ``--num-gpus``, or are not laid out node by node (``--distribution=block``).
    """
    if "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:
        return None
    world_size = int(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS", "1"))
    counts = _tasks_per_node(environ) or [world_size]
    if world_size == 1 or (counts[0] == 1 and num_gpus_per_machine > 1):
        return None
    if len(set(counts)) != 1 or num_gpus_per_machine not in (1, counts[0]):
        raise SlurmEnvironmentError(
            f"srun started {counts} tasks per node with --num-gpus {num_gpus_per_machine}; run "
            f"the same number of tasks on every node (--ntasks-per-node) and leave --num-gpus "
            f"at 1 (each task is one process)."
        )
    rank, local_rank = int(environ["SLURM_PROCID"]), int(environ.get("SLURM_LOCALID", "0"))
    node = int(environ.get("SLURM_NODEID", str(rank // counts[0])))
    if rank != node * counts[0] + local_rank:
        raise SlurmEnvironmentError(
            f"SLURM task {rank} runs as local task {local_rank} of node {node}, but the job "
            f"needs consecutive ranks on each node; start it with srun --distribution=block."
        )
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", "")
    master_addr = environ.get("MASTER_ADDR") or next(iter(expand_nodelist(nodelist)), "")
    if not master_addr:
        raise SlurmEnvironmentError("SLURM_STEP_NODELIST is empty; set MASTER_ADDR instead.")
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(counts[0]),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(rendezvous_port(environ)),
    }
