"""Start a job of one process per GPU (or per CPU slot) on each machine, and restart it.

How a job starts, by what ``launch`` finds:

* started by ``torchrun`` (its variables set), or as one task of an ``srun`` step of several
  tasks: nothing is spawned; this process joins the job (:mod:`trainkit.engine.job`) and
  runs ``main_func``. torchrun's agent (or SLURM) watches the processes.
* one process and no restarts: ``main_func`` runs in this process.
* otherwise: torch.distributed.elastic's agent spawns the processes of this machine and
  watches them. Machine 0's launcher serves the job's store (the rendezvous); the others
  connect to it. When a process fails, the agent stops this machine's processes, the
  failure is posted to the store so every machine stops its processes too, and either the
  job restarts (``max_restarts`` not used up; a restarted job resumes from its newest
  checkpoint by itself, see ``DefaultTrainer.resume_or_load``) or :class:`LaunchError`
  names the failed rank and shows its traceback. A user error (exit status 2) and a
  pre-emption (75) are never retried.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlparse

import torch
from torch.distributed import PrefixStore
from torch.distributed.elastic.agent.server import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
)

from trainkit.engine.job import (
    ROUND_KEY,
    JobEnvironment,
    RendezvousAddressError,
    RendezvousTimeoutError,
    connect_store,
    post_abort,
    read_abort,
    run_in_job,
    serve_store,
)
from trainkit.engine.preemption import PREEMPTED_EXIT_CODE
from trainkit.engine.slurm import slurm_variables
from trainkit.utils.errors import (
    USAGE_EXIT_CODE,
    UsageError,
    install_usage_error_handler,
    user_message,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "LaunchArgumentError",
    "LaunchError",
    "RendezvousAddressError",
    "RendezvousTimeoutError",
    "check_launch_arguments",
    "launch",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
"""How long a collective may wait for its peers before it fails."""

_MONITOR_S = 0.1
# Pre-emption: how long the processes get, after the launcher forwarded a signal, to finish
# their step and save a checkpoint before they are killed.
_SIGNAL_GRACE_S = 120
_FORWARDED_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


class LaunchArgumentError(UsageError, ValueError):
    """Arguments ``launch`` cannot run (flags the user passed); the message names the flag."""


class LaunchError(RuntimeError):
    """A process of the job failed; the message names its rank and shows its traceback.

    Attributes:
        rank: global rank of the first process that failed (None if unknown).
        exit_code: the status the job should end with: the failed worker's own exit status
            when it chose one (pre-emption: 75, a stall: 124), else 1.
    """

    def __init__(self, message: str, rank: int | None = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code


@dataclass(frozen=True)
class _Job:
    """What a spawned process runs; pickled into each one."""

    main_func: Callable[..., Any]
    args: tuple[Any, ...]
    timeout: datetime.timedelta
    report_dir: str
    loopback: bool


@dataclass(frozen=True)
class _Failure:
    """The first failure of a round, as the user is told about it."""

    rank: int | None
    message: str
    exit_code: int
    kind: str = "error"  # "usage", "stall", "preempted", "signal"

    def exception(self) -> Exception:
        if self.kind == "usage":
            return UsageError(self.message)
        return LaunchError(self.message, rank=self.rank, exit_code=self.exit_code)


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    args: Sequence[Any] = (),
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    max_restarts: int = 0,
    *,
    rendezvous_timeout_s: float = 300.0,
) -> list[Any]:
    """Run ``main_func(*args)`` in every process of a (possibly multi-machine) job.

    Args:
        main_func: a module-level function (it is pickled into spawned processes).
        num_gpus_per_machine: processes per machine; without CUDA, CPU processes on Gloo.
            Ignored under torchrun and srun, whose environment decides.
        num_machines: machines in the job.
        machine_rank: this machine's index in ``[0, num_machines)``.
        dist_url: ``"auto"`` (or None): a private rendezvous on 127.0.0.1, single machine
            only; ``"tcp://HOST:PORT"``: machine 0 serves the rendezvous on that address
            and the others connect to it; ``"env://"``: use ``MASTER_ADDR``/``MASTER_PORT``.
        args: arguments for ``main_func``; must be picklable.
        timeout: how long a collective waits for its peers.
        max_restarts: how many times the job is restarted after a failure (on every
            machine); each restart runs ``main_func`` again, in new processes.
        rendezvous_timeout_s: how long a machine waits for machine 0's rendezvous (and,
            at the end, for the other machines to finish) before failing with the address.

    Returns:
        The return values of ``main_func`` of this machine's processes, by local rank
        (values that cannot be pickled come back as None).

    Raises:
        UsageError: On impossible arguments, or when a process stopped on a user error
            (its one-line message); the script then exits with status 2.
        LaunchError: When a process of the job raised or died and no restart is left;
            names the global rank.
    """
    install_usage_error_handler()
    slurm = slurm_variables(os.environ, num_gpus_per_machine)
    if slurm is not None:
        os.environ.update(slurm)  # a SLURM task is a process of the job, as under torchrun
    env = JobEnvironment.from_environ(os.environ)
    if env is not None:
        return [run_in_job(main_func, args, timeout, env)]
    check_launch_arguments(num_gpus_per_machine, num_machines, machine_rank, dist_url)
    if max_restarts < 0:
        raise LaunchArgumentError(f"--max-restarts must be at least 0, got {max_restarts}.")
    if num_machines * num_gpus_per_machine == 1 and max_restarts == 0:
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        return [main_func(*args)]
    host, port = _rendezvous_address(dist_url)
    with tempfile.TemporaryDirectory(prefix="trainkit-launch-") as tmp, _quiet_elastic_logs():
        rendezvous = _Rendezvous(host, port, machine_rank, num_machines, rendezvous_timeout_s)
        job = _Job(main_func, tuple(args), timeout, tmp, loopback=_is_loopback(host))
        spec = WorkerSpec(
            role="trainkit",
            local_world_size=num_gpus_per_machine,
            rdzv_handler=rendezvous,
            entrypoint=_spawned_process,
            args=(job,),
            max_restarts=max_restarts,
            monitor_interval=_MONITOR_S,
        )
        logs = DefaultLogsSpecs(log_dir=os.path.join(tmp, "logs"))
        agent = _Agent(spec, rendezvous, tmp, logs, rendezvous_timeout_s)
        return agent.run_job(num_machines)


def check_launch_arguments(
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
) -> None:
    """Raise, with the flag to change, if :func:`launch` cannot run these arguments.

    Raises:
        LaunchArgumentError: A ``UsageError`` (and ``ValueError``) naming the flag.
    """
    if num_gpus_per_machine < 1:
        raise LaunchArgumentError(f"--num-gpus must be at least 1, got {num_gpus_per_machine}.")
    if num_machines < 1:
        raise LaunchArgumentError(f"--num-machines must be at least 1, got {num_machines}.")
    if not 0 <= machine_rank < num_machines:
        raise LaunchArgumentError(
            f"--machine-rank {machine_rank} is out of range for --num-machines {num_machines}; "
            f"use 0 ... {num_machines - 1}."
        )
    if torch.cuda.is_available() and num_gpus_per_machine > torch.cuda.device_count():
        raise LaunchArgumentError(
            f"--num-gpus {num_gpus_per_machine} asks for more GPUs than this machine shows "
            f"({torch.cuda.device_count()}; CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}). Lower --num-gpus."
        )
    if dist_url in (None, "", "auto") and num_machines > 1:
        raise LaunchArgumentError(
            "--dist-url auto works on one machine only; for several machines pass "
            "--dist-url tcp://HOST:PORT with the address of machine 0."
        )
    if dist_url not in (None, "", "auto") and not dist_url.startswith(("tcp://", "env://")):
        raise LaunchArgumentError(
            f"--dist-url {dist_url!r} is not understood; use 'auto' on one machine or "
            f"'tcp://HOST:PORT' (the address of machine 0) for several."
        )


def _rendezvous_address(dist_url: str | None) -> tuple[str, int]:
    if dist_url in (None, "", "auto"):
        return "127.0.0.1", 0
    if dist_url.startswith("env://"):
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            raise LaunchArgumentError("dist_url='env://' needs MASTER_ADDR and MASTER_PORT set.")
        dist_url = f"tcp://{host}:{port}"
    url = urlparse(dist_url)
    if url.scheme != "tcp" or not url.hostname or not url.port:
        raise LaunchArgumentError(
            f"--dist-url {dist_url!r} is not understood; use 'auto' on one machine or "
            f"'tcp://HOST:PORT' (the address of machine 0) for several."
        )
    return url.hostname, url.port


def _is_loopback(host: str) -> bool:
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


# ---- on torch.distributed.elastic -------------------------------------------------------
class _Rendezvous(RendezvousHandler):
    """The rendezvous of a ``launch`` job: fixed machines, each keeping its machine rank.

    Machine 0's launcher serves the job's store before any process starts (for
    ``dist_url="auto"`` on 127.0.0.1 port 0: concurrent jobs never race for a port and
    nothing listens outside the machine; a port in use is reported at once), the others
    connect to it. torch's static rendezvous does the same but listens on every interface
    and reports neither case by address. Elastic membership is torchrun's c10d rendezvous.
    """

    def __init__(
        self, host: str, port: int, machine_rank: int, num_machines: int, timeout_s: float
    ) -> None:
        self.host, self.machine_rank, self.num_machines = host, machine_rank, num_machines
        self.run_id = uuid.uuid4().hex
        if machine_rank == 0:
            self.store, self.port = serve_store(host, port, timeout_s)
        else:
            self.store, self.port = connect_store(host, port, timeout_s), port

    def get_backend(self) -> str:
        return "trainkit"

    @property
    def use_agent_store(self) -> bool:
        return True  # the processes use this store (it outlives them: see job._agree_on_round)

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


class _Stopped(Exception):
    """Ends the agent's run without a restart (a user error, a pre-emption)."""


