"""A progress watchdog: which rank stopped making progress, in which phase, and for how long."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from typing_extensions import override

from trainkit.engine.events import StepListener
from trainkit.engine.hook_base import HookBase, HookPriority
from trainkit.launcher.protocol import HEARTBEAT_KEY, WATCHDOG_EXIT_CODE, describe_stall

__all__ = ["ProgressWatchdog"]

logger = logging.getLogger(__name__)

_PUBLISH_PERIOD_S = 1.0


class ProgressWatchdog(HookBase, StepListener):
    """Track this rank's phase and report a stall that lasts longer than ``timeout_s``.

    It records each phase the loop's events announce (:mod:`~trainkit.engine.events`) and when
    it started. As a hook, it runs a daemon thread from ``before_train`` to ``after_train``
    that publishes that every second to the job's store (under launch, torchrun or srun),
    where the job's guard applies :func:`~trainkit.launcher.protocol.find_stalled_rank` and
    ends every process with status 124, long before a collective would time out. In one
    process (no store) the thread checks this rank itself and ends the process with a message.

    Args:
        timeout_s: seconds one phase may last; 0 disables the watchdog.
        rank: this process's global rank.
        store: where to publish this rank's record (``trainkit.launcher.connect_job_store()``),
            or None to watch locally.
        clock: time source (tests inject one).
        on_local_stall: what to do on a local stall (default: log and end the process).
    """

    def __init__(
        self,
        timeout_s: float,
        rank: int,
        store: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_local_stall: Callable[[str], None] | None = None,
    ) -> None:
        self.timeout_s = float(timeout_s)
        self._rank = rank
        self._store = store
        self._clock = clock
        self._on_local_stall = on_local_stall or _exit_process
        self._phase, self._iteration, self._since = "start", -1, clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    priority = HookPriority.HIGHEST

    @property
    def enabled(self) -> bool:
        """Whether a timeout is set."""
        return self.timeout_s > 0

    @override
    def on_phase(self, phase: str, iteration: int) -> None:
        """Record that this rank starts ``phase`` of ``iteration`` (attribute writes only)."""
        self._phase, self._iteration, self._since = phase, iteration, self._clock()

    def record(self) -> dict[str, Any]:
        """Return this rank's current phase, iteration and seconds spent in the phase.

        ``started_at``, the phase's start on the wall clock, lets a reader in another process
        age a record that stopped being published (a frozen process).
        """
        elapsed_s = self._clock() - self._since
        return {
            "rank": self._rank,
            "phase": self._phase,
            "iteration": self._iteration,
            "elapsed_s": elapsed_s,
            "started_at": time.time() - elapsed_s,
            "timeout_s": self.timeout_s,
            "pid": os.getpid(),
        }

    def start(self) -> None:
        """Start the publishing/checking thread (no-op when disabled); ``before_train`` too."""
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="trainkit-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; ``after_train`` too."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    before_train = start
    after_train = stop

    def _run(self) -> None:
        while not self._stop.wait(_PUBLISH_PERIOD_S):
            record = self.record()
            if self._store is not None:
                with contextlib.suppress(Exception):  # the launcher may already be gone
                    self._store.set(HEARTBEAT_KEY.format(rank=self._rank), json.dumps(record))
            elif record["elapsed_s"] > self.timeout_s:
                self._on_local_stall(describe_stall(record, self.timeout_s))
                return


def _exit_process(message: str) -> None:
    logger.error("Watchdog: %s Ending this process.", message)
    logging.shutdown()
    os._exit(WATCHDOG_EXIT_CODE)
