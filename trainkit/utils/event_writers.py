"""Writers that publish an ``EventStorage`` to files: ``JSONWriter`` and ``TensorboardXWriter``.

Writers run periodically (``PeriodicWriter``) and publish what is new since their previous
write. Import these names from :mod:`trainkit.utils.events`; the console printer lives there.
"""

from __future__ import annotations

import functools
import json
import time
from collections import defaultdict
from typing import IO, Any

from typing_extensions import override

from trainkit.utils.event_storage import EventStorage, get_event_storage
from trainkit.utils.file_io import PathManager

__all__ = ["EventWriter", "JSONWriter", "TensorboardXWriter"]


class EventWriter:
    """Base class of writers that publish what an :class:`EventStorage` recorded."""

    def write(self) -> None:
        """Publish the metrics of the current storage that are new since the last write."""
        raise NotImplementedError

    def close(self) -> None:
        """Release files or handles; the default does nothing."""

    def write_stop_reason(self, iteration: int, reason: str) -> None:
        """Publish why training ended before ``MAX_ITER``; the default does nothing.

        Called once, after the last :meth:`write`, when a hook stopped the run with
        ``TrainerBase.request_stop`` (early stopping, for example).

        Args:
            iteration: the last iteration trained.
            reason: the text given to ``request_stop``.
        """


def _new_scalars(
    storage: EventStorage, window_size: int, last_write: int
) -> dict[int, dict[str, float]]:
    """``{iteration: {name: value}}`` of the scalars filed after iteration ``last_write``.

    Smoothed scalars give their median over the last ``window_size`` iterations. Only the
    latest value of each scalar is kept between writes, so a scalar recorded at several
    iterations since the previous write appears at its latest one only.
    """
    by_iter: defaultdict[int, dict[str, float]] = defaultdict(dict)
    for name, (value, cur_iter) in storage.latest_with_smoothing_hint(window_size).items():
        # Metrics put at an iteration that was already written are old news.
        if cur_iter > last_write:
            by_iter[cur_iter][name] = value
    return dict(sorted(by_iter.items()))


class JSONWriter(EventWriter):
    """Append one JSON object per iteration to a file (usually ``OUTPUT_DIR/metrics.json``).

    Each line holds ``"iteration"`` and every scalar whose latest value was recorded at that
    iteration since the previous write; smoothed scalars are medians over the last
    ``window_size`` iterations. Read it back with::

        [json.loads(line) for line in open("metrics.json")]

    The file is flushed, not fsynced, after every write: a few lines may be lost in a power
    failure, but training is not stalled by disk latency.
    """

    def __init__(self, json_file: str, window_size: int = 20) -> None:
        """Open ``json_file`` for appending (existing lines are kept, e.g. across a resume).

        Args:
            json_file: path of the file; opened through ``PathManager``.
            window_size: number of iterations the median of smoothed scalars covers.
        """
        self._file_handle: IO[str] = PathManager.open(json_file, "a")
        self._window_size = window_size
        self._last_write = -1

    @override
    def write(self) -> None:
        to_save = _new_scalars(get_event_storage(), self._window_size, self._last_write)
        if not to_save:
            return
        self._last_write = max(to_save)
        for cur_iter, scalars in to_save.items():
            scalars["iteration"] = cur_iter
            self._file_handle.write(json.dumps(scalars, sort_keys=True) + "\n")
        self._file_handle.flush()

    @override
    def write_stop_reason(self, iteration: int, reason: str) -> None:
        """Append ``{"iteration": iteration, "stop_reason": reason}`` as the file's last line."""
        record = {"iteration": iteration, "stop_reason": reason}
        self._file_handle.write(json.dumps(record, sort_keys=True) + "\n")
        self._file_handle.flush()

    @override
    def close(self) -> None:
        self._file_handle.close()


# The keyword arguments torch.utils.tensorboard.SummaryWriter takes besides log_dir.
_SUMMARY_WRITER_KWARGS = frozenset(
    {"comment", "purge_step", "max_queue", "flush_secs", "filename_suffix"}
)


