"""``EventStorage`` and the stack of active storages; import them from ``trainkit.utils.events``.

The stack is one of trainkit's three allowed kinds of global state: a storage pushes itself
on ``__enter__`` and pops itself on ``__exit__``; a test that leaks one calls
:func:`_reset_storage_stack`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from trainkit.utils.history_buffer import HistoryBuffer

__all__ = ["EventStorage", "get_event_storage", "has_event_storage"]

logger = logging.getLogger(__name__)

_CURRENT_STORAGE_STACK: list[EventStorage] = []


def get_event_storage() -> EventStorage:
    """Return the innermost active :class:`EventStorage`.

    Raises:
        RuntimeError: If no ``with EventStorage(...):`` block is active in this process.
    """
    if not _CURRENT_STORAGE_STACK:
        raise RuntimeError(
            "get_event_storage() was called outside an EventStorage context. Trainers open one "
            "around train(); in your own loop wrap it in `with EventStorage(start_iter):`."
        )
    return _CURRENT_STORAGE_STACK[-1]


def has_event_storage() -> bool:
    """Return whether a ``with EventStorage(...):`` block is active in this process.

    Code that may run outside training (a model's forward in a notebook, say) checks this
    before calling :func:`get_event_storage`.
    """
    return bool(_CURRENT_STORAGE_STACK)


def _reset_storage_stack() -> None:
    """Forget every pushed storage (for tests that exit a storage context abnormally)."""
    _CURRENT_STORAGE_STACK.clear()


class EventStorage:
    """Per-iteration metrics (scalars, images, histograms) recorded during training.

    Each scalar keeps a :class:`~trainkit.utils.history_buffer.HistoryBuffer` of
    ``(value, iteration)`` points plus a *smoothing hint*: writers report the median over
    the last ``window_size`` iterations of a smoothed metric and the latest value of an
    unsmoothed one. It only stores; the writers in :mod:`trainkit.utils.events` write files.
    """

    def __init__(self, start_iter: int = 0) -> None:
        """Create an empty storage.

        Args:
            start_iter: the iteration values are filed under until :meth:`step` or
                :attr:`iter` changes it.
        """
        self._history: dict[str, HistoryBuffer] = {}
        self._smoothing_hints: dict[str, bool] = {}
        self._latest_scalars: dict[str, tuple[float, int]] = {}
        self._iter = int(start_iter)
        self._current_prefix = ""
        # Read and cleared by TensorboardXWriter; detectron2 writers read these names too.
        self._vis_data: list[tuple[str, torch.Tensor, int]] = []
        self._histograms: list[dict[str, Any]] = []

    def put_image(self, img_name: str, img_tensor: torch.Tensor) -> None:
        """Queue an image for the TensorBoard writer at the current iteration.

        Args:
            img_name: the tag shown in TensorBoard.
            img_tensor: a ``(C, H, W)`` float tensor in ``[0, 1]`` or uint8 in ``[0, 255]``.
        """
        self._vis_data.append((img_name, img_tensor, self._iter))

    def put_scalar(
        self,
        name: str,
        value: float | torch.Tensor,
        smoothing_hint: bool = True,
        cur_iter: int | None = None,
    ) -> None:
        """Record a scalar for the current (or the given) iteration.

        Args:
            name: metric name; the active :meth:`name_scope` prefix is prepended. Names
                containing ``"loss"`` or ``"[metric]"`` are shown by ``CommonMetricPrinter``.
            value: a number or a one-element tensor (converted with ``float``).
            smoothing_hint: whether writers should report a windowed median rather than the
                latest value. Must be the same every time a name is recorded.
            cur_iter: the iteration to file the value under; defaults to :attr:`iter`.

        Raises:
            ValueError: If ``smoothing_hint`` differs from an earlier call for ``name``.
        """
        name = self._current_prefix + name
        cur_iter = self._iter if cur_iter is None else int(cur_iter)
        value = float(value)
        history = self._history.get(name)
        # Called several times per step: the common case (a known name, the same hint)
        # costs two dictionary look-ups.
        if history is None or self._smoothing_hints[name] is not smoothing_hint:
            history = self._history_for(name, smoothing_hint)
        history.update(value, cur_iter)
        self._latest_scalars[name] = (value, cur_iter)

    def _history_for(
        self, name: str, smoothing_hint: bool, create: bool = True
    ) -> HistoryBuffer | None:
        """Check ``name``'s smoothing hint; return its buffer (made if new and ``create``)."""
        existing_hint = self._smoothing_hints.setdefault(name, smoothing_hint)
        if existing_hint != smoothing_hint:
            raise ValueError(
                f"Scalar {name!r} was recorded with smoothing_hint={existing_hint} before and "
                f"with smoothing_hint={smoothing_hint} now; use one value for a metric."
            )
        if create and name not in self._history:
            self._history[name] = HistoryBuffer()
        return self._history.get(name)

    def put_scalar_series(
        self, name: str, points: Iterable[tuple[float, int]], smoothing_hint: bool = True
    ) -> None:
        """Record ``(value, iteration)`` points of one scalar, oldest first, in one call.

        Equivalent to ``put_scalar(name, value, smoothing_hint, cur_iter=iteration)`` for each
        point in order, at a fraction of the cost; trainers use it to file the metrics of
        ``gather_metric_period`` steps at once.

        Args:
            name, smoothing_hint: as in :meth:`put_scalar`.
            points: ``(value, iteration)`` pairs, oldest first.

        Raises:
            ValueError: As :meth:`put_scalar`.
        """
        name = self._current_prefix + name
        points = points if isinstance(points, (list, tuple)) else list(points)
        history = self._history_for(name, smoothing_hint, create=bool(points))
        if points:  # an empty series files nothing (and creates no history)
            history.extend(points)
            value, cur_iter = points[-1]
            self._latest_scalars[name] = (float(value), int(cur_iter))

    def put_scalars(
        self, *, smoothing_hint: bool = True, cur_iter: int | None = None, **kwargs: float
    ) -> None:
        """Record several scalars at once: ``storage.put_scalars(loss=1.0, acc=0.5)``."""
        for name, value in kwargs.items():
            self.put_scalar(name, value, smoothing_hint=smoothing_hint, cur_iter=cur_iter)

    def put_histogram(self, hist_name: str, hist_tensor: torch.Tensor, bins: int = 1000) -> None:
        """Queue a histogram of ``hist_tensor``'s values for the TensorBoard writer.

        Args:
            hist_name: the tag shown in TensorBoard.
            hist_tensor: any tensor; it is flattened.
            bins: number of equal-width buckets between its min and max.
        """
        values = hist_tensor.detach().float().flatten().cpu()
        ht_min, ht_max = values.min().item(), values.max().item()
        counts = torch.histc(values, bins=bins, min=ht_min, max=ht_max)
        edges = torch.linspace(ht_min, ht_max, steps=bins + 1, dtype=torch.float32)
        self._histograms.append(
            {
                "tag": hist_name,
                "min": ht_min,
                "max": ht_max,
                "num": len(values),
                "sum": float(values.sum()),
                "sum_squares": float(torch.sum(values**2)),
                "bucket_limits": edges[1:].tolist(),
                "bucket_counts": counts.tolist(),
                "global_step": self._iter,
            }
        )

    def history(self, name: str) -> HistoryBuffer:
        """Return the history of scalar ``name`` (the full name, scope prefix included).

        Raises:
            KeyError: If ``name`` was never recorded.
        """
        history = self._history.get(name)
        if history is None:
            raise KeyError(f"No history metric available for {name!r}")
        return history

    def histories(self) -> dict[str, HistoryBuffer]:
        """Return every scalar's history, keyed by name, in the order names first appeared."""
        return dict(self._history)

    def latest(self) -> dict[str, tuple[float, int]]:
        """Return ``{name: (latest value, iteration it was recorded at)}``."""
        return dict(self._latest_scalars)

    def latest_with_smoothing_hint(self, window_size: int = 20) -> dict[str, tuple[float, int]]:
        """Return like :meth:`latest`, but smoothed metrics give a windowed median.

        The window is the values of the last ``window_size`` iterations (see
        :meth:`count_samples`), not the last ``window_size`` values: a metric recorded
        several times per iteration, or every few, is smoothed over the same stretch of
        training as the others.

        Args:
            window_size: number of iterations the median is taken over.
        """
        result = {}
        for name, (value, cur_iter) in self._latest_scalars.items():
            if self._smoothing_hints[name]:
                history = self._history[name]
                value = history.median(history.count_recent(window_size))
            result[name] = (value, cur_iter)
        return result

    def count_samples(self, name: str, window_size: int = 20) -> int:
        """Return how many values of ``name`` its last ``window_size`` iterations hold.

        Iterations are counted back from that of ``name``'s newest value; 0 if ``name`` was
        never recorded.

        Args:
            name: the full metric name.
            window_size: number of iterations.
        """
        history = self._history.get(name)
        return history.count_recent(window_size) if history is not None else 0

    def smoothing_hints(self) -> dict[str, bool]:
        """Return ``{name: smoothing_hint}`` for every recorded scalar."""
        return dict(self._smoothing_hints)

    def step(self) -> None:
        """Advance :attr:`iter` by one; later ``put_*`` calls file under the next iteration."""
        self._iter += 1

    @property
    def iter(self) -> int:
        """The iteration new values are filed under (the trainer sets it before each step)."""
        return self._iter

    @iter.setter
    def iter(self, val: int) -> None:
        self._iter = int(val)

    @property
    def iteration(self) -> int:
        """Alias of :attr:`iter` kept for detectron2 compatibility."""
        return self._iter

    def __enter__(self) -> EventStorage:
        _CURRENT_STORAGE_STACK.append(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        # Remove by identity and never raise: raising here would hide the exception that is
        # unwinding the training loop, which is the one the user needs to see.
        for i in range(len(_CURRENT_STORAGE_STACK) - 1, -1, -1):
            if _CURRENT_STORAGE_STACK[i] is self:
                if i != len(_CURRENT_STORAGE_STACK) - 1:
                    logger.warning("EventStorage contexts were exited out of order")
                del _CURRENT_STORAGE_STACK[i]
                return

    @contextlib.contextmanager
    def name_scope(self, name: str) -> Iterator[None]:
        """Prefix every scalar recorded inside the block with ``name + "/"``.

        Scopes do not nest: an inner scope replaces the outer prefix until it ends.
        """
        previous, self._current_prefix = self._current_prefix, name.rstrip("/") + "/"
        try:
            yield
        finally:
            self._current_prefix = previous

    def clear_images(self) -> None:
        """Drop queued images (writers call this after publishing them)."""
        self._vis_data = []

    def clear_histograms(self) -> None:
        """Drop queued histograms (writers call this after publishing them)."""
        self._histograms = []
