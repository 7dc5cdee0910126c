"""Learning-rate schedules as fvcore param schedulers, driven per iteration by ``LRMultiplier``."""

from __future__ import annotations

import bisect
import logging
import math
from typing import Any

import torch
from fvcore.common.param_scheduler import ParamScheduler
from torch.optim.lr_scheduler import LRScheduler  # detectron2 re-exports torch's base class
from typing_extensions import override

from trainkit.config import ConfigError

__all__ = [
    "LRMultiplier",
    "LRScheduler",
    "WarmupCosineLR",
    "WarmupMultiStepLR",
    "WarmupParamScheduler",
]

logger = logging.getLogger(__name__)

_WARMUP_METHODS = ("linear", "constant")


class WarmupParamScheduler(ParamScheduler):
    """Add a warm-up phase to the start of another param scheduler.

    Over the first ``warmup_length`` of training the value goes from ``warmup_factor *
    scheduler(0)`` to ``scheduler(warmup_length)`` (``"linear"``) or stays at the former
    (``"constant"``); then it is ``scheduler(where)``: the wrapped schedule keeps its own
    timeline. With ``rescale_interval=True`` that schedule is squeezed into the part after
    warm-up instead, and the linear warm-up ends at ``scheduler(0)``, where that part starts
    (detectron2 ramps to ``scheduler(warmup_length)``, then jumps to ``scheduler(0)``).
    """

    def __init__(
        self,
        scheduler: ParamScheduler,
        warmup_factor: float,
        warmup_length: float,
        warmup_method: str = "linear",
        rescale_interval: bool = False,
    ) -> None:
        """Wrap ``scheduler``.

        Args:
            scheduler: the schedule after warm-up.
            warmup_factor: the value at ``where=0`` relative to ``scheduler(0)``.
            warmup_length: fraction of training, in ``[0, 1]``, spent warming up.
            warmup_method: ``"linear"`` or ``"constant"``.
            rescale_interval: evaluate ``scheduler`` on the post-warm-up interval stretched
                to ``[0, 1]`` instead of on the whole run.

        Raises:
            ConfigError: A ``ValueError``: if ``warmup_method`` is unknown.
            ValueError: If ``warmup_length`` is outside [0, 1].
        """
        _check_warmup_method(warmup_method)
        if not 0.0 <= warmup_length <= 1.0:
            raise ValueError(f"warmup_length must be in [0, 1], got {warmup_length}")
        self._scheduler = scheduler
        self._warmup_length = float(warmup_length)
        self._warmup_method = warmup_method
        self._rescale_interval = rescale_interval
        self._start_value = warmup_factor * scheduler(0.0)
        # The warm-up ends where the main schedule picks up, so there is no jump.
        self._end_value = self._main(self._warmup_length)

    def _main(self, where: float) -> float:
        if self._rescale_interval:
            if self._warmup_length >= 1.0:
                return self._scheduler(0.0)
            where = (where - self._warmup_length) / (1.0 - self._warmup_length)
        return self._scheduler(where)

    @override
    def __call__(self, where: float) -> float:
        if where < self._warmup_length:
            if self._warmup_method == "constant":
                return self._start_value
            alpha = where / self._warmup_length
            return self._start_value + (self._end_value - self._start_value) * alpha
        return self._main(where)


