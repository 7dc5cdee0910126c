"""What the trainer and the launcher agree on: exit statuses, variables, heartbeats, stalls.

The engine's hooks and the launcher's processes both import this module; neither reaches into
the other.

An exception with an integer ``exit_code`` attribute (``TrainingPreempted``) is an agreed
stop: every rank raises it at the same step, so no rank posts it as the job's failure, and the
process ends with that status (a user error: :data:`trainkit.utils.errors.USAGE_EXIT_CODE`).
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = [
    "HEARTBEAT_KEY",
    "JOB_STORE_VAR",
    "NON_FINITE_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "RESTART_COUNT_VAR",
    "WATCHDOG_EXIT_CODE",
    "connect_job_store",
    "describe_stall",
    "exit_code_of",
    "find_stalled_rank",
    "job_store_address",
]

logger = logging.getLogger(__name__)


def exit_code_of(error: BaseException) -> int | None:
    """Return the status ``error`` asks the process to end with (its ``exit_code``), or None.

    Only a positive integer counts (see the module docstring).
    """
    code = getattr(error, "exit_code", None)  # any exception type may carry one
    return code if isinstance(code, int) and code > 0 else None


PREEMPTED_EXIT_CODE = 75
"""Exit status of a run stopped by a signal after saving a checkpoint (sysexits' TEMPFAIL)."""

NON_FINITE_EXIT_CODE = 65
"""Exit status of a run stopped by a non-finite loss (sysexits' DATAERR). Restarts do not retry
it: resumed from the same checkpoint on the same records, the run would fail the same way."""

WATCHDOG_EXIT_CODE = 124
"""Exit status of a process the watchdog ended (like timeout(1))."""

RESTART_COUNT_VAR = "TRAINKIT_RESTART_COUNT"
"""Set in each process of a job: its round (0 first, N after N restarts; the same on all ranks)."""

JOB_STORE_VAR = "TRAINKIT_JOB_STORE"
"""Set in each process of a job: ``HOST:PORT/NAMESPACE`` of its round (see job_store)."""

HEARTBEAT_KEY = "trainkit/watchdog/rank{rank}"
"""In a round's namespace: a rank's progress record as JSON (``rank``, ``phase``, ``iteration``,
``elapsed_s``, ``started_at`` on the wall clock, ``timeout_s``, ``pid``); the launcher's guard
applies :func:`find_stalled_rank` to every rank's."""


def job_store_address(host: str, port: int, namespace: str) -> str:
    """Return the value of :data:`JOB_STORE_VAR` for a round's namespace of the job's store."""
    return f"{host}:{port}/{namespace}"


def connect_job_store() -> dist.Store | None:
    """Return this round's namespace of the job store (where the progress watchdog publishes).

    None outside a multi-process job, or if the store cannot be reached (with a warning).
    """
    address = os.environ.get(JOB_STORE_VAR)
    if not address:
        return None
    import torch.distributed as dist  # here, not at the top: this module stays light

    host_port, _, prefix = address.partition("/")
    host, _, port = host_port.rpartition(":")
    try:
        store = dist.TCPStore(host, int(port), None, False, datetime.timedelta(seconds=30))
    except (RuntimeError, dist.DistError) as e:
        logger.warning("Cannot reach the job store at %s (%s); watching this rank only", address, e)
        return None
    return dist.PrefixStore(prefix, store)


def describe_stall(record: dict[str, Any], timeout_s: float) -> str:
    """Return the one-paragraph report for a stalled rank's record."""
    return (
        f"rank {record['rank']} stopped making progress: it has been in phase "
        f"'{record['phase']}' at iteration {record['iteration']} for {record['elapsed_s']:.0f} s "
        f"(WATCHDOG_TIMEOUT_S={timeout_s:g}). Other ranks are waiting for it; look at what "
        f"that phase does on that rank (a slow file system for 'data', a hung GPU for "
        f"'forward/backward'), or raise WATCHDOG_TIMEOUT_S if the phase is legitimately slow."
    )


# Where each phase falls within an iteration; the others (hooks, checkpoint, eval) come after.
_PHASE_ORDER = {"start": 0, "data": 1, "forward/backward": 2}


def find_stalled_rank(records: list[dict[str, Any]], timeout_s: float) -> dict[str, Any] | None:
    """If some rank exceeded ``timeout_s`` in its phase, return the record of the culprit.

    The culprit is the rank furthest behind (earliest iteration, then earliest phase within
    it): the others have gone on until a collective and wait there for it. Which rank
    entered its phase first does not tell: a rank that gets ahead (the peer was descheduled
    for a moment) enters the collective before the peer enters its stuck phase. Among ranks
    equally far, the one stuck longest is named.
    """
    if timeout_s <= 0 or not records or max(r["elapsed_s"] for r in records) <= timeout_s:
        return None
    return min(
        records, key=lambda r: (r["iteration"], _PHASE_ORDER.get(r["phase"], 3), -r["elapsed_s"])
    )
