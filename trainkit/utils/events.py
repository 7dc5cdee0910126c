"""Training metrics: the ``EventStorage`` context stack and the writers that drain it.

Code anywhere in a training step records numbers with ``get_event_storage().put_scalar(...)``;
writers (:class:`CommonMetricPrinter`, :class:`JSONWriter`, :class:`TensorboardXWriter`) run
periodically and publish what is new since their previous write.

The storage stack is one of trainkit's three allowed kinds of global state. ``EventStorage``
pushes itself on ``__enter__`` and pops itself on ``__exit__``; a test that leaks a storage can
call :func:`_reset_storage_stack`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import math
import statistics
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from typing import IO, Any

import torch
from fvcore.common.history_buffer import HistoryBuffer
from typing_extensions import override

from trainkit.utils.file_io import PathManager

__all__ = [
    "CommonMetricPrinter",
    "EventStorage",
    "EventWriter",
    "JSONWriter",
    "TensorboardXWriter",
    "get_event_storage",
]

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


def _reset_storage_stack() -> None:
    """Forget every pushed storage (for tests that exit a storage context abnormally)."""
    _CURRENT_STORAGE_STACK.clear()


class _HistoryBuffer(HistoryBuffer):
    """fvcore's buffer with a pure-Python windowed median and mean.

    Writers take several medians of ~20 values at every write; ``np.median`` spends ~15 us
    per call converting the list, ten times what sorting it takes. Results are the same
    (the mean of the middle two values for an even count), as a Python float.
    """

    def median(self, window_size: int) -> float:
        window = sorted(x[0] for x in self._data[-window_size:])
        if not window:
            return float("nan")
        mid = len(window) // 2
        return float(window[mid]) if len(window) % 2 else (window[mid - 1] + window[mid]) / 2.0

    def avg(self, window_size: int) -> float:
        window = [x[0] for x in self._data[-window_size:]]
        return math.fsum(window) / len(window) if window else float("nan")

    def extend(self, points: list[tuple[float, int]]) -> None:
        """Append ``(value, iteration)`` points, as ``update`` for each would, in one go."""
        if not points:
            return
        self._data.extend(points)
        if len(self._data) > self._max_length:
            del self._data[: len(self._data) - self._max_length]
        # The running mean over all values ever added, updated with the new ones' sum.
        count = self._count + len(points)
        new_sum = math.fsum(value for value, _ in points)
        self._global_avg += (new_sum - len(points) * self._global_avg) / count
        self._count = count


class EventStorage:
    """Per-iteration metrics (scalars, images, histograms) recorded during training.

    Each scalar keeps a :class:`fvcore.common.history_buffer.HistoryBuffer` of
    ``(value, iteration)`` pairs plus a *smoothing hint*: writers report the windowed median
    of a smoothed metric and the latest value of an unsmoothed one.

    This class only stores; it never writes files. Use the writers in this module for that.
    """

    def __init__(self, start_iter: int = 0) -> None:
        self._history: defaultdict[str, HistoryBuffer] = defaultdict(_HistoryBuffer)
        self._smoothing_hints: dict[str, bool] = {}
        self._latest_scalars: dict[str, tuple[float, int]] = {}
        self._iter = int(start_iter)
        self._current_prefix = ""
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
            name: metric name; the active :meth:`name_scope` prefix is prepended.
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
        self._history[name].update(value, cur_iter)
        self._latest_scalars[name] = (value, cur_iter)
        self._check_smoothing_hint(name, smoothing_hint)

    def _check_smoothing_hint(self, name: str, smoothing_hint: bool) -> None:
        existing_hint = self._smoothing_hints.setdefault(name, smoothing_hint)
        if existing_hint != smoothing_hint:
            raise ValueError(
                f"Scalar {name!r} was recorded with smoothing_hint={existing_hint} before and "
                f"with smoothing_hint={smoothing_hint} now; use one value for a metric."
            )

    def put_scalar_series(
        self, name: str, points: Iterable[tuple[float, int]], smoothing_hint: bool = True
    ) -> None:
        """Record several ``(value, iteration)`` points of one scalar in one call.

        Equivalent to ``put_scalar(name, value, smoothing_hint, cur_iter=iteration)`` for each
        point in order, at a fraction of the cost; trainers use it to file the metrics of
        ``gather_metric_period`` steps at once.

        Args:
            name: metric name; the active :meth:`name_scope` prefix is prepended.
            points: ``(value, iteration)`` pairs, oldest first.
            smoothing_hint: as in :meth:`put_scalar`.

        Raises:
            ValueError: If ``smoothing_hint`` differs from an earlier call for ``name``.
        """
        name = self._current_prefix + name
        self._check_smoothing_hint(name, smoothing_hint)
        checked = [(float(value), int(cur_iter)) for value, cur_iter in points]
        if checked:
            self._history[name].extend(checked)
            self._latest_scalars[name] = checked[-1]

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
        """Return the history of scalar ``name``.

        Raises:
            KeyError: If ``name`` was never recorded.
        """
        # Not self._history[name]: the defaultdict would silently create an empty buffer.
        if name not in self._history:
            raise KeyError(f"No history metric available for {name!r}")
        return self._history[name]

    def histories(self) -> dict[str, HistoryBuffer]:
        """Return every scalar's history, keyed by name."""
        return dict(self._history)

    def latest(self) -> dict[str, tuple[float, int]]:
        """Return ``{name: (latest value, iteration it was recorded at)}``."""
        return dict(self._latest_scalars)

    def latest_with_smoothing_hint(self, window_size: int = 20) -> dict[str, tuple[float, int]]:
        """Return like :meth:`latest`, but smoothed metrics give their median over a window.

        Args:
            window_size: number of most recent values the median is taken over.
        """
        result = {}
        for name, (value, cur_iter) in self._latest_scalars.items():
            if self._smoothing_hints[name]:
                value = self._history[name].median(window_size)
            result[name] = (value, cur_iter)
        return result

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
        """Prefix every scalar recorded inside the block with ``name + "/"``."""
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


