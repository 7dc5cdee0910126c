"""A step's losses as its events' listeners: checked for NaN/inf, kept, filed at period ends.

A step trainer subscribes two listeners to its loop's events
(:class:`~trainkit.engine.events.StepEvents`): :class:`LossCheck` refuses a non-finite loss,
read at once (free on the CPU) or noted on its device (:class:`DeferredLossCheck`, read at the
period end and before checkpoints); :class:`MetricsWriter` keeps each step's losses and files
them at the period end (:func:`~trainkit.engine.step_metrics.gather_and_file`: one host copy,
one ``all_gather``, which the slow-rank figures ride along). The step trainer decides when a
period ends; these decide nothing about the schedule.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor
from typing_extensions import override

from trainkit.engine.events import StepEvents, StepListener
from trainkit.engine.step_metrics import (
    MetricEntry,
    NonFiniteLossError,
    gather_and_file,
    host_values,
    metric_names,
    raise_non_finite,
)
from trainkit.utils import comm
from trainkit.utils.events import EventStorage

__all__ = ["DeferredLossCheck", "LossCheck", "MetricsWriter"]

_ALL_FINITE = -1  # the first bad step's value while every step so far was finite
_Losses = Mapping[str, Tensor]  # a step's loss terms by name
_metric_names = functools.lru_cache(maxsize=1)(metric_names)  # loss names rarely change


class DeferredLossCheck:
    """Remember, on the device, the first non-finite step since the last :meth:`check`."""

    def __init__(self) -> None:
        """Start with nothing pending."""
        self._first_bad_iter: torch.Tensor | None = None  # int64 scalar, _ALL_FINITE if none
        self._bad_values: torch.Tensor | None = None  # float32 [len(names)]: that step's terms
        self._names: tuple[str, ...] = ()
        self._num_pending = 0
        self._last_iter = -1

    @property
    def num_pending(self) -> int:
        """Steps added since the last :meth:`check`."""
        return self._num_pending

    def add(self, cur_iter: int, names: tuple[str, ...], values: Sequence[torch.Tensor]) -> None:
        """Note step ``cur_iter``'s losses without reading them.

        Args:
            cur_iter: the step (0-based).
            names: the metric names of ``values``; the last is the total.
            values: one-element tensors on one device, the total last; a non-finite total
                marks the step (it is non-finite whenever a term is).

        Raises:
            NonFiniteLossError: Only when the loss names changed since the previous step and
                an earlier pending step was not finite (the change makes this one read).
        """
        stacked = torch.stack([value.detach().float().reshape(()) for value in values])
        if names != self._names:
            # A step's terms are kept in one tensor of the names' length: read what is
            # pending before the layout changes (rare: a model whose loss names vary).
            self.check(collective=False)
            self._names = names
            self._first_bad_iter = torch.full_like(stacked[-1], _ALL_FINITE, dtype=torch.long)
            self._bad_values = torch.zeros_like(stacked)
        assert self._first_bad_iter is not None and self._bad_values is not None
        is_first_bad = (self._first_bad_iter == _ALL_FINITE) & ~torch.isfinite(stacked[-1])
        # torch.where with a Python number runs on the device: nothing is copied to the host.
        self._first_bad_iter = torch.where(is_first_bad, cur_iter, self._first_bad_iter)
        self._bad_values = torch.where(is_first_bad, stacked, self._bad_values)
        self._num_pending += 1
        self._last_iter = cur_iter

    def check(self, *, collective: bool) -> None:
        """Read what is pending (one copy to the host) and raise if a step was not finite.

        Args:
            collective: agree with every rank: all of them raise, naming the earliest bad
                step of any rank. Every rank must then call it at the same step.

        Raises:
            NonFiniteLossError: Naming the first bad step and its loss terms.

        Collective:
            ``all_gather`` over all ranks when ``collective`` and there are several.
        """
        found = None  # raise_non_finite's arguments: first bad step, names, values, noticed at
        if self._num_pending:
            assert self._first_bad_iter is not None and self._bad_values is not None
            host = torch.cat([self._first_bad_iter.double().reshape(1), self._bad_values.double()])
            first_bad, *values = host.cpu().tolist()
            if first_bad == _ALL_FINITE:
                self._num_pending = 0
            else:  # the state is kept: a later check raises the same error again
                found = (int(first_bad), self._names, values, self._last_iter)
        if collective and comm.get_world_size() > 1:
            bad = [entry for entry in comm.all_gather(found) if entry is not None]
            found = min(bad, key=lambda entry: entry[0], default=None)
        if found is not None:
            raise_non_finite(*found)


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

    @override
    def on_losses(
        self, iteration: int, losses: _Losses, total: Tensor, data_time: float, prefix: str
    ) -> None:
        names = _metric_names(tuple(losses), prefix)
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

    A non-finite step found at the period end (noted on a device, or in another rank's values) stops
    the filing there: the steps before it are filed on every rank, then it raises.

    Args:
        check: the step's loss check, read before filing.
        every_step: keep every step's losses (``DefaultTrainer``); else only the step that
            ends the period (detectron2's ``gather_metric_period``).
    """

    def __init__(self, check: LossCheck, *, every_step: bool = False) -> None:
        self.check = check
        self.every_step = every_step
        self._buffer: list[MetricEntry] = []

    @override
    def on_losses(
        self, iteration: int, losses: _Losses, total: Tensor, data_time: float, prefix: str
    ) -> None:
        names = _metric_names(tuple(losses), prefix)
        # Detached tensors, read at the period end with one copy (a CPU step reads nothing).
        values = [losses[n].detach() for n in names[:-1]] + [total.detach()]
        if not self.every_step:
            self._buffer.clear()
        self._buffer.append((iteration, names, values, data_time))

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
        figures = functools.partial(events.collect_figures, iteration)
        per_rank = gather_and_file(buffered, storage, share=figures)
        if per_rank and per_rank[0] is not None:
            events.compare_figures(per_rank, storage)