class LRMultiplier(torch.optim.lr_scheduler.LRScheduler):
    """Set each param group's lr to ``base_lr * multiplier(iteration / max_iter)``.

    The multiplier is an fvcore :class:`ParamScheduler`, so one schedule object describes
    the whole run and serves any number of param groups with different base lrs (e.g.
    biases with ``BIAS_LR_FACTOR``). Call :meth:`step` once per iteration, after the
    optimizer's step. Steps past ``max_iter`` keep the schedule's end value (detectron2
    raises ``IndexError`` there for step schedules).

    :meth:`state_dict` holds only the position and the base lrs (plain numbers), not the
    multiplier: rebuild the scheduler from the config, then load the state to resume.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        multiplier: ParamScheduler,
        max_iter: int,
        last_iter: int = -1,
    ) -> None:
        """Attach the schedule to ``optimizer`` and set the lr of iteration ``last_iter + 1``.

        Args:
            optimizer: the optimizer whose param groups' ``lr`` is set.
            multiplier: maps training progress in ``[0, 1]`` to an lr multiplier.
            max_iter: the iteration count of the run (progress 1.0).
            last_iter: the last finished iteration, ``-1`` for a new run.

        Raises:
            TypeError: If ``multiplier`` is not an fvcore ``ParamScheduler``.
            ConfigError: A ``ValueError``: if ``max_iter`` is not positive.
        """
        if not isinstance(multiplier, ParamScheduler):
            raise TypeError(
                "LRMultiplier needs an fvcore ParamScheduler as multiplier, got "
                f"{type(multiplier).__name__}"
            )
        if max_iter <= 0:
            raise ConfigError(f"max_iter must be positive (SOLVER.MAX_ITER), got {max_iter}")
        self._multiplier = multiplier
        self._max_iter = int(max_iter)
        super().__init__(optimizer, last_epoch=last_iter)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {  # plain numbers only: torch.load(weights_only=True) reads them
            "base_lrs": list(self.base_lrs),
            "last_epoch": self.last_epoch,
            "_last_lr": list(getattr(self, "_last_lr", [])),
            "_step_count": getattr(self, "_step_count", 0),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        known = {"base_lrs", "last_epoch", "_last_lr", "_step_count"}
        if unknown := sorted(set(state_dict) - known):
            logger.warning("Ignoring unknown LRMultiplier state keys: %s", unknown)
        self.__dict__.update({k: v for k, v in state_dict.items() if k in known})

    @override
    def get_lr(self) -> list[float]:
        where = min(max(self.last_epoch / self._max_iter, 0.0), 1.0)
        try:
            multiplier = self._multiplier(where)
        except IndexError:
            # Stepped once more after the final iteration (or more by a loop that overruns
            # max_iter), a schedule that raises IndexError at its end (fvcore's step
            # schedulers, and detectron2) keeps the last iteration's lr.
            if where < 1.0:
                raise
            multiplier = self._multiplier((self._max_iter - 1) / self._max_iter)
        return [base_lr * multiplier for base_lr in self.base_lrs]


# ---- detectron2's older schedulers ----------------------------------------------------------
# Deprecated there in favour of LRMultiplier, kept for scripts that build them; their warm-up
# multiplies the main schedule (no joining where it picks up), exactly as in detectron2.


def _check_warmup_method(warmup_method: str) -> None:
    if warmup_method not in _WARMUP_METHODS:
        raise ConfigError(
            f"Unknown warm-up method {warmup_method!r} (SOLVER.WARMUP_METHOD); "
            f"choose one of {', '.join(_WARMUP_METHODS)}."
        )


def _get_warmup_factor_at_iter(
    method: str, iter: int, warmup_iters: int, warmup_factor: float
) -> float:
    """Return the warm-up multiplier of the learning rate at iteration ``iter``.

    Private in detectron2 too, but projects' own schedulers (DeepLab's ``WarmupPolyLR``,
    unbiased-teacher's two-stage schedule) import it from this module, so it keeps the name.

    Args:
        method: ``"constant"`` (``warmup_factor`` throughout the warm-up) or ``"linear"``
            (from ``warmup_factor`` at iteration 0 rising to 1 at ``warmup_iters``).
        iter: the iteration (0-based).
        warmup_iters: the warm-up's length; from there on the multiplier is 1.
        warmup_factor: the multiplier at iteration 0.

    Raises:
        ConfigError: A ``ValueError``: if ``method`` is neither (SOLVER.WARMUP_METHOD).
    """
    _check_warmup_method(method)
    if iter >= warmup_iters:
        return 1.0
    if method == "constant":
        return warmup_factor
    alpha = iter / warmup_iters
    return warmup_factor * (1.0 - alpha) + alpha


class _WarmupLRScheduler(torch.optim.lr_scheduler.LRScheduler):
    """The warm-up, checks and notice of the old schedulers; subclasses implement :meth:`_decay`.

    A subclass sets its fields before calling this ``__init__``: torch's computes the first lr.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_factor: float,
        warmup_iters: int,
        warmup_method: str,
        last_epoch: int,
    ) -> None:
        _check_warmup_method(warmup_method)
        logger.warning(
            "%s is kept for detectron2 scripts; prefer build_lr_scheduler or "
            "LRMultiplier over a WarmupParamScheduler.",
            type(self).__name__,
        )
        self.warmup_factor, self.warmup_iters = warmup_factor, warmup_iters
        self.warmup_method = warmup_method
        super().__init__(optimizer, last_epoch)

    def _decay(self) -> float:
        """The schedule's multiplier at ``last_epoch``, warm-up aside."""
        raise NotImplementedError

    @override
    def get_lr(self) -> list[float]:
        warmup = _get_warmup_factor_at_iter(
            self.warmup_method, self.last_epoch, self.warmup_iters, self.warmup_factor
        )
        return [base_lr * warmup * self._decay() for base_lr in self.base_lrs]


