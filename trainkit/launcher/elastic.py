"""A ``launch()`` job on torch.distributed.elastic: its agent, rendezvous and process entry.

On each machine, torch's :class:`LocalElasticAgent` spawns the processes, watches them and
stops them all when one fails. trainkit runs one agent per round and decides about restarts
itself, from the agent's public :class:`RunResult` (:func:`run_agent`): torch's agent
restarts by itself while ``WorkerSpec.max_restarts`` allows, with no public way to look at a
failure first. (trainkit used to override its private ``_monitor_workers`` for that, which
any torch refactor may break; ``tests/launcher/test_elastic.py`` keeps it from coming back.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import pickle
import signal
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch.distributed import PrefixStore, Store
from torch.distributed.elastic.agent.server import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
)

from trainkit.launcher.job import JobEnvironment, run_in_job
from trainkit.launcher.job_store import (
    ROUND_KEY,
    connect_store,
    post_abort,
    read_abort,
    serve_store,
)
from trainkit.launcher.protocol import NON_FINITE_EXIT_CODE, PREEMPTED_EXIT_CODE, exit_code_of
from trainkit.utils.errors import USAGE_EXIT_CODE, UsageError, user_message

__all__ = ["JobFailed", "run_agent", "should_restart"]

logger = logging.getLogger(__name__)

_MONITOR_S = 0.1
_RUN_ID_KEY = "trainkit/run_id"
# Pre-emption: how long the processes get, after the launcher forwarded a signal, to finish
# their step and save a checkpoint before they are killed.
_SIGNAL_GRACE_S = 120
_FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
_PREEMPTED = (
    "the job was pre-empted after saving a checkpoint; run the same command with --resume "
    "to continue (a restarted or requeued job resumes by itself)."
)


class JobFailed(Exception):
    """The job ended on a failure; what the user is told about it.

    Attributes:
        rank: global rank of the process that failed first (None if unknown).
        exit_code: the status the job should end with (2 for a user error).
        kind: ``"error"``, ``"usage"``, ``"stall"``, ``"preempted"``, ``"non_finite"`` or
            ``"signal"``.
    """

    def __init__(self, message: str, rank: int | None, exit_code: int, kind: str = "error"):
        super().__init__(message)
        self.rank, self.exit_code, self.kind = rank, exit_code, kind


@dataclasses.dataclass(frozen=True)
class _Job:
    """What each spawned process runs; pickled into it."""

    main_func: Callable[..., Any]
    args: tuple[Any, ...]
    timeout: datetime.timedelta
    report_dir: str
    loopback: bool
    max_restarts: int
    restart_count: int = 0
    """The round; each round's agent is a new one, which would tell the processes 0."""


def run_agent(
    main_func: Callable[..., Any],
    args: tuple[Any, ...],
    timeout: datetime.timedelta,
    *,
    num_processes: int,
    machine_rank: int,
    num_machines: int,
    address: tuple[str, int],
    loopback: bool,
    max_restarts: int,
    rendezvous_timeout_s: float,
) -> list[Any]:
    """Run this machine's share of the job under torch's elastic agent, to its end.

    A failed round starts the next one when :func:`should_restart` says so.

    Returns:
        ``main_func``'s return values of this machine's processes, by local rank.

    Raises:
        UsageError: From the rendezvous (an address in use, machine 0 unreachable).
        JobFailed: When the job failed and no restart was left (or none was allowed).
    """
    with tempfile.TemporaryDirectory(prefix="trainkit-launch-") as tmp, _quiet_elastic_logs():
        rendezvous = _Rendezvous(*address, machine_rank, num_machines, rendezvous_timeout_s)
        logs = DefaultLogsSpecs(log_dir=os.path.join(tmp, "logs"))
        failures = _Failures(rendezvous.store, tmp)
        job = _Job(main_func, args, timeout, tmp, loopback, max_restarts)
        try:
            with _forwarded_signals():
                while True:
                    spec = WorkerSpec(
                        role="trainkit",
                        local_world_size=num_processes,
                        rdzv_handler=rendezvous,
                        entrypoint=_spawned_process,
                        args=(job,),
                        max_restarts=0,  # restarts are decided here, after a look at the failure
                        monitor_interval=_MONITOR_S,
                    )
                    agent = LocalElasticAgent(
                        spec,
                        logs_specs=logs,
                        start_method="spawn",
                        exit_barrier_timeout=rendezvous_timeout_s,
                        shutdown_timeout=_SIGNAL_GRACE_S,
                    )
                    result = agent.run()
                    if result.state == WorkerState.SUCCEEDED:
                        return [result.return_values[r] for r in sorted(result.return_values)]
                    local_ranks = {w.global_rank for w in agent.get_worker_group().workers}
                    failure = failures.describe(result, local_ranks)
                    if not should_restart(failure, job.restart_count, max_restarts):
                        raise failure
                    job = dataclasses.replace(job, restart_count=job.restart_count + 1)
                    logger.warning(
                        "%s\nRestarting the job (restart %d of %d).",
                        failure,
                        job.restart_count,
                        max_restarts,
                    )
        except SignalException as e:
            raise failures.describe_signal(e.sigval) from None
        except JobFailed:
            if num_machines > 1:
                time.sleep(1.0)  # keep serving the store until the others read the failure
            raise


