"""Rank-aware logging set-up: rank 0 to the console and ``log.txt``, rank N to ``log.txt.rankN``."""

from __future__ import annotations

import logging
import numbers
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any, Callable

__all__ = [
    "LogThrottle",
    "create_small_table",
    "log_every_n",
    "log_every_n_seconds",
    "log_first_n",
    "setup_logger",
]


def setup_logger(
    output: str | None = None,
    distributed_rank: int = 0,
    *,
    name: str = "trainkit",
    level: int = logging.INFO,
    abbrev_name: str | None = None,
) -> logging.Logger:
    """Configure and return the ``name`` logger for this rank; a second call replaces its handlers.

    Args:
        output: a directory (the file is ``log.txt`` in it) or a file path ending in
            ``.txt``/``.log``; ``None`` logs to the console only.
        distributed_rank: rank 0 logs to the console and ``output``; rank N to
            ``output + ".rankN"`` only.
        name: the logger to configure (its children propagate to it).
        level: the logging level.
        abbrev_name: unused; kept for detectron2 compatibility.
    """
    del abbrev_name
    logger = logging.getLogger(name)
    logger.setLevel(level)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handlers: list[logging.Handler] = []
    if distributed_rank == 0:
        handlers.append(logging.StreamHandler(stream=sys.stdout))
    if output is not None:
        path = output if output.endswith((".txt", ".log")) else os.path.join(output, "log.txt")
        if distributed_rank > 0:
            path = f"{path}.rank{distributed_rank}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="a"))
    formatter = logging.Formatter(
        "[%(asctime)s %(name)s %(levelname)s] %(message)s", datefmt="%m/%d %H:%M:%S"
    )
    for handler in handlers:
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    return logger


class LogThrottle:
    """The per-call-site counters and timers behind :func:`log_first_n`, :func:`log_every_n`
    and :func:`log_every_n_seconds`.

    A call site is the file and line that called one of them, so a message whose text
    changes on every call (a progress line with a counter) is still throttled as one. The
    module keeps one instance (``_THROTTLE``); tests replace it, with a fake clock, to reset
    it and to control time.

    Args:
        clock: returns the current time in seconds; only differences are used.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._counts: Counter = Counter()
        self._last_logged: dict[tuple, float] = {}

    def count(self, key: tuple) -> int:
        """Count one more call for ``key`` and return how many there have been."""
        self._counts[key] += 1
        return self._counts[key]

    def due(self, key: tuple, period_s: float) -> bool:
        """Return True (and restart the period) if ``key`` last logged ``period_s`` ago or never."""
        now = self._clock()
        last = self._last_logged.get(key)
        if last is not None and now - last < period_s:
            return False
        self._last_logged[key] = now
        return True


_THROTTLE = LogThrottle()


def _call_site() -> tuple[str, tuple[str, int]]:
    """Return the calling code's module name and ``(file, line)``, skipping this module."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == _THIS_FILE:
        frame = frame.f_back
    if frame is None:  # called with no Python caller (e.g. an atexit callback)
        return "trainkit", ("<unknown>", 0)
    module = frame.f_globals.get("__name__", "trainkit")
    # A script's messages go to trainkit's logger, which setup_logger configured.
    site = (frame.f_code.co_filename, frame.f_lineno)
    return ("trainkit" if module == "__main__" else module), site


def log_first_n(
    level: int,
    msg: str,
    n: int = 1,
    *,
    name: str | None = None,
    key: str | tuple[str, ...] = "caller",
) -> None:
    """Log ``msg`` only the first ``n`` times.

    Args:
        level: the logging level.
        msg: the message.
        n: how many times to log it.
        name: the logger; by default the calling module's (a script's: ``trainkit``).
        key: what makes two calls "the same": ``"caller"`` (the calling file and line,
            whatever the message), ``"message"`` (the text, from anywhere; ``"msg"`` is
            accepted too) or both as a tuple.

    Raises:
        ValueError: If ``key`` names something else.
    """
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys or set(keys) - {"caller", "message", "msg"}:
        raise ValueError(f"log_first_n key must be 'caller', 'message' or both, got {key!r}")
    module, site = _call_site()
    ident: tuple = site if "caller" in keys else ()
    if "message" in keys or "msg" in keys:
        ident = (*ident, msg)
    if _THROTTLE.count(("first_n", *ident)) <= n:
        logging.getLogger(name or module).log(level, msg)


def log_every_n(level: int, msg: str, n: int = 1, *, name: str | None = None) -> None:
    """Log ``msg`` on the 1st, (n+1)th, (2n+1)th, ... call from the same file and line.

    Args:
        level, msg, name: as for :func:`log_first_n` (``msg`` may change from call to call).
        n: log one call in ``n``.
    """
    module, site = _call_site()
    if (_THROTTLE.count(("every_n", *site)) - 1) % max(n, 1) == 0:
        logging.getLogger(name or module).log(level, msg)


def log_every_n_seconds(level: int, msg: str, n: float = 1.0, *, name: str | None = None) -> None:
    """Log ``msg`` at most once every ``n`` seconds from the same file and line.

    The first call from a place always logs.

    Args:
        level, msg, name: as for :func:`log_first_n` (``msg`` may change from call to call).
        n: the minimum number of seconds between two logged calls.
    """
    module, site = _call_site()
    if _THROTTLE.due(site, n):
        logging.getLogger(name or module).log(level, msg)


def create_small_table(small_dict: Mapping[str, Any]) -> str:
    """Format a few named values as a table of three lines: the names, a rule, the values.

    Non-integer numbers are written with 3 decimals. Each column is as wide as its longer
    cell and cells are separated by ``" | "``, so a long name never runs into the next
    column; the table is Markdown, to paste into a report::

        |   AP  | top1_accuracy | n |
        |:-----:|:-------------:|:-:|
        | 0.250 |     0.918     | 3 |

    Args:
        small_dict: name -> value, in the order to show.

    Returns:
        The table, without a trailing newline (empty for an empty dict).
    """
    if not small_dict:
        return ""
    names = [str(name) for name in small_dict]
    values = [_table_cell(value) for value in small_dict.values()]
    widths = [max(len(name), len(value)) for name, value in zip(names, values)]

    def row(cells: list[str]) -> str:
        return "| " + " | ".join(cell.center(width) for cell, width in zip(cells, widths)) + " |"

    rule = "|" + "|".join(":" + "-" * width + ":" for width in widths) + "|"
    return "\n".join([row(names), rule, row(values)])


def _table_cell(value: Any) -> str:
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return f"{float(value):.3f}"
    return str(value)


def _log_api_usage(identifier: str) -> None:
    """Do nothing: detectron2's hook for PyTorch's internal API-usage logging.

    Projects' copies of detectron2 modules (registries, loader builders) import and call it,
    so it exists; trainkit records no API usage.
    """
    del identifier


_THIS_FILE = log_every_n.__code__.co_filename
