"""Start a job of one process per GPU (or per CPU slot) on each machine.

What happens on a machine, in order:

1. the launcher validates its arguments, and (on machine 0) binds the rendezvous store
   itself: for ``dist_url="auto"`` on ``127.0.0.1`` port 0, so jobs started at the same
   moment never race for a port; for ``tcp://host:port`` on that address, so a clash is
   reported in the launcher, at once, naming the address;
2. it spawns the workers; each connects to the store, joins the process group (NCCL with
   CUDA, Gloo without), creates the per-machine group, picks its GPU from the local rank,
   waits at a barrier, and calls ``main_func(*args)``;
3. it watches the workers: when one raises or dies, every worker on the machine is
   stopped, the failure is posted to the store so the other machines stop theirs too, and
   :class:`LaunchError` is raised naming the failed rank with its traceback.

Under ``torchrun`` (its environment variables set) nothing is spawned: the process joins
through ``env://`` and torchrun's agent does the watching.

A job that only prints its config (``--print-config``) starts no process at all:
``main_func`` runs once, here, and ``default_setup`` prints and exits.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from typing import Any, Callable
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from trainkit.engine.preemption import PREEMPTED_EXIT_CODE
from trainkit.engine.watchdog import (
    HEARTBEAT_KEY,
    WATCHDOG_EXIT_CODE,
    describe_stall,
    find_stalled_rank,
)
from trainkit.utils import comm
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
    "RendezvousTimeoutError",
    "check_launch_arguments",
    "get_job_store",
    "launch",
]


def get_job_store() -> dist.Store | None:
    """Return the job's key-value store in a worker started by :func:`launch`, else None."""
    return _JOB_STORE


logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
"""How long a collective may wait for its peers before it fails."""

_TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_ABORT_KEY = "trainkit/launch/abort"
_DONE_KEY = "trainkit/launch/done"
_POLL_S = 0.1
_WATCHDOG_POLL_S = 1.0

# The job's rendezvous store in a worker started by launch() (None elsewhere); the
# progress watchdog publishes through it.
_JOB_STORE: dist.Store | None = None
_GRACE_S = 3.0


class LaunchArgumentError(UsageError, ValueError):
    """Arguments ``launch`` cannot run (flags the user passed); the message names the flag."""


class RendezvousTimeoutError(UsageError, TimeoutError):
    """Machine 0's rendezvous could not be reached in time (a wrong --dist-url, or it is down)."""


