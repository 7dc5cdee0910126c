"""Learning-rate schedules as fvcore param schedulers, driven per iteration by ``LRMultiplier``."""

from __future__ import annotations

import logging
from typing import Any

import torch
from fvcore.common.param_scheduler import ParamScheduler
from typing_extensions import override

__all__ = ["LRMultiplier", "WarmupParamScheduler"]

logger = logging.getLogger(__name__)

_WARMUP_METHODS = ("linear", "constant")


class WarmupParamScheduler(ParamScheduler):
    """Add a warm-up phase to the start of another param scheduler.

    During the first ``warmup_length`` fraction of training the value goes from
    ``warmup_factor * scheduler(0)`` to ``scheduler(warmup_length)`` (``"linear"``), or stays at
    ``warmup_factor * scheduler(0)`` (``"constant"``). Afterwards it is ``scheduler(where)``,
    so the wrapped schedule keeps its own timeline (its milestones are not shifted).
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
            ValueError: If ``warmup_method`` is unknown or ``warmup_length`` is outside [0, 1].
        """
        if warmup_method not in _WARMUP_METHODS:
            raise ValueError(
                f"Unknown warm-up method {warmup_method!r} (SOLVER.WARMUP_METHOD); "
                f"choose one of {', '.join(_WARMUP_METHODS)}."
            )
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
    optimizer's step.

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
            ValueError: If ``max_iter`` is not positive.
        """
        if not isinstance(multiplier, ParamScheduler):
            raise TypeError(
                "LRMultiplier needs an fvcore ParamScheduler as multiplier, got "
                f"{type(multiplier).__name__}"
            )
        if max_iter <= 0:
            raise ValueError(f"max_iter must be positive (SOLVER.MAX_ITER), got {max_iter}")
        self._multiplier = multiplier
        self._max_iter = int(max_iter)
        super().__init__(optimizer, last_epoch=last_iter)

    @override
    def state_dict(self) -> dict[str, Any]:
        # Plain numbers only, so the state survives torch.load(weights_only=True); the
        # multiplier is rebuilt from the config.
        return {
            "base_lrs": list(self.base_lrs),
            "last_epoch": self.last_epoch,
            "_last_lr": list(getattr(self, "_last_lr", [])),
            "_step_count": getattr(self, "_step_count", 0),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        known = {"base_lrs", "last_epoch", "_last_lr", "_step_count"}
        unknown = set(state_dict) - known
        if unknown:
            logger.warning("Ignoring unknown LRMultiplier state keys: %s", sorted(unknown))
        self.__dict__.update({k: v for k, v in state_dict.items() if k in known})

    @override
    def get_lr(self) -> list[float]:
        # One step past the end (the scheduler is stepped after the final iteration) is
        # clamped: several fvcore schedulers refuse where >= 1.
        where = min(self.last_epoch / self._max_iter, 1.0 - 1e-9)
        multiplier = self._multiplier(max(where, 0.0))
        return [base_lr * multiplier for base_lr in self.base_lrs]
