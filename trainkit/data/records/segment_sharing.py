"""One copy of identical record segments per machine, found by content, with no collective.

trainkit's one mechanism for one copy of the records per machine: no collective and no process
group, so it works under any launcher and no rank waits for another. Every process that builds
a record segment (``DatasetFromList(lst)`` on each rank, and the catalog path) serialises it
into its own sealed memfd, hashing it on the way
(:class:`~trainkit.data.records.shared_segments.SegmentWriter`); :func:`share_segment` then
meets the machine's other holders of the same records at a Linux *abstract* unix socket::

    \\0trainkit-records/<uid>/<blake2b digest, hex>

* The first process to ``bind`` it serves: a daemon thread sends the memfd over the socket
  (``SCM_RIGHTS``; no ``/proc`` access needed). A later one connects, checks what it receives
  (same user, sealed, the size and digest of its own segment), maps it and drops its own copy.
* Different records have different names; abstract names vanish with their last socket, so
  a crash leaves nothing behind.
* Holders keep their connection open to *watch* the server: when it exits or drops the
  dataset, they race to ``bind`` and the winner serves its mapping (the same file).
* Forked loader workers inherit the mapping (an at-fork handler closes the inherited sockets:
  only the parent serves); spawned ones attach through the pickled handle
  (:func:`attach_segment`) or, where that fails, by digest.
* Without memfd sealing or abstract unix sockets, or when a connection times out, a process
  keeps its private copy and logs one line. Segments under :data:`MIN_SHARED_BYTES` are not
  shared: the saving would not pay for a thread and sockets.

Costs: every rank loads and serialises the records itself (the catalog function's CPU time
and reads once per rank); ranks that build at the same time briefly hold one copy each, freed
as each attaches. Each shared segment keeps a daemon thread and a few sockets per process.
Same-user processes are trusted (they could read this process's memory anyway); other users
can neither be served nor serve (``SO_PEERCRED``). Tests stop every share with :func:`stop_all`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import socket
import struct
import threading
import time
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

from trainkit.data.records.shared_segments import (
    SegmentHandle,
    SharedSegment,
    is_sealed,
    segment_from_fd,
)

logger = logging.getLogger(__name__)

__all__ = ["MIN_SHARED_BYTES", "attach_segment", "share_segment", "stop_all"]

MIN_SHARED_BYTES = 1 << 20
_CLAIM_ATTEMPTS = 8  # with a growing pause: about 0.5 s for a stopping server to close
TIMEOUT_S = 10.0  # for connect + receive: a live holder answers in milliseconds
MESSAGE = struct.Struct("<8sQ32s")  # magic, segment size, digest; the fd rides along
MESSAGE_MAGIC = b"TKSHARE1"

_LIVE: weakref.WeakSet[_Share] = weakref.WeakSet()


def segment_address(digest: bytes) -> bytes:
    """The abstract unix socket where this user's holder of ``digest`` serves it."""
    return f"\0trainkit-records/{os.getuid()}/{digest.hex()}".encode()


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """Return ``(pid, uid)`` of the process at the other end of a unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[:2]


def receive_segment(digest: bytes, size: int) -> tuple[socket.socket, int]:
    """Connect to the holder of ``digest``; return the open connection and the received fd.

    Raises ``ConnectionRefusedError`` if nobody serves ``digest`` right now, another
    ``OSError`` if the holder is not trustworthy or does not answer as expected.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = -1
    try:
        sock.settimeout(TIMEOUT_S)
        sock.connect(segment_address(digest))
        if peer_credentials(sock)[1] != os.getuid():
            raise PermissionError("the socket for these records belongs to another user")
        message, fds, _, _ = socket.recv_fds(sock, MESSAGE.size, 1)
        fd = fds[0] if fds else -1
        for extra in fds[1:]:
            os.close(extra)
        if len(message) != MESSAGE.size or fd < 0:
            raise ConnectionError("the holder closed the connection without an answer")
        if MESSAGE.unpack(message) != (MESSAGE_MAGIC, size, digest):
            raise ConnectionError("the holder offered other records than asked for")
        if os.fstat(fd).st_size != size or not is_sealed(fd):
            raise ConnectionError("the offered memory file is not sealed or has another size")
        sock.settimeout(None)
        return sock, fd
    except BaseException:
        sock.close()
        if fd >= 0:
            os.close(fd)
        raise


