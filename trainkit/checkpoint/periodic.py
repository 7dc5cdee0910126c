"""``PeriodicCheckpointer``: when to save, and which periodic checkpoints to keep."""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any

from trainkit.checkpoint.checkpointer import Checkpointer
from trainkit.config import ConfigError
from trainkit.utils.periodic import is_period_end

__all__ = ["PeriodicCheckpointer"]

logger = logging.getLogger(__name__)


class PeriodicCheckpointer:
    """Save ``{file_prefix}_{iteration:07d}.pth`` every ``period`` iterations and a final one.

    ``step(iteration)`` is called after each (0-based) iteration; after ``max_iter - 1`` it
    also saves ``{file_prefix}_final.pth``, which is never deleted. With ``max_to_keep``,
    only the newest ``max_to_keep`` periodic files up to the current iteration are kept
    (files from before a restart count too). With ``async_save``, the writer thread deletes
    old files once the new one is complete and tagged (not at all if its write fails).
    fvcore's ``Checkpointer`` (or any object with its ``save``, ``save_dir``,
    ``save_to_disk`` and ``path_manager``) may write the files too; its rotation is then
    synchronous.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        period: int,
        max_iter: int | None = None,
        max_to_keep: int | None = None,
        file_prefix: str = "model",
    ) -> None:
        """Set the schedule.

        Args:
            checkpointer: the checkpointer that writes the files.
            period: save after iterations ``period - 1``, ``2 * period - 1``, ...; 0 saves
                only the final checkpoint.
            max_iter: the iteration count; ``None`` means no final checkpoint.
            max_to_keep: periodic files to keep; ``None`` or 0 keeps all.
            file_prefix: file name prefix.

        Raises:
            ConfigError: A ``ValueError``: if ``period`` or ``max_to_keep`` is negative.
        """
        if period < 0:
            raise ConfigError(
                f"checkpoint period must be >= 0 (SOLVER.CHECKPOINT_PERIOD), got {period}; "
                "use 0 to save only the final checkpoint."
            )
        if max_to_keep is not None and max_to_keep < 0:
            raise ConfigError(
                f"max_to_keep must be >= 0 (SOLVER.MAX_TO_KEEP), got {max_to_keep}; use 0 to "
                "keep every checkpoint."
            )
        self.checkpointer = checkpointer
        self.period = int(period)
        self.max_iter = max_iter
        self.max_to_keep = max_to_keep or None
        self.file_prefix = file_prefix
        self.path_manager = checkpointer.path_manager

    def step(self, iteration: int, **kwargs: Any) -> None:
        """Save if ``iteration`` closes a period or is the last one.

        Args:
            iteration: the iteration just finished, in ``[0, max_iter - 1]``; stored as
                ``"iteration"`` in the checkpoint.
            kwargs: extra data to store.

        Raises:
            CheckpointWriteError: If a background write failed since the last step.
        """
        iteration = int(iteration)
        extra = {"iteration": iteration, **kwargs}
        trainkit_checkpointer = isinstance(self.checkpointer, Checkpointer)
        if trainkit_checkpointer:
            self.checkpointer.raise_if_write_failed()
        if is_period_end(iteration, self.period):
            name = f"{self.file_prefix}_{iteration:07d}"
            self.checkpointer.save(name, **extra)
            if self.max_to_keep and trainkit_checkpointer:
                self.checkpointer.call_after_write(
                    lambda: self._delete_old_checkpoints(iteration),
                    f"deletion of checkpoints older than {name} (max_to_keep)",
                )
            elif self.max_to_keep:  # fvcore's or another synchronous checkpointer
                self._delete_old_checkpoints(iteration)
        if self.max_iter is not None and iteration >= self.max_iter - 1:
            self.checkpointer.save(f"{self.file_prefix}_final", **extra)

    def save(self, name: str, **kwargs: Any) -> None:
        """Save ``name`` outside the schedule (as :meth:`Checkpointer.save`)."""
        self.checkpointer.save(name, **kwargs)

    def _delete_old_checkpoints(self, iteration: int) -> None:
        save_dir = self.checkpointer.save_dir
        if not save_dir or not self.checkpointer.save_to_disk:
            return  # only the rank that writes files deletes them
        # Files, or the directories of a sharded model's checkpoints.
        pattern = re.compile(rf"^{re.escape(self.file_prefix)}_(\d{{7,}})(\.pth)?$")
        matches = [pattern.match(name) for name in self.path_manager.ls(save_dir)]
        # Files from an abandoned longer run (after resuming from an older checkpoint) are
        # left alone: they are overwritten as this run reaches them.
        periodic = sorted(
            (int(m.group(1)), os.path.join(save_dir, m.group(0)))
            for m in matches
            if m and int(m.group(1)) <= iteration
        )
        for _, path in periodic[: max(len(periodic) - self.max_to_keep, 0)]:
            logger.info("Deleting old checkpoint %s (max_to_keep=%d)", path, self.max_to_keep)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                self.path_manager.rm(path)
