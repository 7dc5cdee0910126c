"""Rank-aware logging set-up: rank 0 to the console and ``log.txt``, rank N to ``log.txt.rankN``."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections import Counter

__all__ = ["log_every_n_seconds", "log_first_n", "setup_logger"]

_FORMAT = "[%(asctime)s %(name)s %(levelname)s] %(message)s"
_DATE_FORMAT = "%m/%d %H:%M:%S"


def setup_logger(
    output: str | None = None,
    distributed_rank: int = 0,
    *,
    name: str = "trainkit",
    level: int = logging.INFO,
    abbrev_name: str | None = None,
) -> logging.Logger:
    """Configure the ``name`` logger for this rank; calling it again replaces its handlers.

    Args:
        output: a directory (the file is ``log.txt`` in it) or a file path ending in
            ``.txt``/``.log``; ``None`` logs to the console only.
        distributed_rank: rank 0 logs to the console and ``output``; rank N to
            ``output + ".rankN"`` only.
        name: the logger to configure (its children propagate to it).
        level: the logging level.
        abbrev_name: unused; kept for detectron2 compatibility.

    Returns:
        The configured logger.
    """
    del abbrev_name
    logger = logging.getLogger(name)
    logger.setLevel(level)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    formatter = logging.Formatter(_FORMAT, datefmt=_DATE_FORMAT)
    if distributed_rank == 0:
        console = logging.StreamHandler(stream=sys.stdout)
        console.setFormatter(formatter)
        logger.addHandler(console)
    if output is not None:
        path = output if output.endswith((".txt", ".log")) else os.path.join(output, "log.txt")
        if distributed_rank > 0:
            path = f"{path}.rank{distributed_rank}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        file_handler = logging.FileHandler(path, mode="a")
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


_LOG_COUNTER: Counter = Counter()
_LOG_TIMERS: dict = {}


def log_first_n(
    level: int, msg: str, n: int = 1, *, name: str = "trainkit", key: str = "msg"
) -> None:
    """Log ``msg`` only the first ``n`` times this call site (or ``msg``) is reached."""
    caller = sys._getframe(1)
    ident = (caller.f_code.co_filename, caller.f_lineno) if key == "caller" else msg
    _LOG_COUNTER[ident] += 1
    if _LOG_COUNTER[ident] <= n:
        logging.getLogger(name).log(level, msg)


def log_every_n_seconds(level: int, msg: str, n: float = 1.0, *, name: str = "trainkit") -> None:
    """Log ``msg`` at most once every ``n`` seconds."""
    now = time.monotonic()
    last = _LOG_TIMERS.get(msg)
    if last is None or now - last >= n:
        logging.getLogger(name).log(level, msg)
        _LOG_TIMERS[msg] = now
