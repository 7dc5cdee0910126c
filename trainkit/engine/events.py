"""The loop's event channel: each iteration's phases, its losses and the end of each period.

One :class:`StepEvents` belongs to a loop (``TrainerBase.events``). Once per iteration,
whatever ``SOLVER.ACCUMULATE_STEPS`` is, these announce on it:

* the step trainer bound to the loop: ``data`` (drawing the step's batches),
  ``forward/backward``, ``collective`` (DDP's wait for the gradient all-reduce, and a period
  end's metric sync), ``optimizer`` (``after_backward`` hooks and the update); then the step's
  losses and, at a writer period's end, the period end;
* the loop: ``hooks`` (the ``after_step`` hooks, and the next step's ``before_step`` ones);
* a save and an evaluation: ``checkpoint`` and ``eval`` (:meth:`StepEvents.during`).

Nothing else marks phases. Subscribers (:class:`StepListener`) are the stall watchdog, the
slow-rank clock, the device-wait counter, the loss check and the metrics writer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from torch import Tensor

from trainkit.utils.events import EventStorage

__all__ = ["StepEvents", "StepListener"]

_Losses = Mapping[str, Tensor]  # a step's loss terms by name


class StepListener:
    """What subscribes to a :class:`StepEvents`; override the methods you need.

    Only those are called, so the events a listener ignores cost a step nothing.
    """

    def on_phase(self, phase: str, iteration: int) -> None:
        """This rank starts ``phase`` in ``iteration`` (no wait: called on every change)."""

    def on_losses(
        self, iteration: int, losses: _Losses, total: Tensor, data_time: float, prefix: str
    ) -> None:
        """Step ``iteration``'s losses (averaged over its micro-batches) and their sum.

        ``data_time`` is the seconds it waited for its batches; ``prefix`` is prepended to
        ``total_loss`` (detectron2's convention).
        """

    def on_period_end(self, iteration: int, storage: EventStorage, events: StepEvents) -> None:
        """Step ``iteration`` ends a writer period: file what was kept into ``storage``.

        ``events`` lends the metrics' one ``all_gather`` to the listeners that send figures
        with it (:meth:`StepEvents.collect_figures`). Every rank gets it at the same steps.
        """

    def period_figures(self, iteration: int) -> Any:
        """Return this rank's figures to send with the period's metrics (one ``all_gather``)."""

    def compare_figures(self, per_rank: list[Any], storage: EventStorage) -> None:
        """Use every rank's :meth:`period_figures` (index = rank)."""


class StepEvents:
    """A loop's event channel (see the module docstring).

    Args:
        progress: the loop's position (its ``iter`` is passed to phase listeners).
    """

    def __init__(self, progress: Any) -> None:
        self._progress = progress
        self.listeners: list[StepListener] = []
        self.step_listeners: list[StepListener] = []
        """Those of the step trainer bound to the loop (:meth:`bind_step`)."""
        self.current_phase = "start"
        self._reindex()

    def subscribe(self, *listeners: StepListener) -> None:
        """Add ``listeners``; each hears the events it overrides, in subscription order.

        Raises:
            TypeError: If one is not a :class:`StepListener`.
        """
        for listener in listeners:
            if not isinstance(listener, StepListener):
                raise TypeError(f"{type(listener).__name__} is not a StepListener")
        self.listeners += [x for x in listeners if x not in self.listeners]
        self._reindex()

    def bind_step(self, listeners: list[StepListener]) -> None:
        """Make ``listeners`` the step trainer's, replacing those of a step bound before."""
        self.listeners = [x for x in self.listeners if x not in self.step_listeners]
        self.step_listeners = list(listeners)
        self.subscribe(*listeners)

    def _reindex(self) -> None:
        # Only what a listener overrides is called: most listeners hear one kind of event.
        own = [(x, type(x)) for x in self.listeners]
        self._on_phase = [x.on_phase for x, t in own if t.on_phase is not StepListener.on_phase]
        self._on_losses = [x.on_losses for x, t in own if t.on_losses is not StepListener.on_losses]
        self._on_period_end = [
            x.on_period_end for x, t in own if t.on_period_end is not StepListener.on_period_end
        ]
        self._riders = [x for x, t in own if t.period_figures is not StepListener.period_figures]

    def phase(self, name: str) -> None:
        """Announce that this rank starts phase ``name``."""
        self.current_phase = name
        for listener in self._on_phase:
            listener(name, self._progress.iter)

    @contextlib.contextmanager
    def during(self, name: str) -> Iterator[None]:
        """Be in phase ``name`` for the body (a save, an evaluation), then in the one before."""
        previous = self.current_phase
        self.phase(name)
        try:
            yield
        finally:
            self.phase(previous)

    def losses(
        self, iteration: int, losses: _Losses, total: Tensor, data_time: float, prefix: str = ""
    ) -> None:
        """Announce step ``iteration``'s losses (see :meth:`StepListener.on_losses`)."""
        for listener in self._on_losses:
            listener(iteration, losses, total, data_time, prefix)

    def period_end(self, iteration: int, storage: EventStorage) -> None:
        """Announce that ``iteration`` ends a writer period (collective: on every rank)."""
        for listener in self._on_period_end:
            listener(iteration, storage, self)

    def collect_figures(self, iteration: int) -> list[Any] | None:
        """Return the figures of every listener that sends some with the period's metrics."""
        return [rider.period_figures(iteration) for rider in self._riders] or None

    def compare_figures(self, per_rank: list[list[Any] | None], storage: EventStorage) -> None:
        """Hand each rider every rank's figures (``per_rank[r][i]``: rank r's, rider i's)."""
        for i, rider in enumerate(self._riders):
            rider.compare_figures([figures[i] for figures in per_rank], storage)