class EventWriter:
    """Base class of writers that publish what an :class:`EventStorage` recorded."""

    def write(self) -> None:
        """Publish the metrics of the current storage that are new since the last write."""
        raise NotImplementedError

    def close(self) -> None:
        """Release files or handles; the default does nothing."""


class JSONWriter(EventWriter):
    """Append one JSON object per iteration to a file (usually ``OUTPUT_DIR/metrics.json``).

    Each line holds ``"iteration"`` and every scalar recorded at that iteration since the
    previous write; smoothed scalars are medians over ``window_size``. Read it back with::

        [json.loads(line) for line in open("metrics.json")]

    The file is flushed, not fsynced, after every write: a few lines may be lost in a power
    failure, but training is not stalled by disk latency.
    """

    def __init__(self, json_file: str, window_size: int = 20) -> None:
        """Open ``json_file`` for appending (existing lines are kept, e.g. across a resume).

        Args:
            json_file: path of the file; opened through ``PathManager``.
            window_size: window of the median of smoothed scalars.
        """
        self._file_handle: IO[str] = PathManager.open(json_file, "a")
        self._window_size = window_size
        self._last_write = -1

    @override
    def write(self) -> None:
        storage = get_event_storage()
        to_save: defaultdict[int, dict[str, float]] = defaultdict(dict)
        for name, (value, cur_iter) in storage.latest_with_smoothing_hint(
            self._window_size
        ).items():
            # Metrics put at an iteration that was already written are old news.
            if cur_iter <= self._last_write:
                continue
            to_save[cur_iter][name] = value
        if not to_save:
            return
        self._last_write = max(to_save)
        for cur_iter, scalars in sorted(to_save.items()):
            scalars["iteration"] = cur_iter
            self._file_handle.write(json.dumps(scalars, sort_keys=True) + "\n")
        self._file_handle.flush()

    @override
    def close(self) -> None:
        self._file_handle.close()


class TensorboardXWriter(EventWriter):
    """Write scalars, images and histograms to TensorBoard event files in ``log_dir``.

    Scalars are batched: each :meth:`write` builds one summary per new iteration, and the
    summaries are handed to TensorBoard's background writer thread at most every
    ``handoff_secs`` seconds and on :meth:`close`. Each hand-off wakes that thread, and a
    woken thread competes with the training step for the GIL; on a small model one wake
    per write made the step ~10 % slower (``tools/benchmark.py --task train``). TensorBoard
    itself flushes its file only every ``flush_secs`` (120 s by default), so the batching
    adds little delay to what the dashboard shows. Images and histograms are rare and are
    handed over at once.

    ``torch.utils.tensorboard`` is imported when the writer is created, so importing this
    module does not load TensorBoard.
    """

    def __init__(
        self, log_dir: str, window_size: int = 20, handoff_secs: float = 10.0, **kwargs: Any
    ) -> None:
        """Create the event-file writer.

        Args:
            log_dir: directory of the event files.
            window_size: window of the median of smoothed scalars.
            handoff_secs: longest time scalars wait here before they are handed to
                TensorBoard's writer thread; 0 hands them over on every write.
            kwargs: passed to ``torch.utils.tensorboard.SummaryWriter``.
        """
        # Heavy imports; only when a writer is created.
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard import SummaryWriter

        self._summary_cls = Summary
        self._summary_value = Summary.Value
        self._window_size = window_size
        self._handoff_secs = handoff_secs
        self._writer = SummaryWriter(log_dir, **kwargs)
        self._last_write = -1
        # (summary, iteration, wall time of the write) not handed over yet.
        self._pending: list[tuple[Any, int, float]] = []
        self._last_handoff_s = time.monotonic()

    @override
    def write(self) -> None:
        storage = get_event_storage()
        new_values: defaultdict[int, list[Any]] = defaultdict(list)
        for name, (value, cur_iter) in storage.latest_with_smoothing_hint(
            self._window_size
        ).items():
            if cur_iter > self._last_write:
                new_values[cur_iter].append(self._summary_value(tag=name, simple_value=value))
        if new_values:
            # One summary holding every scalar of an iteration; TensorBoard reads it exactly
            # like separate add_scalar calls, at a fraction of the cost.
            # The wall time of the write, not of the hand-off, keeps TensorBoard's
            # time axis right.
            wall_time = time.time()
            for cur_iter, values in sorted(new_values.items()):
                self._pending.append((self._summary_cls(value=values), cur_iter, wall_time))
            self._last_write = max(new_values)
        if time.monotonic() - self._last_handoff_s >= self._handoff_secs:
            self._hand_off()

        # Images and histograms are queued, not kept, so each is written once and dropped.
        if storage._vis_data:
            for img_name, img, step_num in storage._vis_data:
                self._writer.add_image(img_name, img, step_num)
            storage.clear_images()
        if storage._histograms:
            for params in storage._histograms:
                self._writer.add_histogram_raw(**params)
            storage.clear_histograms()

    def _hand_off(self) -> None:
        self._last_handoff_s = time.monotonic()
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        # SummaryWriter has no public call that takes a ready summary; its file writer does.
        file_writer = self._writer._get_file_writer()
        for summary, cur_iter, wall_time in pending:
            file_writer.add_summary(summary, cur_iter, wall_time)

    @override
    def close(self) -> None:
        # A failed constructor leaves no _writer; close() may still be called from cleanup.
        if hasattr(self, "_writer"):
            try:
                self._hand_off()
            finally:
                self._writer.close()


