"""Graceful pre-emption: on SIGTERM/SIGINT/SIGUSR1 finish the step, checkpoint, exit to resume.

Cluster schedulers send SIGTERM (SLURM: SIGUSR1 with ``sbatch --signal=USR1@90``; people
press Ctrl-C) some seconds before they kill a job. The first signal sets a flag; the ranks
agree on it at the next check, every rank finishes its current step, rank 0 writes a
checkpoint, all ranks wait for that write, and training stops with
:class:`TrainingPreempted` (exit status :data:`PREEMPTED_EXIT_CODE` from
``tools/train_net.py``). A second signal, later than a short debounce window, ends the
process at once without a checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable

from trainkit.checkpoint import Checkpointer
from trainkit.engine.train_loop import HookBase
from trainkit.utils import comm
from trainkit.utils.periodic import is_last_iter, is_period_end

if TYPE_CHECKING:
    from trainkit.engine.run_state import RunState

__all__ = ["PREEMPTED_EXIT_CODE", "PreemptionHandler", "TrainingPreempted"]

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 75
"""Exit status of a run stopped by a signal after saving a checkpoint (sysexits' TEMPFAIL)."""

# A signal delivered twice within this window (the scheduler signals the process and the
# launcher forwards the same signal) counts once.
_DEBOUNCE_S = 2.0


class TrainingPreempted(Exception):
    """Training stopped on a signal after a checkpoint was written; resume with --resume.

    Attributes:
        signal_name: the signal that asked for the stop.
        iteration: the last finished iteration (the one saved).
    """

    def __init__(self, signal_name: str, iteration: int, checkpoint: str | None) -> None:
        where = f" to {checkpoint}" if checkpoint else ""
        super().__init__(
            f"stopped by {signal_name} after iteration {iteration}; checkpoint saved{where}. "
            f"Run the same command with --resume to continue."
        )
        self.signal_name = signal_name
        self.iteration = iteration
        # launch() gives a worker that raised this the exit status below instead of 1.
        self.exit_code = PREEMPTED_EXIT_CODE


class PreemptionHandler(HookBase):
    """Turn SIGTERM/SIGINT/SIGUSR1 into "finish this step, save, stop" (during ``train``).

    Reads ``checkpointer`` from the trainer (DefaultTrainer's declared surface).

    Collective:
        With several ranks, the stop flags are all-gathered every ``sync_period`` iterations
        so every rank stops after the same iteration; the save is followed by a barrier.
    """

    def __init__(
        self,
        sync_period: int = 5,
        signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1),
        clock: Callable[[], float] = time.monotonic,
        *,
        run_state: RunState | None = None,
    ) -> None:
        """Configure the handler.

        Args:
            sync_period: iterations between agreements on the flag when there are several
                ranks (one process checks every iteration).
            signals: the signals that request a stop.
            clock: time source for the debounce window (tests inject one).
            run_state: the run state ``DefaultTrainer`` saves; its ``prepare_save`` runs on
                every rank right before the checkpoint is written.
        """
        self._run_state = run_state
        self._sync_period = sync_period
        self._signals = signals
        self._clock = clock
        self._requested: str | None = None
        self._requested_at = 0.0
        self._previous: dict[int, Any] = {}

    def request_stop(self, signal_name: str) -> None:
        """Ask for a graceful stop (what the signal handler calls)."""
        now = self._clock()
        if self._requested is None:
            self._requested, self._requested_at = signal_name, now
            logger.warning(
                "Received %s: finishing the current step, then saving a checkpoint and stopping. "
                "Send it again to stop at once without saving.",
                signal_name,
            )
        elif now - self._requested_at > _DEBOUNCE_S:
            logger.error("Received %s again: exiting now without a checkpoint.", signal_name)
            logging.shutdown()
            os._exit(128 + signal.Signals[signal_name].value)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.request_stop(signal.Signals(signum).name)

    def before_train(self) -> None:
        # Python only lets the main thread install handlers; elsewhere keep the defaults.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def after_train(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def after_step(self) -> None:
        trainer = self.trainer
        requested = self._requested
        if comm.get_world_size() > 1:
            if not (
                is_period_end(trainer.iter, self._sync_period)
                or is_last_iter(trainer.iter, trainer.max_iter)
            ):
                return
            flags = [f for f in comm.all_gather(requested) if f is not None]
            requested = flags[0] if flags else None
        if requested is None or is_last_iter(trainer.iter, trainer.max_iter):
            return  # the last iteration saves model_final anyway
        if self._run_state is not None:
            self._run_state.prepare_save()
        name = f"model_{trainer.iter:07d}"
        checkpointer = trainer.checkpointer
        checkpointer.save(name, iteration=trainer.iter)
        if isinstance(checkpointer, Checkpointer):
            checkpointer.wait()  # written in the background with async_save: wait for it here
        comm.synchronize()  # no rank exits (and gets its peers killed) before the file is complete
        path = os.path.join(trainer.checkpointer.save_dir, name + ".pth")
        raise TrainingPreempted(requested, trainer.iter, path)
