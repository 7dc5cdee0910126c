"""The signal side of pre-emption: note the scheduler's stop signal, give up on a second one."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

__all__ = ["PreemptionSignal"]

logger = logging.getLogger(__name__)

# A signal delivered twice within this window (the scheduler signals the process and the
# launcher forwards the same signal) counts once.
_DEBOUNCE_S = 2.0


class PreemptionSignal:
    """Listen for stop signals in this process and remember the first one.

    A second one, later than a short debounce window, ends the process at once without a
    checkpoint. Acting on the first (agreeing between ranks, saving, stopping) is the
    trainer's: :class:`~trainkit.engine.hooks.preemption.PreemptionHandler`.

    Args:
        signals: the signals that ask for a stop.
        clock: time source for the debounce window (tests inject one).
    """

    def __init__(self, signals: Sequence[int], clock: Callable[[], float] = time.monotonic) -> None:
        self._signals = tuple(signals)
        self._clock = clock
        self._received: str | None = None
        self._received_at = 0.0
        self._previous: dict[int, Any] = {}

    @property
    def received(self) -> str | None:
        """The name of the first signal noted (``"SIGTERM"``), or None."""
        return self._received

    def note_signal(self, signal_name: str) -> None:
        """Note a stop signal (what the signal handler calls); a second one exits at once."""
        now = self._clock()
        if self._received is None:
            self._received, self._received_at = signal_name, now
            logger.warning(
                "Received %s: finishing the current step, then saving a checkpoint and stopping. "
                "Send it again to stop at once without saving.",
                signal_name,
            )
        elif now - self._received_at > _DEBOUNCE_S:
            logger.error("Received %s again: exiting now without a checkpoint.", signal_name)
            logging.shutdown()
            os._exit(128 + signal.Signals[signal_name].value)

    def install(self) -> None:
        """Handle the signals from now on (in the main thread; elsewhere keep the defaults)."""
        # Python only lets the main thread install handlers.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self._signals:
            self._previous[signum] = signal.signal(
                signum, lambda signum, _frame: self.note_signal(signal.Signals(signum).name)
            )

    def uninstall(self) -> None:
        """Restore the handlers that were installed before :meth:`install`."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