class _Agent(LocalElasticAgent):
    """torch's agent for this machine's processes, plus what a trainkit job promises.

    Each failure is described once (the round's first failure posted in the store, else
    what the agent saw) and posted for the other machines; user errors and pre-emption end
    the job instead of being retried.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        rendezvous: _Rendezvous,
        report_dir: str,
        logs: DefaultLogsSpecs,
        exit_barrier_s: float,
    ) -> None:
        super().__init__(
            spec,
            logs_specs=logs,
            start_method="spawn",
            exit_barrier_timeout=exit_barrier_s,
            shutdown_timeout=_SIGNAL_GRACE_S,
        )
        self._job_rendezvous = rendezvous
        self._report_dir = report_dir
        self._restarts_left = spec.max_restarts
        self.failure: _Failure | None = None

    def run_job(self, num_machines: int) -> list[Any]:
        """Run the job to its end; return this machine's results by local rank."""
        try:
            with _forwarded_signals():
                result = self.run()
        except _Stopped:
            pass
        except SignalException as e:
            self.failure = self._describe_signal(e.sigval)
        else:
            if not result.is_failed():
                return [result.return_values[r] for r in sorted(result.return_values)]
        assert self.failure is not None
        if num_machines > 1:
            time.sleep(1.0)  # keep serving the store until the other machines read the failure
        raise self.failure.exception()

    def _monitor_workers(self, worker_group: Any) -> RunResult:
        result = super()._monitor_workers(worker_group)
        if result.state not in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            return result
        self.failure = self._describe(result, worker_group)
        if self.failure.kind in ("usage", "preempted"):
            raise _Stopped()
        if self._restarts_left > 0:  # torch's agent restarts in this case, and counts it
            self._restarts_left -= 1
            logger.warning(
                "%s\nRestarting the job (restart %d of %d); it resumes from its newest checkpoint.",
                self.failure.message,
                worker_group.spec.max_restarts - self._restarts_left,
                worker_group.spec.max_restarts,
            )
        return result

    def _describe(self, result: RunResult, worker_group: Any) -> _Failure:
        reports = self._take_reports()
        round_store = self._round_store()
        record = read_abort(round_store) if round_store is not None else None
        local_ranks = {w.global_rank for w in worker_group.workers}
        if record is not None:
            message = record["message"]
            if record["rank"] not in local_ranks:
                message = f"the job was stopped from another machine: {message}"
            return _Failure(record["rank"], message, record["exit_code"], record["kind"])
        rank, failure = min(result.failures.items()) if result.failures else (None, None)
        code = failure.exitcode if failure is not None else 1
        codes = {r["exit_code"] for r in reports.values()} | {code}
        if codes == {PREEMPTED_EXIT_CODE}:
            return _Failure(rank, _PREEMPTED, PREEMPTED_EXIT_CODE, "preempted")
        if code == USAGE_EXIT_CODE and rank in reports:  # before it joined the job's store
            return _Failure(rank, reports[rank]["message"], code, "usage")
        if code < 0:
            name = signal.Signals(-code).name
            message = f"rank {rank} was killed by signal {name} (exit code {code}); no traceback."
        elif reports.get(rank, {}).get("message"):
            message = reports[rank]["message"]
        else:
            message = f"rank {rank} exited with status {code} without a Python exception."
        described = _Failure(rank, message, code if code > 0 else 1)
        if round_store is not None:  # the other machines stop their processes on it
            post_abort(
                round_store,
                {
                    "rank": rank,
                    "message": message,
                    "exit_code": described.exit_code,
                    "kind": "error",
                },
            )
        return described

    def _describe_signal(self, signum: int) -> _Failure:
        codes = {r["exit_code"] for r in self._take_reports().values()}
        if codes == {PREEMPTED_EXIT_CODE}:
            return _Failure(None, _PREEMPTED, PREEMPTED_EXIT_CODE, "preempted")
        name = signal.Signals(signum).name
        return _Failure(None, f"the launcher was stopped by {name}", 128 + signum, "signal")

    def _round_store(self) -> Any:
        try:
            if self._job_rendezvous.store.check([ROUND_KEY]):
                return PrefixStore(
                    self._job_rendezvous.store.get(ROUND_KEY).decode(), self._job_rendezvous.store
                )
        except Exception:  # machine 0 (and its store) may be gone
            return None
        return None

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


_PREEMPTED = (
    "the job was pre-empted after saving a checkpoint; run the same command with --resume "
    "to continue (a restarted or requeued job resumes by itself)."
)


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
        import traceback

        code = getattr(e, "exit_code", None)  # pre-emption carries the status to end with
        code = code if isinstance(code, int) and code > 0 else 1
        report(code, f"rank {env.rank} raised an exception:\n{traceback.format_exc()}")
        raise SystemExit(code) from None
    try:
        pickle.dumps(value)
    except Exception:  # an unpicklable return value is not a failure of the job
        return None
    return value