def map_received(fd: int, digest: bytes, size: int) -> SharedSegment:
    """Map the memory file ``fd`` a holder sent (``ConnectionError`` unless it has ``digest``)."""
    try:
        segment = segment_from_fd(fd, size)
    except ValueError as e:
        raise ConnectionError(f"the offered memory file is not a record segment ({e})") from e
    if segment.digest != digest:
        raise ConnectionError("the offered segment's header names other records")
    return segment


def fetch_segment(digest: bytes, size: int) -> SharedSegment | None:
    """Map the segment ``digest`` a local process serves (``None``: none, or a check failed)."""
    try:
        sock, fd = receive_segment(digest, size)
        sock.close()
        return map_received(fd, digest, size)
    except OSError as e:
        logger.debug("No holder of segment %s answered with it: %s", digest.hex()[:12], e)
        return None


def attach_segment(handle: SegmentHandle) -> SharedSegment:
    """Map the segment described by ``handle`` read-only (the same pages, not a copy).

    Opens ``/proc/<pid>/fd/<fd>``, or where that fails (``/proc`` mounted with ``hidepid``,
    the pid or fd reused) asks the machine's holder of the same digest (:func:`fetch_segment`).

    Raises:
        OSError: If the holder is gone or its descriptor cannot be opened (another machine,
            another user) and no holder of the digest answers.
        ValueError: If the descriptor now refers to another file than the handle describes.
    """
    path = f"/proc/{handle.pid}/fd/{handle.fd}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (handle.dev, handle.ino):
            os.close(fd)
            raise ValueError(
                f"{path} is not the record segment it was shared as (pid or fd reused?)"
            )
        return segment_from_fd(fd, handle.size)
    except (OSError, ValueError):
        segment = fetch_segment(handle.digest, handle.size) if handle.digest else None
        if segment is None:
            raise
        return segment


def _reduce_for_processes(segment: SharedSegment) -> tuple[Any, tuple[Any, ...]]:
    handle = segment.handle()
    return segment.__reduce__() if handle is None else (attach_segment, (handle,))


# Like torch's tensors: a handle for processes of this machine, the bytes for plain pickle.
ForkingPickler.register(SharedSegment, _reduce_for_processes)


def share_segment(segment: SharedSegment) -> SharedSegment:
    """Return the machine's copy of ``segment``'s records, serving ``segment`` if first.

    That is another process's segment with the same digest (the caller drops its own), else
    ``segment``, served until it is garbage-collected. Never waits beyond one connection
    attempt (at most ``TIMEOUT_S`` if a holder hangs).
    """
    if not segment.shared or segment.nbytes < MIN_SHARED_BYTES:
        return segment
    if not segment.sealed:
        logger.info("Records stay private to this process: their memory file cannot be sealed")
        return segment
    share = _Share(segment.digest, segment.nbytes, os.dup(segment.fileno()))
    try:
        result = share.join(segment)
    except OSError as e:
        share.close()
        logger.warning(
            "Cannot share the records with other processes on this machine (%s: %s); "
            "this process keeps a private copy",
            *(type(e).__name__, e),
        )
        return segment
    _LIVE.add(share)
    weakref.finalize(result, share.stop)
    if result is not segment:
        logger.info(
            "Process %s on this machine holds the same %d records: mapping its copy "
            "(%.2f MiB not duplicated)",
            *(share.server_pid, int(result.ends.size), result.nbytes / 2**20),
        )
    return result


def stop_all() -> None:
    """Stop serving and watching every segment of this process (for tests)."""
    for share in list(_LIVE):
        share.stop()


