"""Hooks that save checkpoints: periodically, and whenever a metric improves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from trainkit.checkpoint import Checkpointer, is_sharded, unwrap_model
from trainkit.checkpoint import PeriodicCheckpointer as _PeriodicCheckpointer
from trainkit.engine.hook_base import HookBase, is_time
from trainkit.engine.hooks.early_stopping import (
    ImprovementRule,
    is_evaluation_step,
    update_from_storage,
)
from trainkit.utils import comm
from trainkit.utils.errors import UsageError

if TYPE_CHECKING:
    from trainkit.engine.run_state import RunState

__all__ = ["BestCheckpointer", "PeriodicCheckpointer", "check_saves_on_every_rank"]

logger = logging.getLogger(__name__)


class PeriodicCheckpointer(HookBase):
    """Save a checkpoint every ``period`` iterations and a final one at the last iteration.

    A hook around :class:`trainkit.checkpoint.PeriodicCheckpointer` (file names, rotation, what
    is saved). After a stop (:meth:`TrainerBase.request_stop`), ``after_train`` writes and tags
    ``{file_prefix}_final`` for the last finished iteration; it then waits for a background
    write (raising its failure), so training ends with the checkpoint on disk.
    """

    def __init__(
        self,
        checkpointer: Checkpointer,
        period: int,
        max_iter: int | None = None,
        max_to_keep: int | None = None,
        file_prefix: str = "model",
        *,
        run_state: RunState | None = None,
    ) -> None:
        """Store the arguments.

        Args:
            checkpointer: writes the files.
            period: save every this many iterations (and at the last one).
            max_iter: the last iteration + 1; ``None`` means the trainer's ``max_iter``.
            max_to_keep: keep only this many periodic checkpoints (``None``: all).
            file_prefix: the checkpoints are ``{file_prefix}_{iteration:07d}.pth``.
            run_state: its ``prepare_save`` runs on every rank right before each save.
        """
        self._checkpointer = checkpointer
        self._period = period
        self._max_iter = max_iter
        self._max_to_keep = max_to_keep
        self._file_prefix = file_prefix
        self._run_state = run_state
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
        if is_time(self.trainer, self._period, self._periodic.max_iter):
            self._prepare_save()
        self._periodic.step(self.trainer.iter)

    def _prepare_save(self) -> None:
        # No checkpoint holds a non-finite step's update. Agreed by every rank when the hook
        # runs on every rank (DefaultTrainer's, with a run state); a detectron2-style hook
        # registered on rank 0 alone checks that rank's losses.
        self.trainer.flush_pending_checks(collective=self._run_state is not None)
        if self._run_state is not None:
            self._run_state.prepare_save()

    @override
    def after_train(self) -> None:
        trainer = self.trainer
        if trainer.stop_reason is not None and trainer.iter < trainer.max_iter:
            # Stopped early (TrainerBase.request_stop): the last iteration's model_final was
            # never written. Write it now; it records the stop, so --resume does not train on.
            self._prepare_save()
            self._checkpointer.save(f"{self._file_prefix}_final", iteration=trainer.iter)
        if isinstance(self._checkpointer, Checkpointer):
            self._checkpointer.wait()


class BestCheckpointer(HookBase):
    """Save ``file_prefix`` whenever ``val_metric`` in the storage improves; stop on patience.

    Register it after the :class:`EvalHook` that records the metric, with the same
    ``eval_period``: it checks right after each evaluation (the final one in
    ``after_train``). The best value is resumable state: a resumed run does not overwrite the
    best checkpoint with a worse one. **beyond** detectron2: ``patience`` and ``min_delta``,
    the :class:`~trainkit.engine.hooks.ImprovementRule` ``EarlyStopping`` uses too.

    Collective:
        With ``patience`` or a sharded model (whose saves are collective) and several
        processes: an ``all_gather`` at each check (rank 0 decides, every rank saves and
        stops after the same step). Otherwise each rank decides from its own storage, as in
        detectron2.
    """

    def __init__(
        self,
        eval_period: int,
        checkpointer: Checkpointer,
        val_metric: str,
        mode: str = "max",
        file_prefix: str = "model_best",
        *,
        patience: int | None = None,
        min_delta: float = 0.0,
    ) -> None:
        """Store the arguments.

        Args:
            eval_period: the ``EvalHook``'s period.
            checkpointer: saves ``file_prefix`` (without moving ``last_checkpoint``).
            val_metric: a flattened evaluation result, e.g. ``classification/top1``.
            mode: ``"max"`` if larger is better, else ``"min"``.
            file_prefix: the best model is ``{file_prefix}.pth``.
            patience: stop training (:meth:`TrainerBase.request_stop`) after this many
                evaluations without improvement; ``None`` never stops.
            min_delta: an improvement must exceed this (>= 0).

        Raises:
            ValueError: If ``mode``, ``patience`` or ``min_delta`` is out of range.
        """
        self._period = eval_period
        self._checkpointer = checkpointer
        self._val_metric = val_metric
        self._file_prefix = file_prefix
        self.rule = ImprovementRule(mode, min_delta=min_delta, patience=patience)

    @property
    def best_metric(self) -> float | None:
        """The best value so far (``None`` before the first evaluation)."""
        return self.rule.best_metric

    @property
    def best_iter(self) -> int | None:
        """The iteration the best value was recorded at."""
        return self.rule.best_iter

    def _check(self, may_stop: bool) -> None:
        # At each evaluation (a save follows only an improvement): the best checkpoint never holds a
        # non-finite step's update. Agreed by every rank only with patience (the hook is collective
        # then); else, as detectron2 registers it anywhere, each rank checks its own losses.
        rule, previous, metric = self.rule, self.rule.best_metric, self._val_metric
        # A sharded model's save is collective: every rank must make rank 0's decision.
        sharded = is_sharded(getattr(self._checkpointer, "model", None))  # fvcore's has one
        shared = rule.patience is not None or sharded
        self.trainer.flush_pending_checks(collective=shared)
        if update_from_storage(rule, self.trainer.storage, metric, shared=shared, strict=False):
            logger.info(
                "Saved best model: %s = %.5g at iteration %d (previous best %s)",
                metric,
                rule.best_metric,
                rule.best_iter,
                previous,
            )
            self._checkpointer.save(self._file_prefix, tag_last=False, iteration=rule.best_iter)
        if may_stop and rule.should_stop:
            self.trainer.request_stop(f"BestCheckpointer: {rule.reason(metric)}")

    @override
    def after_step(self) -> None:
        # The last iteration is checked in after_train, after the final evaluation.
        if is_evaluation_step(self.trainer, self._period):
            self._check(may_stop=True)

    @override
    def after_train(self) -> None:
        if self.trainer.iter >= self.trainer.max_iter:  # training completed
            self._check(may_stop=False)

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.rule.state_dict()

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rule.load_state_dict(state)


def check_saves_on_every_rank(hooks: list[HookBase], model: Any) -> None:
    """Refuse checkpointing hooks registered on only some ranks when ``model`` is sharded.

    A sharded model's checkpoint is written by every process together: a hook that saves on
    rank 0 alone (detectron2's ``build_hooks`` adds its ``PeriodicCheckpointer`` under
    ``comm.is_main_process()``) would wait forever for the others at its first save.

    Raises:
        UsageError: Naming the hook and the ranks that lack it (on every rank).

    Collective:
        An ``all_gather`` with several processes and a sharded model; nothing otherwise.
    """
    if comm.get_world_size() == 1 or not is_sharded(unwrap_model(model)):
        return
    saving = (PeriodicCheckpointer, BestCheckpointer)
    names = sorted(type(h).__name__ for h in hooks if isinstance(h, saving))
    everyone = comm.all_gather(names)
    for name in sorted({n for ranks_names in everyone for n in ranks_names}):
        counts = [ranks_names.count(name) for ranks_names in everyone]
        if len(set(counts)) > 1:
            having = [rank for rank, count in enumerate(counts) if count == max(counts)]
            raise UsageError(
                f"{name} is registered on rank(s) {having} only, but a sharded model's "
                "checkpoint is written by every process together; register it on every rank "
                "(not under comm.is_main_process(), as detectron2's build_hooks does)."
            )
