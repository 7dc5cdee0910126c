"""A step's losses as its events' listeners: checked for NaN/inf, kept, filed at period ends.

A step trainer subscribes two listeners to its loop's events
(:class:`~trainkit.engine.events.StepEvents`): :class:`LossCheck` refuses a non-finite loss,
read at once (free on the CPU) or noted on its device
(:class:`~trainkit.engine.deferred_checks.DeferredLossCheck`, read at the period end and
before checkpoints); :class:`MetricsWriter` keeps each step's losses and files them at the
period end (:func:`~trainkit.engine.step_metrics.gather_and_file`: one host copy, one
``all_gather``, which the slow-rank figures ride along). The step trainer decides when a
period ends; these decide nothing about the schedule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import torch
from typing_extensions import override

from trainkit.engine.deferred_checks import DeferredLossCheck
from trainkit.engine.events import StepEvents, StepListener
from trainkit.engine.step_metrics import (
    MetricEntry,
    NonFiniteLossError,
    gather_and_file,
    host_values,
    metric_names,
    raise_non_finite,
)
from trainkit.utils.events import EventStorage

__all__ = ["LossCheck", "MetricsWriter"]


class _Names:
    """The metric names of a step's losses, recomputed only when the loss names change."""

    def __init__(self) -> None:
        self._key: tuple[tuple[str, ...], str] = ((), "")
        self._names: tuple[str, ...] = ()

    def __call__(self, losses: Mapping[str, torch.Tensor], prefix: str) -> tuple[str, ...]:
        key = (tuple(losses), prefix)
        if key != self._key:
            self._key, self._names = key, metric_names(key[0], prefix)
        return self._names


class LossCheck(StepListener):
    """Refuse a step whose total loss is infinite or NaN.

    Args:
        deferred: note a non-finite loss on its device and read it at the period end and
            before checkpoints (:meth:`check`), so no step waits (True); read the sum at once
            (False); ``None``: deferred for losses on a device, at once on the CPU.
    """

    def __init__(self, deferred: bool | None = None) -> None:
        self.deferred = deferred
        self._pending = DeferredLossCheck()
        self._names = _Names()

    @override
    def on_losses(
        self,
        iteration: int,
        losses: Mapping[str, torch.Tensor],
        total: torch.Tensor,
        data_time: float,
        prefix: str,
    ) -> None:
        names = self._names(losses, prefix)
        deferred = not total.is_cpu if self.deferred is None else self.deferred
        if deferred:
            values = [losses[name].detach() for name in names[:-1]] + [total.detach()]
            self._pending.add(iteration, names, values)
            return
        # The sum is non-finite whenever a term is: checking it covers all.
        value = total.item()
        if not math.isfinite(value):
            raise_non_finite(iteration, names, host_values(losses, names, value))

    def check(self, *, collective: bool = True) -> None:
        """Raise if a step noted since the last check had a non-finite loss.

        Args:
            collective: every rank calls it here and all agree on the earliest bad step;
                ``False`` checks this rank's steps only.

        Raises:
            NonFiniteLossError: Naming the first bad step (of any rank when ``collective``).

        Collective:
            ``all_gather`` over all ranks when ``collective`` and there are several.
        """
        self._pending.check(collective=collective)


class MetricsWriter(StepListener):
    """Keep each step's losses and file their rank averages into the storage at period ends.

    A non-finite step found at the period end (noted on a device, or in another rank's
    values) stops the filing there: the steps before it are filed on every rank, then it
    raises.

    Args:
        check: the step's loss check, read before filing.
        every_step: keep every step's losses (``DefaultTrainer``); else only the step that
            ends the period (detectron2's ``gather_metric_period``).
    """

    def __init__(self, check: LossCheck, *, every_step: bool = False) -> None:
        self.check = check
        self.every_step = every_step
        self._buffer: list[MetricEntry] = []
        self._names = _Names()

    @override
    def on_losses(
        self,
        iteration: int,
        losses: Mapping[str, torch.Tensor],
        total: torch.Tensor,
        data_time: float,
        prefix: str,
    ) -> None:
        names = self._names(losses, prefix)
        # Detached tensors, read at the period end with one copy (a CPU step reads nothing).
        entry = (iteration, names, [losses[n].detach() for n in names[:-1]] + [total.detach()])
        if self.every_step:
            self._buffer.append((*entry, data_time))
        else:
            self._buffer = [(*entry, data_time)]

    @override
    def on_period_end(self, iteration: int, storage: EventStorage, events: StepEvents) -> None:
        buffered, self._buffer = self._buffer, []
        try:
            self.check.check()
        except NonFiniteLossError as e:
            buffered = [entry for entry in buffered if entry[0] < e.iteration]
            if buffered:
                gather_and_file(buffered, storage)
            raise
        if not buffered:
            return
        figures: Any = functools.partial(events.collect_figures, iteration)
        per_rank = gather_and_file(buffered, storage, share=figures)
        if per_rank and per_rank[0] is not None:
            events.compare_figures(per_rank, storage)