class LaunchError(RuntimeError):
    """A process of the job failed; the message names its rank and shows its traceback.

    Attributes:
        rank: global rank of the first process that failed (None if unknown).
        exit_code: the status the job should end with: the failed worker's own exit status
            when it chose one (pre-emption: 75), else 1.
    """

    def __init__(self, message: str, rank: int | None = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code


def launch(
    main_func: Callable[..., Any],
    num_gpus_per_machine: int,
    num_machines: int = 1,
    machine_rank: int = 0,
    dist_url: str | None = None,
    args: Sequence[Any] = (),
    timeout: datetime.timedelta = DEFAULT_TIMEOUT,
    *,
    rendezvous_timeout_s: float = 300.0,
) -> list[Any]:
    """Run ``main_func(*args)`` in every process of a (possibly multi-machine) job.

    Args:
        main_func: a module-level function (it is pickled into spawned processes).
        num_gpus_per_machine: processes per machine; without CUDA, CPU processes on Gloo.
        num_machines: machines in the job.
        machine_rank: this machine's index in ``[0, num_machines)``.
        dist_url: ``"auto"`` (or None): a private rendezvous on 127.0.0.1, single machine
            only; ``"tcp://HOST:PORT"``: machine 0 serves the rendezvous on that address
            and the others connect to it; ``"env://"``: use ``MASTER_ADDR``/``MASTER_PORT``.
        args: arguments for ``main_func``; must be picklable.
        timeout: how long a collective waits for its peers.
        rendezvous_timeout_s: how long a process waits to reach the rendezvous store (for
            example for machine 0 to come up) before failing with the address.

    Returns:
        The return values of ``main_func`` of this machine's processes, by local rank
        (values that cannot be pickled come back as None).

    Raises:
        UsageError: On impossible arguments, or when a process stopped on a user error
            (its one-line message); the script then exits with status 2.
        LaunchError: When a process of the job raised or died; names the global rank.

    When ``args`` holds the parsed command line of ``--print-config`` (an object whose
    ``print_config`` is True), ``main_func(*args)`` runs once in this process, without a
    process group: ``default_setup`` prints the config for the world size the flags ask
    for and exits, so no worker needs to start.
    """
    install_usage_error_handler()
    if any(getattr(arg, "print_config", False) is True for arg in args):
        return [main_func(*args)]
    if _started_by_torchrun():
        return [_run_under_torchrun(main_func, args, timeout)]
    check_launch_arguments(num_gpus_per_machine, num_machines, machine_rank, dist_url)
    world_size = num_machines * num_gpus_per_machine
    if world_size == 1:
        if torch.cuda.is_available():
            torch.cuda.set_device(0)
        return [main_func(*args)]
    dist_url = "auto" if dist_url in (None, "") else dist_url
    with _Rendezvous(dist_url, machine_rank, rendezvous_timeout_s) as rendezvous:
        spec = _WorkerSpec(
            main_func=main_func,
            args=tuple(args),
            num_gpus_per_machine=num_gpus_per_machine,
            machine_rank=machine_rank,
            world_size=world_size,
            store_host=rendezvous.host,
            store_port=rendezvous.port,
            use_loopback=rendezvous.is_loopback,
            timeout=timeout,
            rendezvous_timeout_s=rendezvous_timeout_s,
        )
        return _spawn_and_watch(spec, rendezvous)


def _started_by_torchrun() -> bool:
    return all(v in os.environ for v in _TORCHRUN_VARS)


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


def _default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def _run_under_torchrun(
    main_func: Callable[..., Any], args: Sequence[Any], timeout: datetime.timedelta
) -> Any:
    """Join the group torchrun prepared (``env://``) and run ``main_func`` in this process."""
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if world_size == 1:
        return main_func(*args)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=_default_backend(), init_method="env://", timeout=timeout)
    try:
        comm.create_local_process_group(local_world_size)
        comm.synchronize()
        return main_func(*args)
    finally:
        _shutdown_process_group()


