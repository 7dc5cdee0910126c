"""A process's membership in a distributed job, however it was started (launch, torchrun, srun).

Its place comes from torchrun's variables (:class:`JobEnvironment`; for SLURM ``launch``
derives them first, :mod:`trainkit.launcher.slurm`); :func:`run_in_job` joins the job.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from trainkit.launcher.job_store import (
    agree_on_round,
    connect_store,
    post_abort,
    read_abort,
    serve_store,
)
from trainkit.launcher.protocol import (
    HEARTBEAT_KEY,
    JOB_STORE_VAR,
    NON_FINITE_EXIT_CODE,
    RESTART_COUNT_VAR,
    WATCHDOG_EXIT_CODE,
    describe_stall,
    exit_code_of,
    find_stalled_rank,
    job_store_address,
)
from trainkit.utils import comm
from trainkit.utils.errors import USAGE_EXIT_CODE, UsageError, user_message

__all__ = ["JobEnvironment", "default_backend", "run_in_job"]

logger = logging.getLogger(__name__)

_USAGE_KEY = "trainkit/usage_error"  # a user error ended a round: later rounds stop at once
_NON_FINITE_KEY = "trainkit/non_finite"  # so did a non-finite loss (it would come again)
_GUARD_POLL_S = 0.25
_STALL_POLL_S = 1.0
# A rank whose collective failed because a peer vanished waits this long before exiting,
# so that the agent (which names the first process it sees die) sees the peer first.
_SETTLE_S = 1.0
_SECONDARY_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "DistBackendError",
    "DistNetworkError",
    "Broken pipe",
    "NCCL communicator was aborted",
)


@dataclass(frozen=True)
class JobEnvironment:
    """This process's place in the job, as torchrun's variables describe it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    agent_store: bool
    """The store at MASTER_ADDR:MASTER_PORT is an elastic agent's: it outlives this process
    and every round of the job. Otherwise rank 0 serves it (``env://``'s convention)."""
    restart_count: int
    """This process's own count (its agent's, or SLURM's requeues); may differ between
    machines, which is why the job agrees on the round instead (see agree_on_round)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> JobEnvironment | None:
        """Read torchrun's variables; None unless all of them are set."""
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
        if not all(environ.get(n) for n in (*names, "MASTER_PORT")):
            return None
        restarts = environ.get("TORCHELASTIC_RESTART_COUNT") or environ.get("SLURM_RESTART_COUNT")
        return cls(
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ["LOCAL_RANK"]),
            local_world_size=int(environ["LOCAL_WORLD_SIZE"]),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
            agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            restart_count=int(restarts or 0),
        )