# Failures a new round would repeat: a user error; a non-finite loss (the round would resume
# from the same checkpoint on the same records); a pre-emption (the scheduler requeues it).
_FINAL_KINDS = ("usage", "preempted", "non_finite")


def should_restart(failure: JobFailed, restart_count: int, max_restarts: int) -> bool:
    """Return whether a job whose round ended on ``failure`` starts another round.

    Args:
        failure: how the round ended.
        restart_count: the rounds restarted so far.
        max_restarts: the most restarts allowed (``launch(..., max_restarts=N)``).
    """
    is_final = failure.kind in _FINAL_KINDS or failure.exit_code == NON_FINITE_EXIT_CODE
    return not is_final and restart_count < max_restarts


# ---- the rendezvous and what the agent saw ----------------------------------------------------
class _Rendezvous(RendezvousHandler):
    """The rendezvous of a ``launch`` job: fixed machines, each keeping its machine rank.

    Machine 0's launcher serves the job's store before any process starts, the others
    connect to it (``dist_url="auto"``: 127.0.0.1 port 0, so concurrent jobs never race for
    a port and nothing listens outside the machine). torch's static rendezvous listens on
    every interface and reports neither a port in use nor an unreachable machine 0 by
    address. Elastic membership is torchrun's c10d rendezvous.
    """

    def __init__(
        self, host: str, port: int, machine_rank: int, num_machines: int, timeout_s: float
    ) -> None:
        self.host, self.machine_rank, self.num_machines = host, machine_rank, num_machines
        if machine_rank == 0:
            self.store, self.port = serve_store(host, port, timeout_s)
            self.store.set(_RUN_ID_KEY, uuid.uuid4().hex)
        else:
            self.store, self.port = connect_store(host, port, timeout_s), port
        # The same on every machine: a restart resumes the checkpoints of this run id.
        self.run_id = self.store.get(_RUN_ID_KEY).decode()

    def get_backend(self) -> str:
        return "trainkit"

    @property
    def use_agent_store(self) -> bool:
        return True  # the processes use this store (it outlives them: see agree_on_round)

    def next_rendezvous(self) -> RendezvousInfo:
        return RendezvousInfo(
            PrefixStore("torchelastic", self.store),
            self.machine_rank,
            self.num_machines,
            RendezvousStoreInfo(self.host, self.port),
        )

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


class _Failures:
    """Describe each failure of the job once, as the user sees it, and post it for the others.

    The round's first failure recorded in the job's store wins (a process posts its own
    traceback there); else what this machine's agent saw and its processes reported (a
    signal, an exit status), posted so that the other machines stop too.
    """

    def __init__(self, store: Store, report_dir: str) -> None:
        self._store = store
        self._report_dir = report_dir
        self._described_rounds: set[str] = set()

    def describe(self, result: RunResult, local_ranks: set[int]) -> JobFailed:
        """Describe the failed round ``result`` (this machine's processes: ``local_ranks``)."""
        reports = self._take_reports()
        round_store = self._round_store()
        record = read_abort(round_store) if round_store is not None else None
        if record is not None:
            message = record["message"]
            if record["rank"] not in local_ranks:
                message = f"the job was stopped from another machine: {message}"
            return JobFailed(message, record["rank"], record["exit_code"], record["kind"])
        rank, failure = min(result.failures.items()) if result.failures else (None, None)
        code = failure.exitcode if failure is not None else 1
        codes = {r["exit_code"] for r in reports.values()} | {code}
        if codes == {PREEMPTED_EXIT_CODE}:
            return JobFailed(_PREEMPTED, rank, PREEMPTED_EXIT_CODE, "preempted")
        if code == NON_FINITE_EXIT_CODE and reports.get(rank, {}).get("message"):
            return JobFailed(reports[rank]["message"], rank, code, "non_finite")
        if code == USAGE_EXIT_CODE and rank in reports:  # before it joined the job's store
            return JobFailed(reports[rank]["message"], rank, code, "usage")
        if code < 0:
            name = signal.Signals(-code).name
            message = f"rank {rank} was killed by signal {name} (exit code {code}); no traceback."
        elif reports.get(rank, {}).get("message"):
            message = reports[rank]["message"]
        else:
            message = f"rank {rank} exited with status {code} without a Python exception."
        code = code if code > 0 else 1
        if round_store is not None:  # the other machines stop their processes on it
            record = {"rank": rank, "message": message, "exit_code": code, "kind": "error"}
            post_abort(round_store, record)
        return JobFailed(message, rank, code)

    def describe_signal(self, signum: int) -> JobFailed:
        """Describe the end of a job whose launcher received ``signum``."""
        codes = {r["exit_code"] for r in self._take_reports().values()}
        if codes == {PREEMPTED_EXIT_CODE}:
            return JobFailed(_PREEMPTED, None, PREEMPTED_EXIT_CODE, "preempted")
        name = signal.Signals(signum).name
        return JobFailed(f"the launcher was stopped by {name}", None, 128 + signum, "signal")

    def _round_store(self) -> Store | None:
        """The namespace of the round that just failed (None if unknown or unreachable)."""
        try:
            key = self._store.get(ROUND_KEY) if self._store.check([ROUND_KEY]) else None
        except Exception:  # machine 0 (and its store) may be gone
            return None
        prefix = key.decode() if key is not None else None
        if prefix is None or prefix in self._described_rounds:
            return None  # the processes failed before they opened a new round
        self._described_rounds.add(prefix)
        return PrefixStore(prefix, self._store)

    def _take_reports(self) -> dict[int, dict[str, Any]]:
        """Read (and remove, so a later round starts clean) what the processes reported."""
        reports = {}
        for name in os.listdir(self._report_dir):
            if name.startswith("rank") and name.endswith(".json"):
                path = os.path.join(self._report_dir, name)
                with open(path) as f:
                    reports[int(name[4:-5])] = json.load(f)
                os.remove(path)
        return reports