class CommonMetricPrinter(EventWriter):
    """Log one line of training progress: ETA, iteration, losses, time, data time, lr, memory.

    Losses are the scalars whose name contains ``"loss"``, shown as medians over
    ``window_size``. The line is for people; tools should read ``metrics.json`` instead.
    It reports nothing once ``storage.iter`` has reached ``max_iter`` (training is over).
    """

    def __init__(self, max_iter: int | None = None, window_size: int = 20) -> None:
        """Set up the printer.

        Args:
            max_iter: the iteration count of the run, used for the ETA; ``None`` hides it.
            window_size: window of the loss medians.
        """
        self._max_iter = max_iter
        self._window_size = window_size
        # (iteration, perf_counter) of the previous write, for an ETA without "time" metrics.
        self._last_write: tuple[int, float] | None = None
        # The windowed mean step time of recent writes: the ETA uses their median, which
        # resists slow first steps and occasional stalls (checkpoints, evaluation) as a
        # median over the last ~1000 steps would, without sorting 1000 values every write.
        self._recent_step_times: deque[float] = deque(maxlen=51)

    def _get_eta(self, storage: EventStorage, iter_time: float | None) -> str | None:
        if self._max_iter is None:
            return None
        cur_iter = storage.iter
        remaining = self._max_iter - cur_iter - 1
        if iter_time is not None:
            self._recent_step_times.append(iter_time)
            eta_s = statistics.median(self._recent_step_times) * remaining
            storage.put_scalar("eta_seconds", eta_s, smoothing_hint=False)
        else:
            # No IterationTimer: estimate from the wall time between two writes.
            now = time.perf_counter()
            previous, self._last_write = self._last_write, (cur_iter, now)
            if previous is None or cur_iter <= previous[0]:
                return None
            eta_s = (now - previous[1]) / (cur_iter - previous[0]) * remaining
        return str(datetime.timedelta(seconds=int(eta_s)))

    @override
    def write(self) -> None:
        storage = get_event_storage()
        cur_iter = storage.iter
        if self._max_iter is not None and cur_iter >= self._max_iter:
            return
        data_time = _window_avg(storage, "data_time", self._window_size)
        iter_time = _window_avg(storage, "time", self._window_size)
        try:
            lr = f"{storage.history('lr').latest():.5g}"
        except KeyError:
            lr = "N/A"
        eta = self._get_eta(storage, iter_time)
        losses = "  ".join(
            f"{name}: {history.median(self._window_size):.4g}"
            for name, history in storage.histories().items()
            if "loss" in name
        )
        parts = [f"eta: {eta}" if eta is not None else "", f"iter: {cur_iter}", losses]
        if iter_time is not None:
            parts.append(f"time: {iter_time:.4f}")
        if data_time is not None:
            parts.append(f"data_time: {data_time:.4f}")
        parts.append(f"lr: {lr}")
        if torch.cuda.is_available():
            max_mem_mb = torch.cuda.max_memory_allocated() / 1024.0 / 1024.0
            parts.append(f"max_mem: {max_mem_mb:.0f}M")
        logger.info("%s", "  ".join(p for p in parts if p))


def _window_avg(storage: EventStorage, name: str, window_size: int) -> float | None:
    try:
        return storage.history(name).avg(window_size)
    except KeyError:
        return None