def run_in_job(
    main_func: Callable[..., Any],
    args: Sequence[Any],
    timeout: datetime.timedelta,
    env: JobEnvironment,
    on_abort: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Join the job ``env`` describes, run ``main_func(*args)``, leave the job.

    The processes agree on a fresh namespace of the job's store for this round
    (:func:`~trainkit.launcher.job_store.agree_on_round` says why) and join the process group
    there; the trainer reads the round and the namespace from ``RESTART_COUNT_VAR`` and
    ``JOB_STORE_VAR``. When a process of the round posts a failure (an exception, a user
    error, a stall), a guard thread ends every other one within a second, with its exit
    status, instead of leaving it waiting in a collective.

    Args:
        timeout: how long a collective (and joining) waits for the other processes.
        on_abort: called (instead of ending the process) when another process failed.

    Raises:
        UsageError: If an earlier round of the job ended on a user error.
        Exception: What ``main_func`` raised, after it was posted to the other processes.

    Collective:
        Every process of the job calls it: joining the round, ``init_process_group``, the
        per-machine groups and a barrier, before ``main_func``.
    """
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        # An orphan of a dead agent would go on training with the job it was part of, out
        # of the reach of any restart: a machine that is lost loses its processes too. So
        # Linux SIGKILLs this process when its parent (the agent) dies.
        with contextlib.suppress(Exception):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if env.world_size == 1:  # nothing to join: no process group, as without a launcher
        with _exported({RESTART_COUNT_VAR: str(env.restart_count)}):
            return main_func(*args)
    timeout_s = timeout.total_seconds()
    if env.rank == 0 and not env.agent_store:
        store, _ = serve_store(env.master_addr, env.master_port, timeout_s)
    else:
        store = connect_store(env.master_addr, env.master_port, timeout_s)
    prefix, index = agree_on_round(store, env.rank, env.world_size, env.restart_count, timeout_s)
    if store.check([_USAGE_KEY]):
        # Under torchrun --max-restarts the agent restarts a job that ended on a user error
        # anyway; this round stops at once.
        raise UsageError(store.get(_USAGE_KEY).decode())
    if store.check([_NON_FINITE_KEY]):
        # Resumed from the same checkpoint on the same records, the round would train up to
        # the same step and fail there again: stop before training, with the same status.
        logger.error(
            "Not starting round %d: a restart would meet the non-finite loss an earlier "
            "round stopped on. %s",
            index,
            store.get(_NON_FINITE_KEY).decode(),
        )
        raise SystemExit(NON_FINITE_EXIT_CODE)
    round_store = dist.PrefixStore(prefix, store)
    exported = {
        RESTART_COUNT_VAR: str(index),
        JOB_STORE_VAR: job_store_address(env.master_addr, env.master_port, prefix),
    }
    with _exported(exported), _process_group(env, round_store, timeout):
        guard = _Guard(round_store, env, on_abort or _exit_for)
        try:
            guard.start()
            return main_func(*args)
        except BaseException as e:
            guard.stop()  # this process reports its own failure
            if _is_secondary(e):
                # A peer vanished mid-collective: stop with the cause it posted (if any)
                # rather than with the echo, so this process's log names the failing rank.
                record = _wait_for_abort(round_store)
                if record is not None:
                    (on_abort or _exit_for)(record)
            _post_failure(store, round_store, env.rank, e)
            raise
        finally:
            guard.stop()


@contextlib.contextmanager
def _process_group(
    env: JobEnvironment, round_store: dist.Store, timeout: datetime.timedelta
) -> Iterator[None]:
    """Join the process group (and the per-machine group) in the round's namespace.

    Collective:
        ``init_process_group``, ``new_group`` per machine and a barrier on entry.
    """
    backend = default_backend()
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore("pg", round_store),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timeout,
    )
    try:
        comm.create_local_process_group(env.local_world_size)
        comm.synchronize()
        yield
    finally:
        comm.reset_local_process_group()
        if dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def _exported(variables: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the body (what the trainer reads), then remove them."""
    os.environ.update(variables)
    try:
        yield
    finally:
        for name in variables:
            os.environ.pop(name, None)


def default_backend() -> str:
    """NCCL when CUDA (and NCCL) are available, else Gloo."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def _post_failure(
    store: dist.Store, round_store: dist.Store, rank: int, error: BaseException
) -> None:
    """Tell the other processes (and the launchers) that this one failed, unless it is an echo."""
    if isinstance(error, SystemExit) and error.code in (None, 0):
        return
    exit_code = exit_code_of(error)
    if exit_code is not None and exit_code != NON_FINITE_EXIT_CODE:
        return  # an agreed stop (pre-emption): every rank stops the same way, after a barrier
    code, kind = 1, "error"
    if exit_code == NON_FINITE_EXIT_CODE:
        # Posted, not agreed: a loss checked on the CPU at every step stops only its own
        # rank; the others, waiting in the gradients' all-reduce, must stop with its status.
        # With the exception's notes (the failing step's folder), as a traceback shows them.
        notes = "".join(f"\n{note}" for note in getattr(error, "__notes__", ()))
        message, code, kind = f"rank {rank}: {error}{notes}", NON_FINITE_EXIT_CODE, "non_finite"
        with contextlib.suppress(Exception):
            store.set(_NON_FINITE_KEY, message)
    elif isinstance(error, UsageError):
        message, code, kind = user_message(error), USAGE_EXIT_CODE, "usage"
        with contextlib.suppress(Exception):
            store.set(_USAGE_KEY, message)
    elif _is_secondary(error):
        return  # a peer vanished and posted nothing (killed): the launcher names it
    else:
        message = f"rank {rank} raised an exception:\n{traceback.format_exc()}"
    post_abort(round_store, _failure(rank, message, code, kind))


def _is_secondary(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because a peer process vanished."""
    return any(m in f"{type(error).__name__}: {error}" for m in _SECONDARY_MARKERS)


def _wait_for_abort(round_store: dist.Store) -> dict[str, Any] | None:
    """The failure a peer posted, waiting up to ``_SETTLE_S`` for it; None if none came."""
    deadline = time.monotonic() + _SETTLE_S
    while True:
        with contextlib.suppress(RuntimeError, dist.DistError):  # the store's host is gone
            record = read_abort(round_store)
            if record is not None:
                return record
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def _failure(rank: int | None, message: str, exit_code: int = 1, kind: str = "error") -> dict:
    return {"rank": rank, "message": message, "exit_code": exit_code, "kind": kind}


def _exit_for(record: dict[str, Any]) -> None:
    logger.error("Stopping this process: %s", record["message"])
    logging.shutdown()
    os._exit(record["exit_code"])


class _Guard:
    """The thread that ends this process when another one of the round failed.

    On rank 0 and the last rank it also reads every rank's progress record (published by
    :class:`~trainkit.engine.hooks.watchdog.ProgressWatchdog`) and posts a stall as the failure:
    two readers, so that a frozen rank 0 is still seen.
    """

    def __init__(
        self,
        round_store: dist.Store,
        env: JobEnvironment,
        on_abort: Callable[[dict[str, Any]], None],
    ) -> None:
        self._store = round_store
        self._env = env
        self._on_abort = on_abort
        self._observer = env.rank in (0, env.world_size - 1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainkit-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        next_stall_check = 0.0
        while not self._stop.wait(_GUARD_POLL_S):
            try:
                record = read_abort(self._store)
                if record is None and self._observer and time.monotonic() >= next_stall_check:
                    next_stall_check = time.monotonic() + _STALL_POLL_S
                    record = self._find_stall()
                    if record is not None:
                        post_abort(self._store, record)
                        record = read_abort(self._store) or record
            except (RuntimeError, dist.DistError) as e:
                if not self._env.agent_store:
                    return  # rank 0 served the store and has finished: nothing to guard
                address = f"{self._env.master_addr}:{self._env.master_port}"
                why = f"lost the connection to the job's store at {address} ({e})"
                record = _failure(None, f"{why}; its launcher stopped.")
            if record is not None:
                if not self._stop.is_set():
                    self._on_abort(record)
                return

    def _find_stall(self) -> dict[str, Any] | None:
        records = []
        for rank in range(self._env.world_size):
            key = HEARTBEAT_KEY.format(rank=rank)
            if self._store.check([key]):
                record = json.loads(self._store.get(key))
                # From the phase's start rather than the published duration: still growing
                # for a process that stopped publishing (frozen).
                record["elapsed_s"] = time.time() - record["started_at"]
                records.append(record)
        timeouts = [r["timeout_s"] for r in records if r["timeout_s"] > 0]
        stalled = find_stalled_rank(records, min(timeouts)) if timeouts else None
        if stalled is None:
            return None
        message = describe_stall(stalled, stalled["timeout_s"])
        return _failure(stalled["rank"], message, WATCHDOG_EXIT_CODE, "stall")