@contextlib.contextmanager
def _forwarded_signals() -> Iterator[None]:
    """Let the agent pass these signals on to the processes; restore the handlers after.

    SIGUSR1 is SLURM's warning before the time limit (``sbatch --signal=USR1@90``).
    """
    names = _FORWARDED_SIGNALS.split(",")
    in_main = threading.current_thread() is threading.main_thread()
    handlers = {n: signal.getsignal(getattr(signal, n)) for n in names} if in_main else {}
    previous = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = _FORWARDED_SIGNALS
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
        else:
            os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = previous
        for name, handler in handlers.items():
            signal.signal(getattr(signal, name), handler)


@contextlib.contextmanager
def _quiet_elastic_logs() -> Iterator[None]:
    """Keep torch's agent from logging each stop and restart: launch reports them itself.

    Set ``LOGLEVEL`` (torch elastic's own variable) to see its logs.
    """
    if os.environ.get("LOGLEVEL"):
        yield
        return
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing")]
    saved = [(lg.propagate, list(lg.handlers)) for lg in loggers]
    for lg in loggers:
        lg.propagate = False
        lg.handlers = [logging.NullHandler()]
    try:
        yield
    finally:
        for lg, (propagate, handlers) in zip(loggers, saved):
            lg.propagate, lg.handlers = propagate, handlers


# ---- in each spawned process ---------------------------------------------------------------
def _spawned_process(job: _Job) -> Any:
    """Entry point of a process the agent spawned: run the job, report how it ended."""
    # Signals reach a process only through the launcher, which forwards each one once; a
    # Ctrl-C in the terminal would otherwise hit every process twice.
    os.setpgrp()
    # What torchrun's agent would say; this round's agent is new and counts no restarts.
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(job.restart_count)
    os.environ["TORCHELASTIC_MAX_RESTARTS"] = str(job.max_restarts)
    env = JobEnvironment.from_environ(os.environ)
    assert env is not None  # the agent sets torchrun's variables
    if job.loopback:
        # Gloo's peer connections on the loopback interface as well: the hostname may
        # resolve to an external address, which a single-machine job has no reason to use.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if not torch.cuda.is_available() and "OMP_NUM_THREADS" not in os.environ:
        # CPU processes share the machine's cores: N processes of cpu_count threads each
        # oversubscribe it N times over (measured: 5x slower with 2 processes on 2 cores).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.local_world_size))

    def report(code: int, message: str) -> None:
        with open(os.path.join(job.report_dir, f"rank{env.rank}.json"), "w") as f:
            json.dump({"exit_code": code, "message": message}, f)

    def on_abort(record: dict[str, Any]) -> None:
        report(record["exit_code"], f"stopped: {record['message']}")
        os._exit(record["exit_code"])

    try:
        value = run_in_job(job.main_func, job.args, job.timeout, env, on_abort=on_abort)
    except UsageError as e:
        report(USAGE_EXIT_CODE, user_message(e))
        raise SystemExit(USAGE_EXIT_CODE) from None
    except BaseException as e:  # report everything, KeyboardInterrupt and SystemExit included
        code = exit_code_of(e) or 1  # pre-emption carries the status to end with
        report(code, f"rank {env.rank} raised an exception:\n{traceback.format_exc()}")
        raise SystemExit(code) from None
    try:
        pickle.dumps(value)
    except Exception:  # an unpicklable return value is not a failure of the job
        return None
    return value