class WarmupMultiStepLR(_WarmupLRScheduler):
    """detectron2's older multi-step schedule: ``base_lr * warmup * gamma ** (#milestones passed)``.

    Prefer :func:`trainkit.solver.build_lr_scheduler` (or :class:`LRMultiplier` over a
    :class:`WarmupParamScheduler`), whose warm-up joins the schedule without a jump.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        milestones: list[int],
        gamma: float = 0.1,
        warmup_factor: float = 0.001,
        warmup_iters: int = 1000,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ) -> None:
        """Attach the schedule to ``optimizer``.

        Args:
            optimizer: the optimizer whose param groups' ``lr`` is set.
            milestones: increasing iterations at which the lr is multiplied by ``gamma``.
            gamma: the multiplier applied at each milestone.
            warmup_factor: the warm-up's multiplier at iteration 0.
            warmup_iters: length of the warm-up in iterations.
            warmup_method: ``"linear"`` or ``"constant"``.
            last_epoch: the last finished iteration, ``-1`` for a new run.

        Raises:
            ConfigError: A ``ValueError``: if ``milestones`` is not increasing or
                ``warmup_method`` is unknown.
        """
        if list(milestones) != sorted(milestones):
            raise ConfigError(
                f"milestones (SOLVER.STEPS) must be increasing iterations, got "
                f"{list(milestones)}; sort them."
            )
        self.milestones = list(milestones)
        self.gamma = gamma
        super().__init__(optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch)

    @override
    def _decay(self) -> float:
        return self.gamma ** bisect.bisect_right(self.milestones, self.last_epoch)


class WarmupCosineLR(_WarmupLRScheduler):
    """detectron2's older cosine schedule: ``base_lr * warmup * 0.5 * (1 + cos(pi * it / max))``.

    The cosine runs over ``max_iters`` from iteration 0 and decays to 0; prefer
    :func:`trainkit.solver.build_lr_scheduler` (SOLVER.LR_SCHEDULER_NAME ``WarmupCosineLR``),
    which also supports an end lr.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        max_iters: int,
        warmup_factor: float = 0.001,
        warmup_iters: int = 1000,
        warmup_method: str = "linear",
        last_epoch: int = -1,
    ) -> None:
        """Attach the schedule to ``optimizer``.

        Args:
            optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch: as for
                :class:`WarmupMultiStepLR`.
            max_iters: the iteration at which the cosine reaches 0.

        Raises:
            ConfigError: A ``ValueError``: if ``max_iters`` is not positive or
                ``warmup_method`` is unknown.
        """
        if max_iters <= 0:
            raise ConfigError(f"max_iters must be positive (SOLVER.MAX_ITER), got {max_iters}")
        self.max_iters = max_iters
        super().__init__(optimizer, warmup_factor, warmup_iters, warmup_method, last_epoch)

    @override
    def _decay(self) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * self.last_epoch / self.max_iters))
