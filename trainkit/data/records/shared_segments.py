"""Read-only record segments in anonymous shared memory that other local processes can attach to.

A *segment* holds serialised records: a 64-byte header (with a BLAKE2b digest of the record
bytes, ends and counts), the concatenated record bytes, and the int64 end offset of every
record. It lives in an **anonymous** memory file (``memfd_create``, else an unlinked file in
``/dev/shm``): the kernel frees the pages with the last descriptor and mapping, also after a
crash. A complete memfd is sealed against writes, growth and shrinking. Other local
processes map the same file through :mod:`trainkit.data.records.segment_sharing`.

Plain ``pickle`` stores the bytes themselves (as for a torch tensor); loading puts them into a
new memory file. Where no memory file can be created a segment lives in private memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import tempfile
import weakref
from array import array
from typing import Any, NamedTuple

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["SegmentHandle", "SegmentWriter", "SharedSegment", "is_sealed", "segment_from_fd"]

_MAGIC = 0x54524B4954534547  # "TRKITSEG"
_VERSION = 2  # 2: the header holds the digest
_DIGEST_BYTES = 32
_HEADER_BYTES = 64  # int64 magic, version, num_records, data_bytes; then the digest
# Seals that make a memfd immutable: nobody can write, grow or shrink it, or lift them.
_IMMUTABLE_SEALS = 0
for _flag in ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE"):
    _IMMUTABLE_SEALS |= getattr(fcntl, _flag, 0)


class SegmentHandle(NamedTuple):
    """Plain data that lets a process on the same machine attach to a segment.

    Process ``pid`` holds the segment (``size`` bytes) open as descriptor ``fd``; ``dev`` and
    ``ino`` (the memory file's ``st_dev``/``st_ino``) are checked on attach, so a recycled pid
    or fd number is detected instead of mapping an unrelated file; ``digest`` names the
    records, to ask for them by content if ``/proc`` fails.
    """

    pid: int
    fd: int
    dev: int
    ino: int
    size: int
    digest: bytes = b""


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


def is_sealed(fd: int) -> bool:
    """Return whether memory file ``fd`` is sealed immutable (only a memfd can be)."""
    if not _IMMUTABLE_SEALS:
        return False
    try:
        return fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _IMMUTABLE_SEALS == _IMMUTABLE_SEALS
    except (OSError, AttributeError):
        return False  # not a memfd (or no sealing on this system)


class SharedSegment:
    """A complete, read-only segment: ``data`` (uint8) and ``ends`` (int64) numpy views.

    Made by :class:`SegmentWriter`, :func:`segment_from_fd` or ``segment_sharing``'s
    ``attach_segment``; sent through multiprocessing (to a loader worker it spawned) it travels
    as its handle, so the receiver maps the same pages.
    """

    def __init__(self, fd: int | None, buffer: Any) -> None:
        """Wrap ``fd`` mapped as ``buffer`` (private bytes if ``fd`` is None); check its header."""
        self._fd, self._buffer = fd, buffer
        self._identity: tuple[int, int] | None = None
        if fd is not None:
            # Close our descriptor when this object goes; the mapping lives on in the views.
            self._finalizer = weakref.finalize(self, os.close, fd)
            st = os.fstat(fd)
            self._identity = (st.st_dev, st.st_ino)
        if len(buffer) < _HEADER_BYTES:
            raise ValueError("not a trainkit record segment (too short for a header)")
        header = np.frombuffer(buffer, dtype=np.int64, count=4)
        magic, version, num_records, data_bytes = (int(x) for x in header)
        if magic != _MAGIC or version != _VERSION:
            raise ValueError("not a trainkit record segment (bad header)")
        ends_offset = _HEADER_BYTES + _aligned(data_bytes)
        if num_records < 0 or data_bytes < 0 or ends_offset + 8 * num_records > len(buffer):
            raise ValueError("not a trainkit record segment (sizes exceed the file)")
        self.digest = bytes(buffer[32 : 32 + _DIGEST_BYTES])
        self.data = np.frombuffer(buffer, dtype=np.uint8, count=data_bytes, offset=_HEADER_BYTES)
        self.ends = np.frombuffer(buffer, dtype=np.int64, count=num_records, offset=ends_offset)

    @property
    def shared(self) -> bool:
        """Whether other processes can attach to this segment."""
        return self._fd is not None

    @property
    def sealed(self) -> bool:
        """Whether the memory file is sealed immutable (memfd only)."""
        return self._fd is not None and is_sealed(self._fd)

    def fileno(self) -> int:
        """Return this process's descriptor of the memory file (``ValueError`` if private)."""
        if self._fd is None:
            raise ValueError("a private segment has no file descriptor")
        return self._fd

    @property
    def identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the memory file: equal in every process that attached."""
        return self._identity

    @property
    def nbytes(self) -> int:
        """Size of the segment in bytes."""
        return len(self._buffer)

    def record(self, idx: int) -> np.ndarray:
        """Return the bytes of record ``idx`` (negative indices and bounds checks as in a list)."""
        idx = range(self.ends.size)[idx]
        start = int(self.ends[idx - 1]) if idx > 0 else 0
        return self.data[start : int(self.ends[idx])]

    def handle(self) -> SegmentHandle | None:
        """Return the handle other local processes attach with (``None`` if private)."""
        if self._fd is None or self._identity is None:
            return None
        return SegmentHandle(os.getpid(), self._fd, *self._identity, self.nbytes, self.digest)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _segment_from_bytes, (bytes(self._buffer),)


def _aligned(nbytes: int) -> int:
    return (nbytes + 7) // 8 * 8


def _segment_from_bytes(data: bytes) -> SharedSegment:
    """Rebuild a pickled segment in a new sealed memory file (private memory if none)."""
    try:
        fd = _create_anonymous_file("trainkit-dataset")
    except OSError as e:
        logger.warning("Cannot create a shared memory file (%s); records stay private", e)
        return SharedSegment(None, data)
    return _seal_and_map(fd, data)


def _seal_and_map(fd: int, *chunks: Any, header: bytes = b"") -> SharedSegment:
    """Append ``chunks`` to memory file ``fd`` (``header`` over its start), seal and map it."""
    try:
        for chunk in chunks:
            _write_all(fd, chunk)
        if header:
            os.pwrite(fd, header, 0)
        # An unlinked tmpfs file cannot be sealed; it is still mapped read-only.
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _IMMUTABLE_SEALS)
        size = os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise
    return segment_from_fd(fd, size)


def segment_from_fd(fd: int, size: int) -> SharedSegment:
    """Map memory file ``fd`` (``size`` bytes) read-only; the segment takes over ``fd``.

    ``fd`` is closed if that fails: ``OSError`` if it cannot be mapped, ``ValueError`` if its
    size is not ``size`` or it holds no segment.
    """
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise ValueError(f"memory file has {actual} bytes, expected {size}")
        buffer = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        return SharedSegment(fd, buffer)
    except BaseException:
        os.close(fd)
        raise


class SegmentWriter:
    """Append record bytes into a new anonymous memory file, then seal and map it.

    The bytes are hashed on their way straight into the file's pages, which become the shared
    copy: no second copy of the data (only the caller's int64 ends, 8 bytes per record). Use
    it as a context manager, which discards an unfinished segment.
    """

    def __init__(self, name: str = "trainkit-records") -> None:
        """Create the memory file (or fall back to private memory, logging why)."""
        self._private: bytearray | None = None
        self._fd: int | None = None
        self._hash = hashlib.blake2b(digest_size=_DIGEST_BYTES)
        self._data_bytes = 0
        try:
            self._fd = _create_anonymous_file(name)
            _write_all(self._fd, bytes(_HEADER_BYTES))  # patched by finish()
        except OSError as e:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            logger.warning("Cannot create a shared memory file (%s); records stay private", e)
            self._private = bytearray(_HEADER_BYTES)

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` to the record bytes."""
        self._data_bytes += len(data)
        self._hash.update(data)
        if self._private is not None:
            self._private += data
        else:
            _write_all(self._fd, data)  # type: ignore[arg-type]

    def finish(self, ends: array) -> SharedSegment:
        """Write the header and ``ends`` (``array("q")``, each record's end offset), seal, map."""
        pad = bytes(_aligned(self._data_bytes) - self._data_bytes)
        # The digest covers the record bytes, the ends and both counts, so two segments
        # with equal digests hold the same records with the same boundaries.
        self._hash.update(memoryview(ends).cast("B"))
        counts = np.array([len(ends), self._data_bytes], dtype=np.int64)
        self._hash.update(counts.tobytes())
        fields = np.array([_MAGIC, _VERSION, len(ends), self._data_bytes], dtype=np.int64)
        header = fields.tobytes() + self._hash.digest()
        if self._private is not None:
            self._private[:_HEADER_BYTES] = header
            return SharedSegment(None, bytes(self._private + pad + ends.tobytes()))
        fd, self._fd = self._fd, None
        return _seal_and_map(fd, pad, ends, header=header)  # type: ignore[arg-type]

    def __enter__(self) -> SegmentWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Discard the segment unless :meth:`finish` made it (frees the memory file)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._private = None