class TensorboardXWriter(EventWriter):
    """Write scalars, images and histograms to TensorBoard event files in ``log_dir``.

    The event file (and ``log_dir``) is created by the first :meth:`write` that has
    something to write, so a run that never writes leaves no empty event file behind.

    Scalars are batched: each :meth:`write` builds one event per new iteration holding
    every scalar of that iteration, and the events are handed to TensorBoard's background
    writer thread at most every ``handoff_secs`` seconds and on :meth:`close`. Each
    hand-off wakes that thread, and a woken thread competes with the training step for the
    GIL; on a small model one wake per write made the step ~10 % slower
    (``tools/benchmark.py --task train``). TensorBoard itself flushes its file only every
    ``flush_secs`` (120 s by default), so the batching adds little delay to what the
    dashboard shows. Images and histograms are rare and are handed over at once.

    The file is written with tensorboard's ``EventFileWriter``, the writer
    ``torch.utils.tensorboard.SummaryWriter`` uses, and summaries are built with
    ``torch.utils.tensorboard.summary``; both are imported at the first write, so importing
    this module does not load TensorBoard.
    """

    def __init__(
        self, log_dir: str, window_size: int = 20, handoff_secs: float = 10.0, **kwargs: Any
    ) -> None:
        """Set up the writer; nothing is created on disk yet.

        Args:
            log_dir: directory of the event files.
            window_size: number of iterations the median of smoothed scalars covers.
            handoff_secs: longest time scalars wait here before they are handed to
                TensorBoard's writer thread; 0 hands them over on every write.
            kwargs: the arguments of ``torch.utils.tensorboard.SummaryWriter`` besides
                ``log_dir``: ``max_queue``, ``flush_secs``, ``filename_suffix`` and
                ``purge_step`` act as there; ``comment`` is ignored, as SummaryWriter
                ignores it when ``log_dir`` is given.

        Raises:
            TypeError: If ``kwargs`` holds an argument SummaryWriter does not take.
        """
        unknown = sorted(set(kwargs) - _SUMMARY_WRITER_KWARGS)
        if unknown:
            raise TypeError(
                f"TensorboardXWriter got unexpected arguments {unknown}; it takes log_dir, "
                f"window_size, handoff_secs and SummaryWriter's {sorted(_SUMMARY_WRITER_KWARGS)}."
            )
        self._log_dir = str(log_dir)
        self._writer_kwargs = kwargs
        self._window_size = window_size
        self._handoff_secs = handoff_secs
        self._file_writer: Any = None  # tensorboard EventFileWriter, made by the first write
        # tensorboard's Event and Summary protobuf classes, imported with the file writer.
        self._event_cls: Any = None
        self._summary_cls: Any = None
        self._last_write = -1
        # (summary, iteration, wall time of the write) of scalars not handed over yet.
        self._pending: list[tuple[Any, int, float]] = []
        self._last_handoff_s = time.monotonic()

    @functools.cached_property
    def _writer(self) -> Any:
        """A ``torch.utils.tensorboard.SummaryWriter`` on ``log_dir``, made on first use.

        For code written for detectron2's writer, whose ``_writer`` is one (subclasses call
        ``self._writer.add_scalar(...)``). This writer does not use it: it writes its own
        event file, and this one, when used, is a second file in ``log_dir``, which
        TensorBoard reads as part of the same run.
        """
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(self._log_dir, **self._writer_kwargs)

    def _event_file(self) -> Any:
        """Return the event-file writer, creating it (and the file) on first use."""
        if self._file_writer is None:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            # Kept for write(): importing there would cost a look-up at every write.
            self._event_cls, self._summary_cls = Event, Summary

            kwargs = self._writer_kwargs
            self._file_writer = EventFileWriter(
                self._log_dir,
                max_queue_size=kwargs.get("max_queue", 10),
                flush_secs=kwargs.get("flush_secs", 120),
                filename_suffix=kwargs.get("filename_suffix", ""),
            )
            purge_step = kwargs.get("purge_step")
            if purge_step is not None:
                # What SummaryWriter writes for purge_step: TensorBoard then hides events
                # of earlier files at steps >= purge_step (those of a crashed run).
                self._file_writer.add_event(Event(step=purge_step, file_version="brain.Event:2"))
                start = SessionLog(status=SessionLog.START)
                self._file_writer.add_event(Event(step=purge_step, session_log=start))
        return self._file_writer

    @override
    def write(self) -> None:
        storage = get_event_storage()
        new_scalars = _new_scalars(storage, self._window_size, self._last_write)
        if new_scalars:
            self._event_file()
            summary_cls = self._summary_cls
            value_cls = summary_cls.Value
            # The wall time of the write, not of the hand-off, keeps TensorBoard's time
            # axis right. One summary holds every scalar of an iteration; TensorBoard reads
            # it exactly like separate add_scalar calls, at a fraction of the cost.
            wall_time = time.time()
            for cur_iter, scalars in new_scalars.items():
                values = [value_cls(tag=name, simple_value=v) for name, v in scalars.items()]
                self._pending.append((summary_cls(value=values), cur_iter, wall_time))
            self._last_write = max(new_scalars)
        if time.monotonic() - self._last_handoff_s >= self._handoff_secs:
            self._hand_off()
        self._write_images_and_histograms(storage)

    def _write_images_and_histograms(self, storage: EventStorage) -> None:
        # Images and histograms are queued in the storage, not kept, so each is written
        # once and dropped; only one writer per storage should publish them.
        if not storage._vis_data and not storage._histograms:
            return
        from torch.utils.tensorboard.summary import histogram_raw, image

        writer = self._event_file()
        event_cls = self._event_cls
        wall_time = time.time()
        for img_name, img, step_num in storage._vis_data:
            summary = image(img_name, img, dataformats="CHW")
            writer.add_event(event_cls(wall_time=wall_time, step=step_num, summary=summary))
        storage.clear_images()
        for params in storage._histograms:
            params = dict(params)
            step_num = params.pop("global_step")
            summary = histogram_raw(params.pop("tag"), **params)
            writer.add_event(event_cls(wall_time=wall_time, step=step_num, summary=summary))
        storage.clear_histograms()

    def _hand_off(self) -> None:
        self._last_handoff_s = time.monotonic()
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        writer, event_cls = self._event_file(), self._event_cls
        for summary, cur_iter, wall_time in pending:
            writer.add_event(event_cls(wall_time=wall_time, step=cur_iter, summary=summary))

    @override
    def close(self) -> None:
        # A failed constructor leaves no _file_writer; close() may still be called from
        # cleanup. A writer that never wrote has no file to close.
        try:
            if getattr(self, "_file_writer", None) is not None:
                try:
                    self._hand_off()
                finally:
                    self._file_writer.close()
                    self._file_writer = None
        finally:
            if "_writer" in self.__dict__:  # made only if someone used it
                self.__dict__.pop("_writer").close()
