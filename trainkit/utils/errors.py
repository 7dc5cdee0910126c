"""Errors a user causes, and how a script reports them: one line, exit status 2.

An error caused by the user's input (a config value, a file, a dataset or architecture
name, a flag, weights that do not fit) is a :class:`UsageError`; ``ConfigError`` and the
other user-error types also subclass the builtin type code used to catch (``ValueError``,
``KeyError``). Anything else is a bug or a machine failure and keeps its traceback.
``default_argument_parser`` and ``launch`` install :func:`install_usage_error_handler`, and
``launch`` re-raises a worker's ``UsageError`` in the parent, so a detectron2-style script
never catches them itself.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

__all__ = [
    "USAGE_EXIT_CODE",
    "MissingFileError",
    "UnknownNameError",
    "UsageError",
    "add_note",
    "install_usage_error_handler",
    "user_message",
]

USAGE_EXIT_CODE = 2
"""Exit status of a run stopped by a user error (argparse's convention); never retried."""


def add_note(error: BaseException, note: str) -> None:
    """Add ``note`` to ``error``'s notes, printed under its message (``BaseException.add_note``).

    Python 3.9 and 3.10 have no ``add_note``: the note goes into ``__notes__`` as 3.11 keeps it,
    where the launcher's and the usage-error handler's reports read it.
    """
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        error.__notes__ = [*vars(error).get("__notes__", ()), note]


class UsageError(Exception):
    """A problem with the command line, config or input files that the user must fix.

    The message is one line: what is wrong (naming the key, file or value) and what to do.
    """


class UnknownNameError(UsageError, KeyError):
    """A name (dataset, architecture, sampler, ...) that is not registered; lists the known ones."""

    def __str__(self) -> str:
        # KeyError quotes its message; a user reads it as a sentence.
        return str(self.args[0]) if self.args else ""


class MissingFileError(UsageError, FileNotFoundError):
    """A file the user named (config, weights, metadata) does not exist."""


def user_message(error: BaseException) -> str:
    """Return the one-line message of a user error, also when a loader worker raised it.

    torch re-raises a worker's exception in the training process as the same type with the
    message ``"Caught X in DataLoader worker process N. Original Traceback ..."``; the
    user's message is then the traceback's last entry.
    """
    text, cls = str(error), type(error)
    marker = f"{cls.__module__}.{cls.__qualname__}: "
    at = text.rfind(marker)
    return text[at + len(marker) :].strip() if text.startswith("Caught ") and at >= 0 else text


def _report_uncaught(
    exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    if issubclass(exc_type, UsageError):
        # Rank 0 by the environment, which says it before (and whether or not) a process
        # group exists: torchrun's RANK, or SLURM's task id under srun.
        if os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0":
            _write_line(f"error: {user_message(exc)}")
        # Raising SystemExit from the hook sets the exit status; atexit handlers still run.
        raise SystemExit(USAGE_EXIT_CODE)
    exit_code = getattr(exc, "exit_code", None)
    if exc_type.__module__.startswith("trainkit.") and isinstance(exit_code, int) and exit_code > 0:
        # A trainkit outcome with its own status (a failed rank, a pre-empted run): its
        # message (the failed rank's traceback included) and notes (the failing step's
        # folder, as a traceback would end with them) are the report; the launcher's own
        # stack would only be noise.
        _write_line("".join([str(exc), *(f"\n{note}" for note in getattr(exc, "__notes__", ()))]))
        raise SystemExit(exit_code)
    _previous_hook(exc_type, exc, tb)


def _write_line(message: str) -> None:
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    sys.stderr.write(f"{program}: {message}\n")
    sys.stderr.flush()


_previous_hook = sys.excepthook


def install_usage_error_handler() -> None:
    """Make uncaught trainkit errors end the process with a message and their exit status.

    A :class:`UsageError` prints ``<script>: error: <message>`` on stderr (rank 0 only) and
    exits with 2; a trainkit error with an ``exit_code`` (``LaunchError``: a failed rank and
    its traceback; ``TrainingPreempted``: 75) prints its message and exits with that status.
    Other exceptions go to the previous hook (a traceback by default). Installing twice is
    harmless.

    It sets ``sys.excepthook``, one of the few process-wide settings trainkit makes, each
    where it is needed: ``import trainkit`` sets ``OMP_WAIT_POLICY=PASSIVE`` unless set;
    shared record segments register a fork handler (children forget the parent's segments);
    a checkpointer writing in the background registers an ``atexit`` wait for its last
    write; the pre-emption hook installs SIGTERM/SIGINT/SIGUSR1 handlers while training
    (restored afterwards); ``launch()`` forwards signals to its processes while it runs.
    """
    global _previous_hook
    if sys.excepthook is not _report_uncaught:
        _previous_hook = sys.excepthook
        sys.excepthook = _report_uncaught