# ---- the rendezvous store ------------------------------------------------------------
class _Rendezvous:
    """The TCP store of the job: served by machine 0's launcher, a client elsewhere."""

    def __init__(self, dist_url: str, machine_rank: int, timeout_s: float) -> None:
        self.store: dist.TCPStore | None = None
        self._timeout_s = timeout_s
        if dist_url == "auto":
            self.host, self.port, self.is_loopback = "127.0.0.1", 0, True
            self._serve(bind_host="127.0.0.1", timeout_s=timeout_s)
            return
        url = urlparse(dist_url)
        if url.scheme == "env":
            host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
            if not host or not port:
                raise LaunchArgumentError(
                    "dist_url='env://' needs MASTER_ADDR and MASTER_PORT to be set."
                )
            url = urlparse(f"tcp://{host}:{port}")
        if url.scheme != "tcp" or not url.hostname or not url.port:
            raise LaunchArgumentError(
                f"--dist-url {dist_url!r} is not understood; use 'auto' on one machine or "
                f"'tcp://HOST:PORT' (the address of machine 0) for several."
            )
        self.host, self.port = url.hostname, url.port
        self.is_loopback = _is_loopback(self.host)
        if machine_rank == 0:
            self._serve(bind_host=self.host, timeout_s=timeout_s)
        else:
            self.store = _connect_store(self.host, self.port, timeout_s)

    def _serve(self, bind_host: str, timeout_s: float) -> None:
        sock = socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET)
        try:
            sock.bind((bind_host, self.port))
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise LaunchArgumentError(
                    f"tcp://{bind_host}:{self.port} is already in use (another job or program "
                    f"holds the port); choose another port in --dist-url."
                ) from None
            if e.errno != errno.EADDRNOTAVAIL:
                raise LaunchArgumentError(
                    f"cannot listen on tcp://{bind_host}:{self.port}: {e.strerror}"
                ) from None
            # The host names this machine only indirectly (a DNS alias, a NAT address):
            # let the store listen on every interface instead.
            self.store = dist.TCPStore(
                self.host,
                self.port,
                None,
                True,
                datetime.timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
            return
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        # The store takes ownership of the descriptor (and closes it when it is destroyed).
        self.store = dist.TCPStore(
            bind_host,
            self.port,
            None,
            True,
            datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
            master_listen_fd=sock.detach(),
        )

    def failure(self) -> str | None:
        """Return the failure another machine posted, or None."""
        assert self.store is not None
        try:
            if self.store.check([_ABORT_KEY]):
                return self.store.get(_ABORT_KEY).decode()
        except (RuntimeError, dist.DistError) as e:
            return f"lost the connection to the rendezvous store on machine 0 ({e})"
        return None

    def post_failure(self, message: str) -> None:
        assert self.store is not None
        with contextlib.suppress(RuntimeError, dist.DistError):
            self.store.set(_ABORT_KEY, message)

    def finish(self, machine_rank: int, num_machines: int) -> None:
        """Report this machine done; machine 0 keeps serving the store until all are done.

        Without this, machine 0 could close the store while another machine's workers are
        still shutting down, and that machine's launcher would take the lost store for a
        failure.
        """
        assert self.store is not None
        with contextlib.suppress(RuntimeError, dist.DistError):
            self.store.set(f"{_DONE_KEY}/{machine_rank}", "1")
        if machine_rank != 0 or num_machines == 1:
            return
        pending = [f"{_DONE_KEY}/{m}" for m in range(1, num_machines)]
        deadline = time.monotonic() + self._timeout_s
        while pending and time.monotonic() < deadline:
            failure = self.failure()
            if failure is not None:
                raise LaunchError(f"the job was stopped from another machine: {failure}")
            pending = [k for k in pending if not self.store.check([k])]
            time.sleep(_POLL_S)

    def __enter__(self) -> _Rendezvous:
        return self

    def __exit__(self, *exc: object) -> None:
        self.store = None


def _is_loopback(host: str) -> bool:
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def _connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    try:
        return dist.TCPStore(host, port, None, False, datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, dist.DistError):
        raise RendezvousTimeoutError(
            f"could not reach the rendezvous at tcp://{host}:{port} within {timeout_s:.0f} s. "
            f"Check that machine 0 was started with the same --dist-url and that the address "
            f"is reachable from this machine."
        ) from None


# ---- the workers -----------------------------------------------------------------------
class _WorkerSpec:
    """Everything a spawned worker needs; pickled into each process."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


def _spawn_and_watch(spec: Any, rendezvous: _Rendezvous) -> list[Any]:
    # Read by OpenMP when torch loads in each worker: idle OpenMP threads that spin after
    # every parallel region steal the cores loader workers need (measured: 8x slower
    # training with 2 workers on 2 cores). Set it yourself to override.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="trainkit-launch-") as report_dir:
        processes = []
        for local_rank in range(spec.num_gpus_per_machine):
            p = ctx.Process(
                target=_worker_entry,
                args=(local_rank, spec, report_dir),
                daemon=False,
                name=f"trainkit-rank{spec.machine_rank * spec.num_gpus_per_machine + local_rank}",
            )
            p.start()
            processes.append(p)
        try:
            with _forward_signals(processes):
                _watch(processes, spec, rendezvous, report_dir)
        finally:
            _stop_all(processes)
        rendezvous.finish(spec.machine_rank, spec.world_size // spec.num_gpus_per_machine)
        return [_read_result(report_dir, r) for r in range(spec.num_gpus_per_machine)]


def _watch(processes: list, spec: Any, rendezvous: _Rendezvous, report_dir: str) -> None:
    """Wait for every worker; on the first failure anywhere in the job, raise LaunchError."""
    running = {p.sentinel: (i, p) for i, p in enumerate(processes)}
    heartbeats = _HeartbeatReader(rendezvous, spec.world_size) if spec.machine_rank == 0 else None
    while running:
        ready = multiprocessing.connection.wait(list(running), timeout=_POLL_S)
        failed = []
        for sentinel in ready:
            local_rank, p = running.pop(sentinel)
            p.join()
            if p.exitcode != 0:
                failed.append((local_rank, p.exitcode))
        if failed:
            failures = _collect_failures(failed, running, spec, report_dir)
            usage = _usage_error(failed, spec, report_dir)
            if usage is not None:
                rendezvous.post_failure(_USAGE_PREFIX + usage)
                raise UsageError(usage)
            rank, message = failures[0]
            if len(failures) > 1:
                others = ", ".join(f"rank {r}" for r, _ in failures[1:])
                message += f"\n(then {others} failed as a consequence)"
            rendezvous.post_failure(message)
            codes = {code for _, code in failed}
            exit_code = codes.pop() if len(codes) == 1 and min(codes) > 1 else 1
            if exit_code == PREEMPTED_EXIT_CODE:
                message = (
                    "the job was pre-empted after saving a checkpoint; run the same command "
                    "with --resume to continue."
                )
            raise LaunchError(message, rank=rank, exit_code=exit_code)
        remote = rendezvous.failure()
        if remote is not None and running:
            if remote.startswith(_USAGE_PREFIX):
                raise UsageError(remote[len(_USAGE_PREFIX) :])
            raise LaunchError(f"the job was stopped from another machine: {remote}")
        stalled = heartbeats.stalled() if heartbeats is not None else None
        if stalled is not None:
            message = describe_stall(stalled, stalled["timeout_s"])
            rendezvous.post_failure(message)
            raise LaunchError(message, rank=stalled["rank"], exit_code=WATCHDOG_EXIT_CODE)


class _HeartbeatReader:
    """Machine 0's view of every rank's progress record (see ``trainkit.engine.watchdog``)."""

    def __init__(self, rendezvous: _Rendezvous, world_size: int) -> None:
        self._store = rendezvous.store
        self._world_size = world_size
        self._next_read = 0.0

    def stalled(self) -> dict[str, Any] | None:
        now = time.monotonic()
        if now < self._next_read or self._store is None:
            return None
        self._next_read = now + _WATCHDOG_POLL_S
        records = []
        for rank in range(self._world_size):
            key = HEARTBEAT_KEY.format(rank=rank)
            try:
                if not self._store.check([key]):
                    continue
                raw = self._store.get(key).decode()
            except (RuntimeError, dist.DistError):
                return None
            record = json.loads(raw)
            # From the phase's start time rather than the published duration: exact between
            # records published at different moments, and still growing for a frozen process.
            record["elapsed_s"] = time.time() - record["started_at"]
            records.append(record)
        timeouts = [r["timeout_s"] for r in records if r["timeout_s"] > 0]
        return find_stalled_rank(records, min(timeouts)) if timeouts else None


# Failures that are the echo of another rank's death: the peer's socket closed under a
# collective. When a rank raises, its peers often fail this way within milliseconds, and
# whichever exit the launcher sees first must not be blamed.
_SECONDARY_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "DistBackendError",
    "DistNetworkError",
    "Broken pipe",
    "NCCL communicator was aborted",
)
_SETTLE_S = 1.0


def _collect_failures(failed: list, running: dict, spec: Any, report_dir: str) -> list:
    """Return (rank, message) for every failed worker, the root cause first.

    Waits up to ``_SETTLE_S`` for the other workers to exit too, so that a rank that died
    first but was noticed second is still named as the cause.
    """
    deadline = time.monotonic() + _SETTLE_S
    while running and time.monotonic() < deadline:
        for sentinel in multiprocessing.connection.wait(list(running), timeout=_POLL_S):
            local_rank, p = running.pop(sentinel)
            p.join()
            if p.exitcode != 0:
                failed.append((local_rank, p.exitcode))
    failures = []
    for local_rank, exitcode in failed:
        rank = spec.machine_rank * spec.num_gpus_per_machine + local_rank
        failures.append((rank, _describe_failure(rank, exitcode, report_dir, local_rank)))
    failures.sort(key=lambda item: any(m in item[1] for m in _SECONDARY_MARKERS))
    return failures


@contextlib.contextmanager
def _forward_signals(processes: list) -> Iterator[None]:
    """Pass SIGTERM/SIGINT received by the launcher on to every worker (once each)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: object) -> None:
        del frame
        logger.warning(
            "Launcher received %s; forwarding it to the workers", signal.Signals(signum).name
        )
        for p in processes:
            if p.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


