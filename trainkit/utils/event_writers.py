"""The file writers ``JSONWriter`` and ``TensorboardXWriter`` (import them from ``events``)."""

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
    """Base class of writers that publish what an :class:`EventStorage` recorded.

    Writers run periodically (``PeriodicWriter``) and publish what is new since their
    previous write (:meth:`_new_scalars`).
    """

    _window_size = 20  # iterations the median of a smoothed scalar covers
    _last_written_iter = -1

    def write(self) -> None:
        """Publish the metrics of the current storage that are new since the last write."""
        raise NotImplementedError

    def close(self) -> None:
        """Release files or handles; the default does nothing."""

    def _new_scalars(self, storage: EventStorage) -> dict[int, dict[str, float]]:
        """``{iteration: {name: value}}`` of the scalars filed since the previous call.

        Smoothed scalars give their median over the last ``self._window_size`` iterations. A
        scalar recorded at several iterations since the previous call appears at its latest
        one only.
        """
        latest = storage.latest_with_smoothing_hint(self._window_size)
        by_iter: defaultdict[int, dict[str, float]] = defaultdict(dict)
        for name, (value, cur_iter) in latest.items():
            if cur_iter > self._last_written_iter:  # older iterations were written already
                by_iter[cur_iter][name] = value
        if by_iter:
            self._last_written_iter = max(by_iter)
        return dict(sorted(by_iter.items()))

    def write_stop_reason(self, iteration: int, reason: str) -> None:
        """Publish why training ended before ``MAX_ITER``; the default does nothing.

        Called once, after the last :meth:`write`, when a hook stopped the run with
        ``TrainerBase.request_stop`` (e.g. early stopping).

        Args:
            iteration: the last iteration trained.
            reason: the text given to ``request_stop``.
        """


class JSONWriter(EventWriter):
    """Append one JSON object per iteration to a file (usually ``OUTPUT_DIR/metrics.json``).

    Each line holds ``"iteration"`` and the scalars :meth:`_new_scalars` finds for it; read
    it back with ``[json.loads(line) for line in open("metrics.json")]``. The file is
    flushed, not fsynced, after every write: a power failure may lose a few lines, but disk
    latency does not stall training.
    """

    def __init__(self, json_file: str, window_size: int = 20) -> None:
        """Open ``json_file`` (through ``PathManager``) for appending: a resume keeps its lines.

        Args:
            json_file: path of the file.
            window_size: number of iterations the median of smoothed scalars covers.
        """
        self._file_handle: IO[str] = PathManager.open(json_file, "a")
        self._window_size = window_size

    @override
    def write(self) -> None:
        for cur_iter, scalars in self._new_scalars(get_event_storage()).items():
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

    The first :meth:`write` that has something to write creates the event file (and
    ``log_dir``): a run that never writes leaves no empty file behind.

    Each :meth:`write` builds one event per new iteration holding all its scalars; the
    events go to TensorBoard's writer thread at most every ``handoff_secs`` and on
    :meth:`close`. Each hand-off wakes that thread, which then competes with the training
    step for the GIL: on a small model one wake per write made the step ~10 % slower
    (``tools/benchmark.py --task train``). TensorBoard flushes its file only every
    ``flush_secs`` (120 s by default) anyway. Images and histograms are rare and go at once.

    Files are written with tensorboard's ``EventFileWriter`` (what
    ``torch.utils.tensorboard.SummaryWriter`` uses) and ``torch.utils.tensorboard.summary``,
    both imported at the first write: importing this module does not load TensorBoard.
    """

    def __init__(
        self, log_dir: str, window_size: int = 20, handoff_secs: float = 10.0, **kwargs: Any
    ) -> None:
        """Set up the writer; nothing is created on disk yet.

        Args:
            log_dir: directory of the event files.
            window_size: number of iterations the median of smoothed scalars covers.
            handoff_secs: longest time scalars wait before going to TensorBoard's writer
                thread; 0 hands them over on every write.
            kwargs: ``SummaryWriter``'s other arguments: ``max_queue``, ``flush_secs``,
                ``filename_suffix`` and ``purge_step`` act as there; ``comment`` is
                ignored, as SummaryWriter ignores it when ``log_dir`` is given.

        Raises:
            TypeError: If ``kwargs`` holds an argument SummaryWriter does not take.
        """
        if unknown := sorted(set(kwargs) - _SUMMARY_WRITER_KWARGS):
            raise TypeError(
                f"TensorboardXWriter got unexpected arguments {unknown}; it takes log_dir, "
                f"window_size, handoff_secs and SummaryWriter's {sorted(_SUMMARY_WRITER_KWARGS)}."
            )
        self._log_dir = str(log_dir)
        self._writer_kwargs = kwargs
        self._window_size = window_size
        self._handoff_secs = handoff_secs
        self._file_writer: Any = None  # tensorboard EventFileWriter, made by the first write
        self._event_cls = self._summary_cls = None  # tensorboard's Event and Summary protos
        self._pending: list[Any] = []  # events of scalars not handed over yet
        self._last_handoff_s = time.monotonic()

    @functools.cached_property
    def _writer(self) -> Any:
        """A ``SummaryWriter`` on ``log_dir``, made on first use, for detectron2 subclasses.

        They call ``self._writer.add_scalar(...)``. This writer does not use it: it writes
        a second event file in ``log_dir``, which TensorBoard reads as part of the same run.
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
        if new_scalars := self._new_scalars(storage):
            self._event_file()
            event_cls, summary_cls = self._event_cls, self._summary_cls
            # The wall time of the write, not of the hand-off, keeps TensorBoard's time
            # axis right. One summary holds every scalar of an iteration; TensorBoard reads
            # it exactly like separate add_scalar calls, at a fraction of the cost.
            wall_time = time.time()
            for cur_iter, scalars in new_scalars.items():
                values = [summary_cls.Value(tag=k, simple_value=v) for k, v in scalars.items()]
                summary = summary_cls(value=values)
                self._pending.append(event_cls(wall_time=wall_time, step=cur_iter, summary=summary))
        if time.monotonic() - self._last_handoff_s >= self._handoff_secs:
            self._hand_off()
        self._write_images_and_histograms(storage)

    def _write_images_and_histograms(self, storage: EventStorage) -> None:
        # Images and histograms are queued in the storage, not kept, so each is written
        # once and dropped; only one writer per storage should publish them.
        if not storage._vis_data and not storage._histograms:
            return
        from torch.utils.tensorboard.summary import histogram_raw, image

        summaries = [
            (step, image(tag, img, dataformats="CHW")) for tag, img, step in storage._vis_data
        ]
        for params in map(dict, storage._histograms):
            summaries.append(
                (params.pop("global_step"), histogram_raw(params.pop("tag"), **params))
            )
        writer, wall_time = self._event_file(), time.time()
        for step, summary in summaries:
            writer.add_event(self._event_cls(wall_time=wall_time, step=step, summary=summary))
        storage.clear_images()
        storage.clear_histograms()

    def _hand_off(self) -> None:
        self._last_handoff_s = time.monotonic()
        pending, self._pending = self._pending, []
        for event in pending:  # only pending if write() made the file writer
            self._file_writer.add_event(event)

    @override
    def close(self) -> None:
        # getattr: cleanup may close a writer whose constructor failed.
        try:
            if getattr(self, "_file_writer", None) is not None:  # None: it never wrote
                try:
                    self._hand_off()
                finally:
                    self._file_writer.close()
                    self._file_writer = None
        finally:
            if "_writer" in self.__dict__:  # made only if someone used it
                self.__dict__.pop("_writer").close()
