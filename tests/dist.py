"""Run a function on every rank of a real multi-process Gloo job, with a hard timeout.

Every distributed test goes through :func:`run_on_ranks`, so none can hang the suite and all
talk only to 127.0.0.1.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_module
import signal
import socket
import traceback
from collections.abc import Sequence
from typing import Any, Callable

from trainkit.engine import launch


class RankFailure(RuntimeError):
    """A rank of the job failed; the message is the launcher's (rank and traceback)."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (for multi-machine tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launcher(
    queue: Any,
    fn: Callable,
    world_size_per_machine: int,
    num_machines: int,
    machine_rank: int,
    dist_url: str,
    args: Sequence[Any],
    max_restarts: int,
) -> None:
    os.setpgrp()  # so that a timeout can kill this launcher and its workers together
    try:
        results = launch(
            fn,
            world_size_per_machine,
            num_machines=num_machines,
            machine_rank=machine_rank,
            dist_url=dist_url,
            args=tuple(args),
            max_restarts=max_restarts,
            rendezvous_timeout_s=30.0,
        )
        # Plain pickle bytes: torch's queue reductions would share tensors through file
        # descriptors that vanish when this process exits.
        queue.put((machine_rank, "ok", pickle.dumps(results)))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the test
        queue.put((machine_rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *,
    args: Sequence[Any] = (),
    num_machines: int = 1,
    timeout_s: float = 60.0,
    max_restarts: int = 0,
) -> list[Any]:
    """Run ``fn(*args)`` on ``world_size`` ranks (split over ``num_machines`` launchers).

    Args:
        fn: a module-level function; it runs inside an initialised Gloo process group.
        world_size: total number of ranks.
        args: picklable arguments for ``fn``.
        num_machines: simulated machines, each a separate launcher process on 127.0.0.1.
        timeout_s: the whole job is killed and the test fails after this many seconds.
        max_restarts: passed to ``launch`` (restarts of the whole job after a failure).

    Returns:
        ``fn``'s return values, ordered by global rank.

    Raises:
        RankFailure: If any rank failed (the message holds the launcher's report).
        TimeoutError: If the job did not finish in time.
    """
    per_machine = world_size // num_machines
    dist_url = "auto" if num_machines == 1 else f"tcp://127.0.0.1:{free_port()}"
    # forkserver, not fork: by now the test process runs threads (loader queues, writers,
    # stores), and forking it while one holds a lock can deadlock the child. The server is a
    # clean process with torch and trainkit preloaded, so each launcher still starts fast
    # (the elastic agent too: importing trainkit.engine leaves it to launch()).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "trainkit.engine", "trainkit.launcher.elastic"])
    queue = ctx.Queue()
    launchers = [
        ctx.Process(
            target=_launcher,
            args=(queue, fn, per_machine, num_machines, m, dist_url, args, max_restarts),
        )
        for m in range(num_machines)
    ]
    for p in launchers:
        p.start()
    outcomes: dict[int, tuple[str, Any]] = {}
    try:
        for _ in launchers:
            machine, status, payload = queue.get(timeout=timeout_s)
            outcomes[machine] = (status, pickle.loads(payload) if status == "ok" else payload)
    except queue_module.Empty:
        raise TimeoutError(f"distributed job did not finish within {timeout_s} s") from None
    finally:
        for p in launchers:
            p.join(timeout=5)
            if p.is_alive():
                os.killpg(p.pid, signal.SIGKILL)
                p.join()
    errors = [payload for status, payload in outcomes.values() if status == "error"]
    if errors:
        raise RankFailure("\n".join(errors))
    return [r for m in range(num_machines) for r in outcomes[m][1]]