_USAGE_PREFIX = "usage error: "


def _usage_error(failed: list, spec: Any, report_dir: str) -> str | None:
    """The message of the lowest-ranked worker here that stopped on a UsageError, if any."""
    for local_rank, exitcode in sorted(failed):
        path = os.path.join(report_dir, f"usage{local_rank}.txt")
        if exitcode == USAGE_EXIT_CODE and os.path.exists(path):
            with open(path) as f:
                return f.read()
    return None


def _describe_failure(rank: int, exitcode: int, report_dir: str, local_rank: int) -> str:
    error_file = os.path.join(report_dir, f"error{local_rank}.txt")
    if os.path.exists(error_file):
        with open(error_file) as f:
            return f"rank {rank} raised an exception:\n{f.read()}"
    if exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"rank {rank} was killed by signal {name} (exit code {exitcode}); no traceback."
    return f"rank {rank} exited with status {exitcode} without a Python exception."


def _stop_all(processes: list) -> None:
    """Stop the workers still running: SIGTERM, then SIGKILL after a grace period."""
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        with contextlib.suppress(OSError):
            p.terminate()
    deadline = time.monotonic() + _GRACE_S
    for p in alive:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            with contextlib.suppress(OSError):
                p.kill()
            p.join()


def _read_result(report_dir: str, local_rank: int) -> Any:
    path = os.path.join(report_dir, f"result{local_rank}.pkl")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return pickle.load(f)