def _forget_in_child() -> None:
    # A forked child must not answer for its parent: close (never shut down, which would
    # also break the parent's sockets) the inherited copies of every socket. The thread
    # that used a share's lock does not exist here.
    for share in list(_LIVE):
        share._lock, share._thread = threading.Lock(), None
        share.abandon()
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class _Share:
    """This process's part in sharing one segment: serving it, or watching who does."""

    def __init__(self, digest: bytes, size: int, fd: int) -> None:
        self._digest, self._size, self._fd = digest, size, fd
        self._listener: socket.socket | None = None
        self._conn: socket.socket | None = None  # to the server, while watching
        self._clients: list[socket.socket] = []
        self._selector: selectors.BaseSelector | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()  # guards the socket attributes against stop()
        self._thread: threading.Thread | None = None
        self.server_pid: int | None = None  # who served the segment we mapped, if not us

    def join(self, own: SharedSegment) -> SharedSegment:
        """Serve ``own`` or take the served copy, and keep it going (``OSError``: neither)."""
        result = own
        found = self._bind_or_connect()
        if found is not None:
            conn, fd = found
            try:
                result = map_received(fd, self._digest, self._size)
            except BaseException:
                conn.close()
                raise
            self._conn, self.server_pid = conn, peer_credentials(conn)[0]
            os.close(self._fd)
            self._fd = os.dup(result.fileno())  # serve the same file if we take over
        name = f"trainkit-share-{self._digest.hex()[:8]}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        return result

    def _bind_or_connect(self) -> tuple[socket.socket, int] | None:
        """Serve the name (``None``) or connect to who does (``OSError``: stopped, or neither)."""
        for attempt in range(_CLAIM_ATTEMPTS):
            with self._lock:
                if self._stopped.is_set():
                    raise OSError("sharing was stopped")
                if self._try_bind():
                    return None
            try:
                return receive_segment(self._digest, self._size)
            except ConnectionRefusedError:
                time.sleep(0.02 * attempt)  # the server left between bind and connect
        raise OSError(f"no stable holder after {_CLAIM_ATTEMPTS} attempts")

    def _try_bind(self) -> bool:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(segment_address(self._digest))
            listener.listen(64)
        except OSError as e:
            listener.close()
            if e.errno == errno.EADDRINUSE:
                return False
            raise
        self._listener = listener
        return True

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                if self._listener is not None:
                    self._serve()
                    return
                self._watch()
                if self._stopped.is_set() or not self._claim():
                    return
        except Exception as e:  # a daemon thread must not die noisily; sharing just ends
            logger.debug("Sharing segment %s ended: %s", self._digest.hex()[:12], e)
        finally:
            self.close()

    def _serve(self) -> None:
        assert self._listener is not None
        selector = selectors.DefaultSelector()
        with self._lock:
            if self._stopped.is_set():
                selector.close()
                return
            self._selector = selector
        selector.register(self._listener, selectors.EVENT_READ)
        message = MESSAGE.pack(MESSAGE_MAGIC, self._size, self._digest)
        while not self._stopped.is_set():
            for key, _ in selector.select():
                sock = key.fileobj
                if sock is self._listener:
                    if not self._accept(selector, message):
                        return  # the listener was shut down by stop()
                else:  # a client hung up (or sent something it should not): forget it
                    selector.unregister(sock)
                    self._clients.remove(sock)
                    sock.close()

    def _accept(self, selector: selectors.BaseSelector, message: bytes) -> bool:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return False
        try:
            if peer_credentials(conn)[1] != os.getuid():
                raise PermissionError("another user asked for the records")
            conn.settimeout(TIMEOUT_S)
            socket.send_fds(conn, [message], [self._fd])
        except OSError as e:
            logger.debug("Not serving segment %s to a client: %s", self._digest.hex()[:12], e)
            conn.close()
            return True
        self._clients.append(conn)
        selector.register(conn, selectors.EVENT_READ)
        return True

    def _watch(self) -> None:
        conn = self._conn
        assert conn is not None
        with contextlib.suppress(OSError):
            while conn.recv(64):
                pass  # the server never sends more; EOF means it stopped serving
        with self._lock:
            self._conn = None
        conn.close()

    def _claim(self) -> bool:
        # The server is gone: serve our mapping (the same file) or watch the new server.
        try:
            found = self._bind_or_connect()
        except OSError:
            return False
        if found is not None:
            conn, fd = found
            os.close(fd)  # we keep our mapping of the same records
            with self._lock:
                self._conn = conn
        return not self._stopped.is_set()

    def stop(self) -> None:
        """Stop serving or watching (wakes the thread, which closes everything)."""
        self._stopped.set()
        with self._lock:
            for sock in (self._listener, self._conn):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
        if self._thread is None:
            self.close()

    def close(self) -> None:
        """Close every socket and the descriptor (from the thread, or if it never ran)."""
        with self._lock:
            self.abandon()

    def abandon(self) -> None:
        """Close this process's sockets and descriptor without touching shared state."""
        self._stopped.set()
        for sock in (self._listener, self._conn, *self._clients):
            if sock is not None:
                sock.close()
        if self._selector is not None:
            self._selector.close()
        self._listener, self._conn, self._clients, self._selector = None, None, [], None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
