"""Ending training when an evaluation metric stops improving: one rule, two hooks.

:class:`EarlyStopping` (``TEST.EARLY_STOP.*``) and
:class:`~trainkit.engine.hooks.BestCheckpointer` (``patience=``) both feed
:class:`ImprovementRule` one value per evaluation through :func:`update_from_storage`.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from typing_extensions import override

from trainkit.config import CfgNode, ConfigError
from trainkit.engine.hook_base import HookBase
from trainkit.engine.trainer_base import TrainerBase
from trainkit.utils import comm
from trainkit.utils.events import EventStorage
from trainkit.utils.periodic import is_last_iter, is_period_end

__all__ = ["EarlyStopping", "ImprovementRule", "early_stopping_from_config", "update_from_storage"]

logger = logging.getLogger(__name__)

_MODES = ("max", "min")


class ImprovementRule:
    """The best value of a metric so far, and how many evaluations have not beaten it.

    The first value is always the best (even NaN, as in detectron2's ``BestCheckpointer``:
    nothing then beats it).

    Attributes:
        best_metric: the best value so far (``None`` before the first).
        best_iter: the iteration it was recorded at.
        evals_without_improvement: evaluations since the best one.
    """

    def __init__(self, mode: str = "max", *, min_delta: float = 0.0, patience: int | None = None):
        """Create an empty rule.

        Args:
            mode: ``"max"`` (larger is better) or ``"min"``.
            min_delta: how much a value must beat the best by to count (>= 0).
            patience: evaluations in a row without improvement after which :attr:`should_stop`
                holds; ``None`` never.

        Raises:
            ValueError: For another mode, a negative or non-finite ``min_delta``, or a
                ``patience`` below 1.
        """
        if mode not in _MODES:
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        if not (math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        if patience is not None and (isinstance(patience, bool) or int(patience) < 1):
            raise ValueError(f"patience must be an int >= 1 or None, got {patience!r}")
        self.mode = mode
        self.min_delta = float(min_delta)
        self.patience = None if patience is None else int(patience)
        self.best_metric: float | None = None
        self.best_iter: int | None = None
        self.evals_without_improvement = 0

    def is_improvement(self, value: float) -> bool:
        """Whether ``value`` would replace the best (no state changes)."""
        if self.best_metric is None:
            return True
        if self.mode == "max":
            return value > self.best_metric + self.min_delta
        return value < self.best_metric - self.min_delta

    def update(self, value: float, iteration: int) -> bool:
        """Account for one evaluation's ``value``; return whether it is the new best."""
        if self.is_improvement(value):
            self.best_metric, self.best_iter = float(value), int(iteration)
            self.evals_without_improvement = 0
            return True
        self.evals_without_improvement += 1
        return False

    @property
    def should_stop(self) -> bool:
        """Whether patience has run out."""
        return self.patience is not None and self.evals_without_improvement >= self.patience

    def reason(self, metric: str) -> str:
        """Say in one line why :attr:`should_stop` holds, naming ``metric``."""
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        n = self.evals_without_improvement
        return (
            f"{metric} has not improved{by} for {n} evaluation{'' if n == 1 else 's'} "
            f"(patience {self.patience}); best {self.best_metric:.6g} at iteration "
            f"{self.best_iter} (mode {self.mode})"
        )

    def state_dict(self) -> dict[str, Any]:
        """Return the progress (plain numbers); ``{}`` before the first evaluation."""
        if self.best_metric is None:
            return {}
        return {
            "best_metric": self.best_metric,
            "best_iter": self.best_iter,
            "evals_without_improvement": self.evals_without_improvement,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (also a state without the count)."""
        self.best_metric = state.get("best_metric")
        self.best_iter = state.get("best_iter")
        self.evals_without_improvement = int(state.get("evals_without_improvement", 0))


def update_from_storage(
    rule: ImprovementRule, storage: EventStorage, metric: str, *, shared: bool, strict: bool
) -> bool:
    """Feed ``rule`` the latest value of ``metric`` in ``storage``; return whether it improved.

    Args:
        storage: where the evaluation put its results (flattened names).
        metric: the name, e.g. ``classification/top1``.
        shared: decide on rank 0 and give every rank its decision and rule state
            (evaluators often return results on rank 0 only).
        strict: a metric missing, or not recorded at the storage's current iteration,
            raises; otherwise it is logged and the rule left as it was.

    Raises:
        ConfigError: In strict mode, if ``metric`` was not recorded at this iteration (on
            every rank, when shared).

    Collective:
        With ``shared`` and several processes, an ``all_gather``: every rank calls it at the
        same iterations.
    """
    if shared and comm.get_world_size() > 1:
        # Only rank 0's storage is trusted to hold the results; the others take its word.
        mine = _update_locally(rule, storage, metric, strict) if comm.is_main_process() else None
        improved, state, problem = comm.all_gather(mine)[0]
        rule.load_state_dict(state)
    else:
        improved, _, problem = _update_locally(rule, storage, metric, strict)
    if problem is not None:
        if strict:
            raise ConfigError(problem)
        logger.warning(problem)
    return improved


def _update_locally(
    rule: ImprovementRule, storage: EventStorage, metric: str, strict: bool
) -> tuple[bool, dict[str, Any], str | None]:
    latest = storage.latest()
    found = latest.get(metric)
    if found is None or (strict and found[1] != storage.iter):
        recorded = sorted(k for k, (_, it) in latest.items() if it == storage.iter)
        problem = (
            f"the metric {metric!r} to watch for improvement was not recorded by the evaluation "
            f"at iteration {storage.iter} (recorded then: {recorded or 'nothing'}); set it to "
            "one of those (TEST.EARLY_STOP.METRIC for DefaultTrainer; names are flattened like "
            "'classification/top1') and evaluate before this hook runs."
        )
        return False, rule.state_dict(), problem
    value, metric_iter = found
    return rule.update(float(value), int(metric_iter)), rule.state_dict(), None


def is_evaluation_step(trainer: TrainerBase, eval_period: int) -> bool:
    """Whether an ``EvalHook(eval_period)`` evaluated in this step (it skips the last one)."""
    cur_iter = trainer.iter
    return is_period_end(cur_iter, eval_period) and not is_last_iter(cur_iter, trainer.max_iter)


class EarlyStopping(HookBase):
    """Stop training once ``metric`` has not improved for ``patience`` evaluations.

    Register it after the :class:`~trainkit.engine.hooks.EvalHook` that records the metric,
    with the same period: it checks right after each periodic evaluation (the one after the
    last iteration cannot stop anything). Each check puts ``early_stop/best``,
    ``early_stop/best_iter`` and ``early_stop/evals_without_improvement`` into the storage,
    and ``early_stop/stopped`` (1) when it stops the run. Its progress is resumable state.

    Collective:
        With several processes, an ``all_gather`` at every check: rank 0 decides and every
        rank stops after the same step. Register it on every rank.
    """

    def __init__(
        self,
        eval_period: int,
        metric: str,
        mode: str = "max",
        patience: int = 5,
        min_delta: float = 0.0,
    ) -> None:
        """Store the arguments; ``mode``, ``patience`` and ``min_delta`` are the rule's.

        Args:
            eval_period: the ``EvalHook``'s period (> 0).
            metric: a flattened evaluation result, e.g. ``classification/top1``.

        Raises:
            ValueError: For a period below 1, an empty metric, or a bad mode, patience or
                min_delta (see :class:`ImprovementRule`).
        """
        if eval_period < 1:
            raise ValueError(f"EarlyStopping needs periodic evaluations: eval_period={eval_period}")
        if not metric:
            raise ValueError("EarlyStopping needs the name of a metric to watch")
        self._period = eval_period
        self._metric = metric
        self.rule = ImprovementRule(mode, min_delta=min_delta, patience=patience)

    @override
    def after_step(self) -> None:
        trainer = self.trainer
        if not is_evaluation_step(trainer, self._period):
            return
        rule, storage = self.rule, trainer.storage
        update_from_storage(rule, storage, self._metric, shared=True, strict=True)
        best = {"early_stop/best": rule.best_metric, "early_stop/best_iter": rule.best_iter}
        waited = {"early_stop/evals_without_improvement": rule.evals_without_improvement}
        storage.put_scalars(**best, **waited, smoothing_hint=False)
        if rule.should_stop:
            storage.put_scalar("early_stop/stopped", 1, smoothing_hint=False)
            trainer.request_stop(f"early stopping: {rule.reason(self._metric)}")

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.rule.state_dict()

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rule.load_state_dict(state)


def early_stopping_from_config(cfg: CfgNode) -> EarlyStopping | None:
    """Build the :class:`EarlyStopping` hook ``TEST.EARLY_STOP`` asks for (``None``: off).

    Raises:
        ConfigError: If ``TEST.EARLY_STOP.METRIC`` is set but ``TEST.EVAL_PERIOD`` is 0, or
            ``MODE``, ``PATIENCE`` or ``MIN_DELTA`` is out of range (the key is named).
    """
    es = cfg.TEST.EARLY_STOP
    if not es.METRIC:
        return None
    if cfg.TEST.EVAL_PERIOD < 1:
        raise ConfigError(
            f"TEST.EARLY_STOP.METRIC={es.METRIC!r} needs periodic evaluations, but "
            f"TEST.EVAL_PERIOD={cfg.TEST.EVAL_PERIOD}; set TEST.EVAL_PERIOD > 0 or "
            "TEST.EARLY_STOP.METRIC ''."
        )
    if es.MODE not in _MODES:
        raise ConfigError(f"TEST.EARLY_STOP.MODE must be 'max' or 'min', got {es.MODE!r}")
    if es.PATIENCE < 1:
        raise ConfigError(
            f"TEST.EARLY_STOP.PATIENCE must be >= 1 (evaluations without improvement), "
            f"got {es.PATIENCE}"
        )
    if not (math.isfinite(es.MIN_DELTA) and es.MIN_DELTA >= 0):
        raise ConfigError(f"TEST.EARLY_STOP.MIN_DELTA must be >= 0, got {es.MIN_DELTA}")
    return EarlyStopping(
        cfg.TEST.EVAL_PERIOD, es.METRIC, es.MODE, patience=es.PATIENCE, min_delta=es.MIN_DELTA
    )