def _worker_entry(local_rank: int, spec: Any, report_dir: str) -> None:
    _die_with_parent()
    # Signals reach a worker only through the launcher, which forwards each one once; a
    # Ctrl-C in the terminal would otherwise hit every process twice (directly and forwarded).
    os.setpgrp()
    rank = spec.machine_rank * spec.num_gpus_per_machine + local_rank
    try:
        result = _worker_main(local_rank, rank, spec)
    except UsageError as e:
        # The user's mistake, not a crash: one line for the launcher, no traceback.
        with open(os.path.join(report_dir, f"usage{local_rank}.txt"), "w") as f:
            f.write(user_message(e))
        raise SystemExit(USAGE_EXIT_CODE) from None
    except BaseException as e:  # report everything, KeyboardInterrupt and SystemExit included
        with open(os.path.join(report_dir, f"error{local_rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        # An exception may carry the status the job should end with (pre-emption does).
        code = getattr(e, "exit_code", None)
        raise SystemExit(code if isinstance(code, int) and code > 0 else 1) from None
    try:
        payload = pickle.dumps(result)
    except Exception:  # an unpicklable return value is not a failure of the job
        payload = pickle.dumps(None)
    with open(os.path.join(report_dir, f"result{local_rank}.pkl"), "wb") as f:
        f.write(payload)


def _worker_main(local_rank: int, rank: int, spec: Any) -> Any:
    if spec.use_loopback:
        # Keep Gloo's peer connections on the loopback interface as well: the hostname may
        # resolve to an external address, which a single-machine job has no reason to use.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    backend = _default_backend()
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        # CPU processes share the machine's cores: N processes of cpu_count threads each
        # oversubscribe it N times over, and a step then stalls (measured: 5x slower with 2
        # processes on 2 cores). torchrun makes the same choice by setting OMP_NUM_THREADS.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.num_gpus_per_machine))
    global _JOB_STORE
    store = _connect_store(spec.store_host, spec.store_port, spec.rendezvous_timeout_s)
    _JOB_STORE = store
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore("trainkit/pg", store),
        rank=rank,
        world_size=spec.world_size,
        timeout=spec.timeout,
    )
    try:
        comm.create_local_process_group(spec.num_gpus_per_machine)
        comm.synchronize()
        return spec.main_func(*spec.args)
    finally:
        _shutdown_process_group()
        _JOB_STORE = None


def _shutdown_process_group() -> None:
    comm.reset_local_process_group()
    if dist.is_initialized():
        dist.destroy_process_group()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker if the launcher dies, so no worker is orphaned."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
