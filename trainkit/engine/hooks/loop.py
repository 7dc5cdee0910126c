"""Hooks of every step: callbacks, the step timer, the writers and the lr scheduler."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable

import torch
from fvcore.common.param_scheduler import ParamScheduler
from typing_extensions import override

from trainkit.data.loading.loader import TrainLoader
from trainkit.data.plans.loader_state import mixed_set_metrics
from trainkit.engine.hook_base import HookBase, HookPriority, is_time
from trainkit.solver import LRMultiplier
from trainkit.utils.events import EventWriter

if TYPE_CHECKING:
    from trainkit.engine.trainer_base import TrainerBase

TrainerCallback = Callable[["TrainerBase"], None]

__all__ = [
    "CallbackHook",
    "IterationTimer",
    "LRScheduler",
    "PeriodicWriter",
    "SkippedRecordsCounter",
]

logger = logging.getLogger(__name__)


class CallbackHook(HookBase):
    """Run plain functions ``fn(trainer)`` at the hook points; for one-off extensions."""

    def __init__(
        self,
        *,
        before_train: TrainerCallback | None = None,
        after_train: TrainerCallback | None = None,
        before_step: TrainerCallback | None = None,
        after_step: TrainerCallback | None = None,
    ) -> None:
        """Store the callbacks; each receives the trainer and any may be ``None``."""
        phases = zip(
            ("before_train", "after_train", "before_step", "after_step"),
            (before_train, after_train, before_step, after_step),
        )
        for phase, fn in phases:
            if fn is not None:
                # On the instance: the loop calls this hook only in the phases given.
                setattr(self, phase, lambda fn=fn: fn(self.trainer))


class IterationTimer(HookBase):
    """Record each step's duration as ``time`` and log the overall speed after training.

    It runs first, so a step's time covers the other hooks' ``before_step`` and ``run_step``.
    The first ``warmup_iter`` steps (slow: allocation, autotuning) are not timed.
    """

    priority = HookPriority.HIGHEST

    def __init__(
        self, warmup_iter: int = 3, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        """Set up the timer.

        Args:
            warmup_iter: steps at the start of ``train()`` that are not timed.
            clock: returns seconds (tests inject one, so they need no sleeping).
        """
        self._warmup_iter = warmup_iter
        self._clock = clock
        self._start_s: float | None = None
        self._step_start_s = 0.0
        self._timed_steps_s = 0.0
        self._num_timed_steps = 0

    @override
    def before_train(self) -> None:
        self._start_s = self._clock()
        self._timed_steps_s = 0.0
        self._num_timed_steps = 0

    @override
    def before_step(self) -> None:
        self._step_start_s = self._clock()

    @override
    def after_step(self) -> None:
        now_s = self._clock()
        trainer = self.trainer
        # As in detectron2, the step that completes the warm-up is the first one timed.
        if trainer.iter - trainer.start_iter + 1 >= self._warmup_iter:
            step_s = now_s - self._step_start_s
            trainer.storage.put_scalar("time", step_s)
            self._timed_steps_s += step_s
            self._num_timed_steps += 1
        else:
            self._start_s = now_s  # the overall speed also starts after the warm-up

    @override
    def after_train(self) -> None:
        if self._start_s is None or self._num_timed_steps == 0:
            return
        total_s = self._clock() - self._start_s
        logger.info(
            "Overall training speed: %d iterations in %.1f s (%.4f s / it)",
            self._num_timed_steps,
            self._timed_steps_s,
            self._timed_steps_s / self._num_timed_steps,
        )
        logger.info(
            "Total training time: %.1f s (%.1f s on hooks)", total_s, total_s - self._timed_steps_s
        )


class PeriodicWriter(HookBase):
    """Run the writers every ``period`` iterations, at the last one, and once after training."""

    priority = HookPriority.LOWEST

    def __init__(self, writers: Iterable[EventWriter], period: int = 20) -> None:
        """Store the writers.

        Raises:
            TypeError: If a writer is not an :class:`~trainkit.utils.events.EventWriter`.
        """
        self._writers = list(writers)
        for writer in self._writers:
            if not isinstance(writer, EventWriter):
                raise TypeError(
                    f"{type(writer).__name__} is not an EventWriter; subclass "
                    "trainkit.utils.events.EventWriter (write, close)"
                )
        self._period = period
        self._trained = False  # a resumed stopped run closes the writers without training

    @override
    def before_train(self) -> None:
        self._trained = True

    @override
    def after_step(self) -> None:
        if is_time(self.trainer, self._period):
            for writer in self._writers:
                writer.write()

    @override
    def final_write(self) -> None:
        """Write once more, then close every writer (the trainer calls this last).

        After every hook's ``after_train``, so what those record is written too; after a
        stop, the writers publish the reason (``EventWriter.write_stop_reason``).
        """
        try:
            for writer in self._writers:
                writer.write()
            reason = self.trainer.stop_reason
            if reason is not None and self._trained:
                for writer in self._writers:
                    writer.write_stop_reason(self.trainer.iter, reason)
        finally:
            for writer in self._writers:
                writer.close()


class LRScheduler(HookBase):
    """Step the lr scheduler after every optimizer step and record ``lr``.

    The recorded ``lr`` is that of the param group with the most parameters (ties go to the
    larger lr), the "main" lr for the usual bias/norm group splits.

    Subclasses that replace ``after_step`` may read what detectron2's hook offers them from
    ``before_train`` on: ``self._optimizer`` (the optimizer stepped), ``self.scheduler`` and
    ``self._best_param_group_id`` (the index of that main param group).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | ParamScheduler | None = None,
    ) -> None:
        """Store the arguments (the scheduler's state is this hook's resumable state).

        Args:
            optimizer: defaults to ``trainer.optimizer``.
            scheduler: a torch lr scheduler, an fvcore ``ParamScheduler`` (wrapped in an
                ``LRMultiplier`` over ``trainer.max_iter`` when training starts), or
                ``None`` for ``trainer.scheduler``.
        """
        self._optimizer = optimizer
        self._scheduler_arg = scheduler
        self._multiplier: torch.optim.lr_scheduler.LRScheduler | None = None  # of a ParamScheduler
        # Loaded before the ParamScheduler is wrapped (resume precedes train()): for before_train.
        self._pending_state: dict[str, Any] | None = None
        self._best_param_group_id = 0
        self._stepped_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        """The torch scheduler being stepped.

        Raises:
            RuntimeError: If it is built from a ``ParamScheduler`` and training has not started.
        """
        scheduler = self._resolve_scheduler()
        if scheduler is None:
            raise RuntimeError("The lr scheduler is built from a ParamScheduler in before_train")
        return scheduler

    def _resolve_scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        if isinstance(self._scheduler_arg, ParamScheduler):
            return self._multiplier
        if self._scheduler_arg is not None:
            return self._scheduler_arg
        return self.trainer.scheduler  # type: ignore[attr-defined]  # DefaultTrainer's

    @override
    def before_train(self) -> None:
        trainer = self.trainer
        optimizer = self._optimizer if self._optimizer is not None else trainer.optimizer  # type: ignore[attr-defined]
        if isinstance(self._scheduler_arg, ParamScheduler):
            self._multiplier = LRMultiplier(
                optimizer, self._scheduler_arg, trainer.max_iter, last_iter=trainer.iter - 1
            )
        # Resolved once per train() call, not on every step.
        self._stepped_scheduler = self.scheduler
        if self._pending_state is not None:
            self._stepped_scheduler.load_state_dict(self._pending_state)
            self._pending_state = None
        # Kept resolved under detectron2's attribute names: subclasses read them.
        self._optimizer = optimizer
        self._best_param_group_id = self.get_best_param_group_id(optimizer)

    @staticmethod
    def get_best_param_group_id(optimizer: torch.optim.Optimizer) -> int:
        """Return the index of the param group whose lr is recorded (see the class docstring)."""
        groups = optimizer.param_groups
        return max(range(len(groups)), key=lambda i: (len(groups[i]["params"]), groups[i]["lr"]))

    @override
    def after_step(self) -> None:
        if self._stepped_scheduler is None:  # a caller that skipped before_train
            self.before_train()
        lr = self._optimizer.param_groups[self._best_param_group_id]["lr"]  # type: ignore[union-attr]
        self.trainer.storage.put_scalar("lr", lr, smoothing_hint=False)
        self._stepped_scheduler.step()  # type: ignore[union-attr]

    @override
    def state_dict(self) -> dict[str, Any]:
        scheduler = self._resolve_scheduler()
        return scheduler.state_dict() if scheduler is not None else {}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        scheduler = self._resolve_scheduler()
        if scheduler is None:
            self._pending_state = state
        else:
            scheduler.load_state_dict(state)


class SkippedRecordsCounter(HookBase):
    """Record the loader's numbers: skipped records, and each mixed set's epoch and records.

    ``data/skipped_records`` is the loader's cumulative count of records that failed to map;
    with ``DATASETS.TRAIN_WEIGHTS``, ``data/<name>/epoch`` and ``data/<name>/records`` are
    each set's epochs so far and its records in the step
    (:func:`~trainkit.data.plans.loader_state.mixed_set_metrics`), read from the position after
    the batches the step consumed: host numbers, no device wait.
    """

    def __init__(self, period: int) -> None:
        """Record every ``period`` iterations and at the last one."""
        self._period = period

    @override
    def after_step(self) -> None:
        trainer = self.trainer
        if not is_time(trainer, self._period):
            return
        if isinstance(loader := trainer.data_loader, TrainLoader):  # type: ignore[attr-defined]
            skipped = loader.num_skipped_records
            trainer.storage.put_scalar("data/skipped_records", skipped, smoothing_hint=False)
        # The position after the batches the step consumed (the loader may have drawn ahead).
        for name, value in mixed_set_metrics(trainer.loader_state_dict()).items():
            trainer.storage.put_scalar(name, value, smoothing_hint=False)
