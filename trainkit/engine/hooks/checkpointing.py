"""Hooks that save checkpoints: periodically, and whenever a metric improves."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from typing_extensions import override

from trainkit.checkpoint import Checkpointer
from trainkit.checkpoint import PeriodicCheckpointer as _PeriodicCheckpointer
from trainkit.engine.train_loop import HookBase
from trainkit.utils.periodic import is_last_iter, is_period_end

__all__ = ["BestCheckpointer", "PeriodicCheckpointer"]

logger = logging.getLogger(__name__)


class _Saver(Protocol):
    def save(self, name: str, *, tag_last: bool = True, **kwargs: Any) -> None: ...


class PeriodicCheckpointer(HookBase):
    """Save a checkpoint every ``period`` iterations and a final one at the last iteration.

    A hook around :class:`trainkit.checkpoint.PeriodicCheckpointer`; the file names, the
    ``max_to_keep`` rotation and what is saved are that class's business. With a
    checkpointer that saves in the background, ``after_train`` waits for the last write
    (raising its failure), so training ends with the final checkpoint on disk.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        period: int,
        max_iter: int | None = None,
        max_to_keep: int | None = None,
        file_prefix: str = "model",
        *,
        before_save: Callable[[], None] | None = None,
    ) -> None:
        """Store the arguments.

        Args:
            checkpointer: writes the files.
            period: save every this many iterations (and at the last one).
            max_iter: the last iteration + 1; ``None`` means the trainer's ``max_iter``.
            max_to_keep: keep only this many periodic checkpoints (``None``: all).
            file_prefix: the checkpoints are ``{file_prefix}_{iteration:07d}.pth``.
            before_save: called on every rank right before each save, e.g. to gather
                per-rank state (:meth:`trainkit.engine.rank_state.RankStates.capture`).
        """
        self._checkpointer = checkpointer
        self._period = period
        self._max_iter = max_iter
        self._max_to_keep = max_to_keep
        self._file_prefix = file_prefix
        self._before_save = before_save
        self._periodic: _PeriodicCheckpointer | None = None

    @property
    def checkpointer(self) -> Checkpointer:
        """The checkpointer that writes the files."""
        return self._checkpointer

    @override
    def before_train(self) -> None:
        # Built here because the trainer's max_iter is known only once train() starts.
        max_iter = self._max_iter if self._max_iter is not None else self.trainer.max_iter
        self._periodic = _PeriodicCheckpointer(
            self._checkpointer, self._period, max_iter, self._max_to_keep, self._file_prefix
        )

    @override
    def after_step(self) -> None:
        if self._periodic is None:
            return
        cur_iter = self.trainer.iter
        if self._before_save is not None and (
            is_period_end(cur_iter, self._period) or is_last_iter(cur_iter, self._periodic.max_iter)
        ):
            self._before_save()
        self._periodic.step(cur_iter)

    @override
    def after_train(self) -> None:
        if isinstance(self._checkpointer, Checkpointer):
            self._checkpointer.wait()


class BestCheckpointer(HookBase):
    """Save ``file_prefix`` whenever ``val_metric`` in the storage improves.

    Register it after the :class:`EvalHook` that records the metric, with the same
    ``eval_period``, so it checks right after each evaluation (and after the final one in
    ``after_train``). The best value is part of the resumable state, so a resumed run does
    not overwrite the best checkpoint with a worse one.
    """

    def __init__(
        self,
        eval_period: int,
        checkpointer: _Saver,
        val_metric: str,
        mode: str = "max",
        file_prefix: str = "model_best",
    ) -> None:
        """Store the arguments.

        Raises:
            ValueError: If ``mode`` is not ``"max"`` or ``"min"``.
        """
        if mode not in ("max", "min"):
            raise ValueError(f"BestCheckpointer mode must be 'max' or 'min', got {mode!r}")
        self._period = eval_period
        self._checkpointer = checkpointer
        self._val_metric = val_metric
        self._mode = mode
        self._file_prefix = file_prefix
        self.best_metric: float | None = None
        self.best_iter: int | None = None

    def _is_better(self, value: float) -> bool:
        if self.best_metric is None:
            return True
        return value > self.best_metric if self._mode == "max" else value < self.best_metric

    def _check(self) -> None:
        latest = self.trainer.storage.latest().get(self._val_metric)
        if latest is None:
            logger.warning(
                "BestCheckpointer: %r is not in the storage; check that an EvalHook before it "
                "records it (names are flattened like 'classification/top1').",
                self._val_metric,
            )
            return
        value, metric_iter = latest
        if not self._is_better(value):
            return
        logger.info(
            "Saved best model: %s = %.5g at iteration %d (previous best %s)",
            self._val_metric,
            value,
            metric_iter,
            self.best_metric,
        )
        self.best_metric, self.best_iter = float(value), int(metric_iter)
        self._checkpointer.save(self._file_prefix, tag_last=False, iteration=metric_iter)

    @override
    def after_step(self) -> None:
        # The last iteration is checked in after_train, after the final evaluation.
        if is_period_end(self.trainer.iter, self._period) and not is_last_iter(
            self.trainer.iter, self.trainer.max_iter
        ):
            self._check()

    @override
    def after_train(self) -> None:
        if self.trainer.iter >= self.trainer.max_iter:  # training completed
            self._check()

    @override
    def state_dict(self) -> dict[str, Any]:
        if self.best_metric is None:
            return {}
        return {"best_metric": self.best_metric, "best_iter": self.best_iter}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_metric = state.get("best_metric")
        self.best_iter = state.get("best_iter")
