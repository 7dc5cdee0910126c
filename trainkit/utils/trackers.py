"""What the experiment-tracker writers (W&B, MLflow) share.

A tracker writer publishes scalars to an external service, and differs from the file
writers in two ways:

* **It is checked before training.** A tracker that is not installed or whose server cannot
  be reached raises :class:`TrackerUnavailableError` (a :class:`~trainkit.utils.UsageError`:
  one line, exit status 2) when the writer is built, which ``DefaultTrainer`` does in its
  constructor.
* **It never stops training once it runs.** The tracker's first exception is logged once,
  with its traceback; the writer then does nothing for the rest of the run, and the other
  writers go on.

A run keeps its tracker run id in ``OUTPUT_DIR`` (``wandb_run_id``, ``mlflow_run_id``), so a
resumed or restarted job continues the same tracker run. Nothing here imports a tracker:
each writer imports its own when it is built, so importing a writer's module costs nothing.
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import socket
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from typing_extensions import override

from trainkit.utils.errors import UsageError
from trainkit.utils.event_storage import get_event_storage
from trainkit.utils.event_writers import EventWriter
from trainkit.utils.file_io import atomic_write

__all__ = [
    "BackgroundCalls",
    "TrackerUnavailableError",
    "TrackerWriter",
    "check_reachable",
    "default_run_name",
    "first_line",
    "flatten_config",
    "import_tracker",
    "read_run_id",
    "save_run_id",
]

logger = logging.getLogger(__name__)


class TrackerUnavailableError(UsageError, RuntimeError):
    """A tracker named in ``WRITERS`` is not installed, or its server cannot be reached."""


def import_tracker(module: str, writer: str, extra: str) -> ModuleType:
    """Import a tracker's package, or explain how to install it.

    Args:
        module: the package to import (``"wandb"``, ``"mlflow"``).
        writer: the writer's name in ``WRITERS``.
        extra: the trainkit extra that installs it.

    Raises:
        TrackerUnavailableError: If the import fails.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackerUnavailableError(
            f"WRITERS includes {writer!r} but {module} cannot be imported ({e}); install it "
            f"with pip install 'trainkit[{extra}]' or remove {writer!r} from WRITERS."
        ) from None


def check_reachable(
    url: str, setting: str, writer: str, timeout_s: float = 5.0, hint: str = ""
) -> None:
    """Check within ``timeout_s`` that the server of an ``http(s)`` URL accepts connections.

    Other schemes (local files, databases) are not checked. A TCP connection, not a request,
    tells a stopped server or a wrong host or port at once, where a tracker's own client
    would retry for minutes.

    Args:
        url: the server's URL.
        setting: where the URL comes from, named in the error (``"MLFLOW.TRACKING_URI"``).
        writer: the writer's name in ``WRITERS``.
        timeout_s: how long to wait for the connection.
        hint: another fix to suggest, such as ``"set WANDB.MODE offline"``.

    Raises:
        TrackerUnavailableError: If no connection is made within ``timeout_s``.
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        fixes = f"start the server or correct {setting}, " + (f"{hint}, " if hint else "")
        raise TrackerUnavailableError(
            f"{setting}={url} is not reachable ({reason}; waited at most {timeout_s:g} s): "
            f"{fixes}or remove {writer!r} from WRITERS."
        ) from None


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Return ``{"A.B.C": value}`` for every leaf of a nested mapping such as a ``CfgNode``.

    Args:
        config: the nested mapping.
        prefix: prepended to every key (used by the recursion).
    """
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def default_run_name(output_dir: str) -> str:
    """Name a new tracker run after the output directory (``./output/exp1`` -> ``exp1``)."""
    return os.path.basename(os.path.normpath(os.path.abspath(output_dir)))


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name if it has none)."""
    return (str(error).strip() or type(error).__name__).splitlines()[0]


def read_run_id(path: str) -> str | None:
    """Return the run id stored in ``path``, or ``None`` if there is none."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def save_run_id(path: str, run_id: str) -> None:
    """Store ``run_id`` in ``path`` atomically (a reader sees the old id or the new one)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_write(path, "w") as f:
        f.write(run_id + "\n")


class TrackerWriter(EventWriter):
    """Base class of writers that publish scalars to a tracker; failures disable the writer.

    Subclasses implement :meth:`_log` (one iteration's scalars) and :meth:`_finish`; both
    may raise (see the module docstring for what then happens).
    """

    name = "tracker"
    """Shown in log messages (``"W&B"``, ``"MLflow"``)."""

    def __init__(self, window_size: int = 20) -> None:
        """Set up the bookkeeping.

        Args:
            window_size: number of iterations the median of smoothed scalars covers.
        """
        self._window_size = window_size
        self._failed = False
        self._closed = False

    @property
    def failed(self) -> bool:
        """Whether the tracker failed and this writer is off for the rest of the run."""
        return self._failed

    @override
    def write(self) -> None:
        if self._failed or self._closed:
            return
        new_scalars = self._new_scalars(get_event_storage())
        try:
            for cur_iter, scalars in new_scalars.items():
                self._log(cur_iter, scalars)
        except Exception as e:  # a tracker never stops training
            self._disable(e)

    @override
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._finish(success=not self._failed)
        except Exception as e:
            self._disable(e)

    @override
    def write_stop_reason(self, iteration: int, reason: str) -> None:
        if self._failed or self._closed:
            return
        try:
            self._log_stop_reason(iteration, reason)
        except Exception as e:  # a tracker never stops training
            self._disable(e)

    def _log(self, iteration: int, scalars: dict[str, float]) -> None:
        """Publish the scalars of one iteration."""
        raise NotImplementedError

    def _log_stop_reason(self, iteration: int, reason: str) -> None:
        """Record why the run stopped early (a tag or summary field); default: nothing."""

    def _finish(self, success: bool) -> None:
        """End the tracker run (flush, mark it finished or failed)."""
        raise NotImplementedError

    def _disable(self, error: BaseException) -> None:
        """Log ``error`` (only the first one) and turn the writer off."""
        if self._failed:
            return
        self._failed = True
        logger.error(
            "The %s writer failed and is off for the rest of this run; training and the "
            "other writers go on.",
            self.name,
            exc_info=(type(error), error, error.__traceback__),
        )


class BackgroundCalls:
    """Run calls in order on one daemon thread, so a slow tracker does not stall training.

    After a call raises, the rest are dropped and ``on_error`` gets the exception (once).
    """

    _STOP = object()

    def __init__(self, name: str, on_error: Callable[[BaseException], None]) -> None:
        """Start the thread.

        Args:
            name: the thread's name.
            on_error: called on the thread with the first exception.
        """
        self._on_error = on_error
        # Unbounded: an item is one write's scalars, and a stalled tracker is abandoned at
        # close() after a bounded wait.
        self._queue: queue.Queue[Any] = queue.Queue()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)``; dropped if an earlier call failed."""
        if not self._failed:
            self._queue.put((fn, args, kwargs))

    def close(self, timeout_s: float) -> bool:
        """Run what is queued, waiting at most ``timeout_s``; return whether it all ran."""
        self._queue.put(self._STOP)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (item := self._queue.get()) is not self._STOP:
            if self._failed:
                continue
            fn, args, kwargs = item
            try:
                fn(*args, **kwargs)
            except Exception as e:
                self._failed = True
                self._on_error(e)
