"""A step trainer's metrics between period ends: each step's losses kept and checked, then filed.

:class:`PeriodMetrics` is what :class:`~trainkit.engine.simple_trainer.SimpleTrainer` records
into. A step's losses are checked for NaN/inf either at once (read to the host: free on the
CPU) or on their device (:class:`~trainkit.engine.deferred_checks.DeferredLossCheck`, read at
the period end and before checkpoints), kept as floats or detached device tensors, and filed
together at the period end (:func:`~trainkit.engine.step_metrics.gather_and_file`: one host
copy, one ``all_gather``). The trainer decides which steps are recorded and when a period
ends; this module decides nothing about the schedule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from trainkit.engine.deferred_checks import DeferredLossCheck
from trainkit.engine.step_metrics import (
    MetricEntry,
    NonFiniteLossError,
    gather_and_file,
    host_values,
    metric_names,
    raise_non_finite,
)
from trainkit.utils.events import EventStorage

if TYPE_CHECKING:
    from trainkit.engine.stragglers import RankFigures

__all__ = ["PeriodMetrics"]


class PeriodMetrics:
    """The steps' losses since the last period end, and the first non-finite one on a device."""

    def __init__(self) -> None:
        """Start with nothing kept."""
        self._buffer: list[MetricEntry] = []
        self._pending = DeferredLossCheck()
        # The loss names (and prefix) of the previous step and the metric names from them:
        # recomputed only when a model's losses change.
        self._loss_keys: tuple[tuple[str, ...], str] = ((), "")
        self._names: tuple[str, ...] = ()

    def add(
        self,
        cur_iter: int,
        loss_dict: Mapping[str, torch.Tensor],
        total_loss: torch.Tensor,
        data_time: float,
        prefix: str = "",
        *,
        keep: bool,
        deferred: bool,
    ) -> None:
        """Check step ``cur_iter``'s losses and keep them for the period end if ``keep``.

        Args:
            cur_iter: the step's iteration.
            loss_dict: its losses; ``total_loss`` their sum.
            data_time: seconds it waited for its batches.
            prefix: prepended to ``total_loss`` (detectron2's convention).
            keep: file this step at the next period end.
            deferred: note a non-finite loss on the device, read by :meth:`check` (no wait);
                otherwise read the sum now.

        Raises:
            NonFiniteLossError: Without ``deferred``, if the sum is infinite or NaN.
        """
        if self._loss_keys != (tuple(loss_dict), prefix):
            self._loss_keys = (tuple(loss_dict), prefix)
            self._names = metric_names(tuple(loss_dict), prefix)
        names = self._names
        values: list[Any]
        if deferred:
            values = [loss_dict[name].detach() for name in names[:-1]] + [total_loss.detach()]
            self._pending.add(cur_iter, names, values)
        else:
            # The sum is non-finite whenever a term is: checking it covers all.
            total = total_loss.item()
            if not math.isfinite(total):
                raise_non_finite(cur_iter, names, host_values(loss_dict, names, total))
            if not keep:
                return
            values = host_values(loss_dict, names, total)
        if keep:
            self._buffer.append((cur_iter, names, values, data_time))

    def check(self, *, collective: bool = True) -> None:
        """Raise if a step added since the last check had a non-finite loss on its device.

        Args:
            collective: every rank calls it here and all agree on the earliest bad step;
                ``False`` checks this rank's steps only.

        Raises:
            NonFiniteLossError: Naming the first bad step (of any rank when ``collective``).

        Collective:
            ``all_gather`` over all ranks when ``collective`` and there are several.
        """
        self._pending.check(collective=collective)

    def file(
        self, storage: EventStorage, cur_iter: int, figures: RankFigures | None = None
    ) -> None:
        """File the kept steps' rank averages into ``storage`` and start the next period.

        A non-finite step found now (deferred, or in another rank's values) stops the filing
        there: the steps before it are filed on every rank, then it raises.

        Args:
            storage: where the averages go.
            cur_iter: the iteration that ends the period.
            figures: the straggler detector's figures, which travel with the metrics and are
                compared once every rank's arrived.

        Raises:
            NonFiniteLossError: On every rank, for the first non-finite step of any rank.

        Collective:
            ``all_gather`` over all ranks; every rank files at the same iterations.
        """
        buffered, self._buffer = self._buffer, []
        try:
            self.check()
        except NonFiniteLossError as e:
            buffered = [entry for entry in buffered if entry[0] < e.iteration]
            if buffered:
                gather_and_file(buffered, storage)
            raise
        if not buffered:
            return
        share = None if figures is None else functools.partial(figures.collect, cur_iter)
        per_rank = gather_and_file(buffered, storage, share=share)
        if figures is not None:
            figures.compare(per_rank, storage)
