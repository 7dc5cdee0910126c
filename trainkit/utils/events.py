"""Training metrics: the ``EventStorage`` context stack and the writers that drain it.

Code anywhere in a training step records numbers with ``get_event_storage().put_scalar(...)``;
writers run periodically and publish what is new since their previous write. Import every
name from here, as in detectron2. The storage lives in :mod:`~trainkit.utils.event_storage`
(its buffer in :mod:`~trainkit.utils.history_buffer`), the file writers in
:mod:`~trainkit.utils.event_writers`, the trackers in :mod:`~trainkit.utils.wandb_writer` and
:mod:`~trainkit.utils.mlflow_writer`. The console printer is defined here so that its log
records come from the logger ``trainkit.utils.events``.
"""

from __future__ import annotations

import datetime
import logging
import statistics
import time
from collections import deque

import torch
from typing_extensions import override

# Private names re-exported (``as``) for code written against this module's former
# single-file layout, or against detectron2's ``_CURRENT_STORAGE_STACK``.
from trainkit.utils.event_storage import _CURRENT_STORAGE_STACK as _CURRENT_STORAGE_STACK
from trainkit.utils.event_storage import EventStorage, get_event_storage, has_event_storage
from trainkit.utils.event_storage import _reset_storage_stack as _reset_storage_stack
from trainkit.utils.event_writers import EventWriter, JSONWriter, TensorboardXWriter
from trainkit.utils.history_buffer import HistoryBuffer
from trainkit.utils.mlflow_writer import MLflowWriter
from trainkit.utils.wandb_writer import WandbWriter

__all__ = [
    "CommonMetricPrinter",
    "EventStorage",
    "EventWriter",
    "HistoryBuffer",
    "JSONWriter",
    "MLflowWriter",
    "TensorboardXWriter",
    "WandbWriter",
    "get_event_storage",
    "has_event_storage",
]

logger = logging.getLogger(__name__)


class CommonMetricPrinter(EventWriter):
    """Log one line of training progress, as detectron2's printer does.

    The line holds the ETA, the iteration, every scalar whose name contains ``"loss"`` and
    every one whose name contains ``"[metric]"`` (medians over the last ``window_size``
    iterations), ``time`` (the mean step time of the run) and ``last_time``, ``data_time``
    (mean over the last ``window_size`` iterations) and ``last_data_time``, the lr and, on
    CUDA, the peak memory. The line is for people; tools should read ``metrics.json``
    instead. It reports nothing once ``storage.iter`` has reached ``max_iter`` (training is
    over). Records go to :attr:`logger` (``trainkit.utils.events``) at INFO.
    """

    def __init__(self, max_iter: int | None = None, window_size: int = 20) -> None:
        """Set up the printer.

        Args:
            max_iter: the iteration count of the run, used for the ETA; ``None`` hides it.
            window_size: number of iterations the loss and metric medians cover.
        """
        self.logger = logger
        self._max_iter = max_iter
        self._window_size = window_size
        # (iteration, perf_counter) of the previous write, for an ETA without "time" metrics.
        self._last_write: tuple[int, float] | None = None
        # The windowed mean step time of recent writes: the ETA uses their median, which
        # resists slow first steps and occasional stalls (checkpoints, evaluation) as a
        # median over the last ~1000 steps would, without sorting 1000 values every write.
        self._recent_step_times: deque[float] = deque(maxlen=51)

    def _get_eta(self, storage: EventStorage) -> str | None:
        if self._max_iter is None:
            return None
        cur_iter = storage.iter
        remaining = self._max_iter - cur_iter - 1
        recent_step_time = _window_avg(storage.histories().get("time"), self._window_size)
        if recent_step_time is not None:
            self._recent_step_times.append(recent_step_time)
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
        eta = self._get_eta(storage)
        parts = [f"eta: {eta}" if eta is not None else "", f"iter: {cur_iter}"]
        histories = storage.histories()
        window_size = self._window_size
        metrics = []  # "[metric]" scalars come after the losses; a name with both is a loss
        for name, history in histories.items():
            if "loss" in name:
                parts.append(f"{name}: {history.median(history.count_recent(window_size)):.4g}")
            elif "[metric]" in name:
                metrics.append(f"{name}: {history.median(history.count_recent(window_size)):.4g}")
        parts += metrics
        time_history = histories.get("time")
        if time_history is not None:
            parts.append(f"time: {time_history.global_avg():.4f}")
            parts.append(f"last_time: {time_history.latest():.4f}")
        data_time = _window_avg(histories.get("data_time"), self._window_size)
        if data_time is not None:
            parts.append(f"data_time: {data_time:.4f}")
            parts.append(f"last_data_time: {histories['data_time'].latest():.4f}")
        lr_history = histories.get("lr")
        parts.append(f"lr: {lr_history.latest():.5g}" if lr_history is not None else "lr: N/A")
        if torch.cuda.is_available():
            max_mem_mb = torch.cuda.max_memory_allocated() / 1024.0 / 1024.0
            parts.append(f"max_mem: {max_mem_mb:.0f}M")
        self.logger.info("%s", "  ".join(p for p in parts if p))


def _window_avg(history: HistoryBuffer | None, window_size: int) -> float | None:
    """Mean of ``history`` over its last ``window_size`` iterations; None without a history."""
    return None if history is None else history.avg(history.count_recent(window_size))
