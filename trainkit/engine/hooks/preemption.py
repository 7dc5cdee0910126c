"""Graceful pre-emption: on SIGTERM/SIGINT/SIGUSR1 finish the step, checkpoint, exit to resume."""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Callable

from typing_extensions import override

from trainkit.checkpoint import Checkpointer
from trainkit.engine.hook_base import HookBase, is_time
from trainkit.launcher import PreemptionSignal
from trainkit.launcher.protocol import PREEMPTED_EXIT_CODE
from trainkit.utils import comm
from trainkit.utils.periodic import is_last_iter

if TYPE_CHECKING:
    from trainkit.engine.run_state import RunState

__all__ = ["PreemptionHandler", "TrainingPreempted"]

logger = logging.getLogger(__name__)


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
        # launch() gives a process that raised this the exit status below instead of 1.
        self.exit_code = PREEMPTED_EXIT_CODE


class PreemptionHandler(HookBase):
    """Turn SIGTERM/SIGINT/SIGUSR1 into "finish this step, save, stop" (during ``train``).

    Cluster schedulers send SIGTERM (SLURM: SIGUSR1 with ``sbatch --signal=USR1@90``; people
    press Ctrl-C) some seconds before they kill a job. The first signal is noted
    (:class:`trainkit.launcher.PreemptionSignal`, where a second one ends the process); the
    ranks agree on it at the next check, finish the step, rank 0 writes a checkpoint, all
    wait for it, and training stops with :class:`TrainingPreempted` (exit status 75). It
    reads the trainer's ``checkpointer`` (DefaultTrainer's declared surface).

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
            run_state: its ``prepare_save`` runs on every rank right before the save.
        """
        self._run_state = run_state
        self._sync_period = sync_period
        # Public: code that learns of a pre-emption another way calls its note_signal().
        self.preemption_signal = PreemptionSignal(signals, clock)

    @override
    def before_train(self) -> None:
        self.preemption_signal.install()

    @override
    def after_train(self) -> None:
        self.preemption_signal.uninstall()

    @override
    def after_step(self) -> None:
        trainer = self.trainer
        requested = self.preemption_signal.received
        if comm.get_world_size() > 1:
            if not is_time(trainer, self._sync_period):
                return
            requested = next((f for f in comm.all_gather(requested) if f is not None), None)
        if requested is None or is_last_iter(trainer.iter, trainer.max_iter):
            return  # the last iteration saves model_final anyway
        # A non-finite step since the last check ends the run (exit 65) instead of a save.
        trainer.flush_pending_checks()
        if self._run_state is not None:
            self._run_state.prepare_save()
        name = f"model_{trainer.iter:07d}"
        checkpointer = trainer.checkpointer
        checkpointer.save(name, iteration=trainer.iter)
        if isinstance(checkpointer, Checkpointer):
            checkpointer.wait()  # written in the background with async_save: wait for it here
        comm.synchronize()  # no rank exits (and gets its peers killed) before the file is complete
        if isinstance(checkpointer, Checkpointer):
            path = checkpointer.checkpoint_path(name)
        else:  # fvcore's
            path = os.path.join(checkpointer.save_dir, name + ".pth")
        raise TrainingPreempted(requested, trainer.iter, path)
