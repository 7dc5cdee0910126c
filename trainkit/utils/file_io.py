"""The one iopath ``PathManager`` and atomic file writing."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO

from iopath.common.file_io import PathManager as _PathManagerClass

__all__ = ["PathManager", "atomic_write", "fsync_directory"]

PathManager = _PathManagerClass()
"""The project-wide path manager; register extra handlers (e.g. for a blob store) on it."""


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb") -> Iterator[IO]:
    """Write a local file so that readers see either the old file or the complete new one.

    The data goes to a temporary file in the same directory, is flushed, fsynced and renamed
    over ``path``; the directory is fsynced so the rename survives a power loss. If the body
    raises (or the process dies), ``path`` is untouched and the temporary file removed (or
    left as ``.*.tmp``, never under the final name).

    Args:
        path: destination on a local file system.
        mode: ``"wb"`` or ``"w"``.

    Yields:
        An open file object to write to.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write supports modes 'wb' and 'w', got {mode!r}")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(
        dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_path)
        raise
    fsync_directory(directory)


def fsync_directory(directory: str) -> None:
    """Make the renames in ``directory`` survive a power loss (where the file system allows)."""
    # Some file systems refuse to open a directory for fsync; the rename is then as durable
    # as that file system makes it.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
