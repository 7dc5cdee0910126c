"""Read-only record segments in anonymous shared memory that other local processes can attach to.

A *segment* holds serialised records: a 32-byte header, the concatenated record bytes, and
the int64 end offset of every record. It lives in an **anonymous** memory file
(``memfd_create``, or an unlinked temporary file in ``/dev/shm`` where memfd is missing),
so it has no name anywhere in the file system:

* nothing can leak: the kernel frees the pages when the last descriptor and mapping go
  away, which also happens when every process holding it crashes or is killed;
* another process on the machine attaches by opening ``/proc/<pid>/fd/<fd>`` of a process
  that holds it (the same file, not a copy) and maps it read-only. Ranks attach through the
  leader's handle; a spawned loader worker attaches through its parent's handle, which is
  what pickling a segment sends. Forked workers simply inherit the mapping.

The writer seals a memfd against writes, growth and shrinking once it is complete, so no
process can change the bytes under another one's feet.

Where none of this is possible (no fd can be created) a segment falls back to private
memory and says so; pickling such a segment copies its bytes, as a numpy array would.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import tempfile
import weakref
from array import array
from typing import Any, NamedTuple

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["SegmentHandle", "SegmentWriter", "SharedSegment", "attach_segment"]

_MAGIC = 0x54524B4954534547  # "TRKITSEG"
_VERSION = 1
_HEADER_BYTES = 32  # int64 magic, version, num_records, data_bytes
_SEAL_ALL = 0
for _flag in ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE"):
    _SEAL_ALL |= getattr(fcntl, _flag, 0)


class SegmentHandle(NamedTuple):
    """Plain data that lets a process on the same machine attach to a segment.

    Attributes:
        pid: a process that holds the segment open.
        fd: the descriptor number in that process.
        dev: ``st_dev`` of the memory file (checked on attach, so a recycled pid or fd
            number is detected instead of mapping an unrelated file).
        ino: ``st_ino`` of the memory file.
        size: the segment's size in bytes.
    """

    pid: int
    fd: int
    dev: int
    ino: int
    size: int


def _create_anonymous_file(name: str) -> int:
    # memfd: anonymous, sealable, freed with its last reference. The fallback is an
    # O_TMPFILE/unlinked file in /dev/shm (or the temp dir): equally nameless.
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create(name, os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
        except OSError as e:
            logger.debug("memfd_create failed (%s); using an unlinked temporary file", e)
    directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryFile(dir=directory) as f:
        return os.dup(f.fileno())  # the dup keeps the (already unlinked) file alive


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


class SharedSegment:
    """A complete, read-only segment: ``data`` (uint8) and ``ends`` (int64) numpy views.

    Create one with :class:`SegmentWriter` or :func:`attach_segment`. Pickling sends a
    handle (this process's pid and fd), so the receiver maps the same pages; it must run on
    the same machine while this process still holds the segment, which is the case for a
    loader worker spawned by this process.
    """

    def __init__(self, fd: int | None, buffer: Any) -> None:
        """Wrap memory file ``fd`` mapped as ``buffer`` (private bytes if ``fd`` is None)."""
        self._fd = fd
        self._buffer = buffer
        if fd is not None:
            # Close our descriptor when this object goes; the mapping lives on in the views.
            self._finalizer = weakref.finalize(self, os.close, fd)
            st = os.fstat(fd)
            self._identity: tuple[int, int] | None = (st.st_dev, st.st_ino)
        else:
            self._identity = None
        header = np.frombuffer(buffer, dtype=np.int64, count=4)
        magic, version, num_records, data_bytes = (int(x) for x in header)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError("not a trainkit record segment (bad header)")
        self.data = np.frombuffer(buffer, dtype=np.uint8, count=data_bytes, offset=_HEADER_BYTES)
        ends_offset = _HEADER_BYTES + _aligned(data_bytes)
        self.ends = np.frombuffer(buffer, dtype=np.int64, count=num_records, offset=ends_offset)

    @property
    def shared(self) -> bool:
        """Whether other processes can attach to this segment."""
        return self._fd is not None

    @property
    def identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the memory file: equal in every process that attached."""
        return self._identity

    @property
    def nbytes(self) -> int:
        """Size of the segment in bytes."""
        return len(self._buffer)

    def handle(self) -> SegmentHandle | None:
        """Return the handle other local processes attach with (``None`` if private)."""
        if self._fd is None or self._identity is None:
            return None
        return SegmentHandle(os.getpid(), self._fd, *self._identity, self.nbytes)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        handle = self.handle()
        if handle is None:
            return _from_private_bytes, (bytes(self._buffer),)
        return attach_segment, (handle,)


def _aligned(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def _from_private_bytes(data: bytes) -> SharedSegment:
    return SharedSegment(None, data)


def attach_segment(handle: SegmentHandle) -> SharedSegment:
    """Map the segment described by ``handle`` read-only (the same pages, not a copy).

    Raises:
        OSError: If the holding process is gone or its descriptor cannot be opened (another
            machine, another user, ``/proc`` mounted with ``hidepid``).
        ValueError: If the descriptor now refers to another file than the handle describes.
    """
    path = f"/proc/{handle.pid}/fd/{handle.fd}"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size) != (handle.dev, handle.ino, handle.size):
            raise ValueError(
                f"{path} is not the record segment it was shared as (pid or fd reused?)"
            )
        buffer = mmap.mmap(fd, handle.size, access=mmap.ACCESS_READ)
    except BaseException:
        os.close(fd)
        raise
    return SharedSegment(fd, buffer)


class SegmentWriter:
    """Append record bytes into a new anonymous memory file, then seal and map it.

    The bytes go straight into the file's pages, which become the shared copy, so building a
    segment needs no second copy of the data (only the int64 ends, 8 bytes per record, are
    kept privately until :meth:`finish`).
    """

    def __init__(self, name: str = "trainkit-records") -> None:
        """Create the memory file (or fall back to private memory, logging why)."""
        self._chunks: list[bytes] | None = None
        self._fd: int | None = None
        try:
            self._fd = _create_anonymous_file(name)
            _write_all(self._fd, bytes(_HEADER_BYTES))  # patched by finish()
        except OSError as e:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            logger.warning("Cannot create a shared memory file (%s); records stay private", e)
            self._chunks = [bytes(_HEADER_BYTES)]
        self._data_bytes = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` to the record bytes."""
        self._data_bytes += len(data)
        if self._fd is not None:
            _write_all(self._fd, data)
        else:
            assert self._chunks is not None
            self._chunks.append(bytes(data))

    def finish(self, ends: array) -> SharedSegment:
        """Write the header and the int64 record ends (``array("q")``), seal, and map.

        Args:
            ends: end offset of every record within the record bytes, ascending.
        """
        num_records = len(ends)
        pad = bytes(_aligned(self._data_bytes) - self._data_bytes)
        header = np.array([_MAGIC, _VERSION, num_records, self._data_bytes], dtype=np.int64)
        if self._fd is None:
            assert self._chunks is not None
            self._chunks[0] = header.tobytes()
            self._chunks += [pad, ends.tobytes()]
            return SharedSegment(None, b"".join(self._chunks))
        fd, self._fd = self._fd, None
        try:
            _write_all(fd, pad)
            _write_all(fd, ends)
            os.pwrite(fd, header.tobytes(), 0)
            try:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEAL_ALL)
            except (OSError, AttributeError):
                pass  # an unlinked tmpfs file cannot be sealed; it is still read-only mapped
            size = os.fstat(fd).st_size
            buffer = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        return SharedSegment(fd, buffer)

    def abort(self) -> None:
        """Discard a segment that will not be finished (frees the memory file)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._chunks = None
