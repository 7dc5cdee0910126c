"""Start a job of one process per GPU (or per CPU slot) on each machine, and restart it.

Imported with ``trainkit.engine``, so it stays light: torch.distributed.elastic, the job store
and SLURM's parsing are imported inside :func:`launch`, when it needs them.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Sequence
from typing import Any, Callable
from urllib.parse import urlparse

import torch

from trainkit.utils.errors import UsageError, install_usage_error_handler

__all__ = [
    "DEFAULT_TIMEOUT",
    "LaunchArgumentError",
    "LaunchError",
    "check_launch_arguments",
    "launch",
]

DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
"""How long a collective may wait for its peers before it fails."""


class LaunchArgumentError(UsageError, ValueError):
    """Arguments ``launch`` cannot run (flags the user passed); the message names the flag."""


class LaunchError(RuntimeError):
    """A process of the job failed; the message names its rank and shows its traceback.

    Attributes:
        rank: global rank of the first process that failed (None if unknown).
        exit_code: the status the job should end with: the failed process's own exit status
            when it chose one (pre-emption: 75, a stall: 124), else 1.
    """

    def __init__(self, message: str, rank: int | None = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.rank, self.exit_code = rank, exit_code


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

    How, by what it finds:

    * under ``torchrun`` (its variables set), or as one task of an ``srun`` step of several
      tasks: this process joins the job (:mod:`trainkit.launcher.job`) and runs
      ``main_func``; torchrun's agent (or SLURM) watches the processes.
    * one process and no restarts: ``main_func`` runs in this process.
    * otherwise torch.distributed.elastic's agent spawns and watches this machine's
      processes, and restarts the job after a failure (:mod:`trainkit.launcher.elastic`).
    * ``args`` holds the parsed command line of ``--print-config`` or ``--dry-run``:
      ``main_func(*args)`` runs once here, without a process group (``default_setup`` prints
      and exits), whatever the number of processes asked for.

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
    if any(
        getattr(arg, "print_config", False) is True or getattr(arg, "dry_run", False) is True
        for arg in args
    ):
        return [main_func(*args)]
    from trainkit.launcher.job import JobEnvironment, run_in_job
    from trainkit.launcher.slurm import slurm_variables

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
    from trainkit.launcher.elastic import JobFailed, run_agent

    host, port = _rendezvous_address(dist_url)
    try:
        loopback = socket.gethostbyname(host).startswith("127.")
    except OSError:
        loopback = False
    try:
        return run_agent(
            main_func,
            tuple(args),
            timeout,
            num_processes=num_gpus_per_machine,
            machine_rank=machine_rank,
            num_machines=num_machines,
            address=(host, port),
            loopback=loopback,
            max_restarts=max_restarts,
            rendezvous_timeout_s=rendezvous_timeout_s,
        )
    except JobFailed as e:
        if e.kind == "usage":
            raise UsageError(str(e)) from None
        raise LaunchError(str(e), rank=e.rank, exit_code=e.exit_code) from None


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
        raise _not_understood(dist_url)


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
        raise _not_understood(dist_url)
    return url.hostname, url.port


def _not_understood(dist_url: str) -> LaunchArgumentError:
    return LaunchArgumentError(
        f"--dist-url {dist_url!r} is not understood; use 'auto' on one machine or "
        f"'tcp://HOST:PORT' (the address of machine 0) for several."
    )
