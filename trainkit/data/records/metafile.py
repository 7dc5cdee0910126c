"""One-record-per-line metadata files read on demand through a memory-mapped line index.

The index of ``data.jsonl`` is a small binary file: a 64-byte header (magic, version, the
metadata file's size and ``st_mtime_ns`` it was built from, the number of records), then
``num_records + 1`` int64 byte offsets (the start of every non-blank line, then the file
size). It is built once by a vectorised newline scan over ``mmap`` chunks, written to a
temporary file and ``os.replace``-d into place (readers never see half an index; a lock file
makes builders on several ranks wait for one another), and rebuilt when the metadata file's
size or mtime changes. :class:`MetaFileDataset` is the one reader of a metadata file;
:mod:`trainkit.data.records.rank_dataset` splits a file into each rank's shares over it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import struct
import time
import weakref
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from trainkit.utils.errors import MissingFileError

logger = logging.getLogger(__name__)

__all__ = ["LineIndex", "MetaFileDataset", "build_line_index", "index_path_for"]

_MAGIC = 0x31584449544B5254  # "TRKTIDX1"
_VERSION = 1
_HEADER_INT64 = 8  # magic, version, file size, mtime_ns, num_records, 3 reserved
_HEADER_BYTES = _HEADER_INT64 * 8
_SCAN_CHUNK = 64 << 20  # bytes per vectorised newline scan
_GATHER_BLOCK = 1 << 14  # records copied per numpy gather (~16 B of temporaries per byte)
_NEWLINE, _CR = 10, 13
_TWO_INT64 = struct.Struct("=qq")  # native byte order, as the index is written


def _file_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def index_path_for(meta_file: str | os.PathLike, index_dir: str | os.PathLike | None) -> Path:
    """Return where the index of ``meta_file`` lives.

    Next to the file (``<name>.idx``) by default; with ``index_dir``, inside it under a name
    that also holds a hash of the absolute path (two ``train.jsonl`` in different folders
    do not collide). A file in a read-only folder falls back to ``~/.cache/trainkit/index``.
    """
    meta = Path(meta_file).resolve()
    if index_dir is None:
        if os.access(meta.parent, os.W_OK):
            return meta.with_name(meta.name + ".idx")
        index_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        index_dir = index_dir / "trainkit" / "index"
        logger.info("%s is read-only; keeping the index of %s in %s", meta.parent, meta, index_dir)
    digest = hashlib.sha1(str(meta).encode()).hexdigest()[:12]
    return Path(index_dir) / f"{meta.name}.{digest}.idx"


def _scan_line_starts(meta_file: str, size: int, progress: bool) -> Iterator[np.ndarray]:
    """Yield the starts of non-blank lines, chunk by chunk (sorted, int64)."""
    if size == 0:
        return
    from tqdm import tqdm  # imported here: only index builds need it

    desc = f"indexing {meta_file}"
    bar = tqdm(total=size, unit="B", unit_scale=True, desc=desc, disable=not progress)
    with open(meta_file, "rb") as f, bar:
        # Not closed explicitly: numpy views of it may outlive this loop; GC unmaps it.
        data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
        prev_newline = True  # the file starts a line
        for start in range(0, size, _SCAN_CHUNK):
            chunk = data[start : start + _SCAN_CHUNK]
            starts = np.flatnonzero(chunk == _NEWLINE) + (start + 1)
            if prev_newline:
                starts = np.concatenate([[start], starts])
            prev_newline = bool(chunk[-1] == _NEWLINE)
            # A newline ending the chunk starts the next chunk's first line: count it there.
            starts = starts[starts < start + chunk.size]
            # Blank lines ("\n" or "\r\n") are no records: drop lines that start with them.
            first = data[starts]
            blank, cr = first == _NEWLINE, first == _CR
            if cr.any():
                blank[cr] = data[np.minimum(starts[cr] + 1, size - 1)] == _NEWLINE
            yield starts[~blank].astype(np.int64)
            bar.update(chunk.size)


def build_line_index(
    meta_file: str | os.PathLike, index_path: str | os.PathLike, *, progress: bool = True
) -> None:
    """Write ``meta_file``'s line index to ``index_path`` atomically (``progress``: a tqdm bar)."""
    meta_file, index_path = str(meta_file), Path(index_path)
    size, mtime_ns = _file_key(meta_file)
    index_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = index_path.with_name(f"{index_path.name}.tmp.{os.getpid()}")
    began = time.perf_counter()
    num_records = 0
    try:
        with open(tmp, "wb") as out:
            out.write(bytes(_HEADER_BYTES))  # patched once the count is known
            for starts in _scan_line_starts(meta_file, size, progress):
                out.write(starts.tobytes())
                num_records += int(starts.size)
            out.write(np.array([size], dtype=np.int64).tobytes())
            header = np.zeros(_HEADER_INT64, dtype=np.int64)
            header[:5] = [_MAGIC, _VERSION, size, mtime_ns, num_records]
            out.seek(0)
            out.write(header.tobytes())
            out.flush()
            os.fsync(out.fileno())
        if _file_key(meta_file) != (size, mtime_ns):
            raise RuntimeError(f"{meta_file} changed while it was being indexed; try again")
        os.replace(tmp, index_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    seconds, mib = time.perf_counter() - began, size / 2**20
    speed = mib / max(seconds, 1e-9)
    logger.info(
        "Indexed %d records of %s (%.1f MiB) in %.2f s (%.0f MiB/s) into %s",
        *(num_records, meta_file, mib, seconds, speed, index_path),
    )


class LineIndex:
    """The memory-mapped byte offsets of a metadata file's records (built if missing/stale).

    Attributes:
        offsets: int64 memmap of ``len(self) + 1`` offsets; record ``i`` is
            ``file[offsets[i]:offsets[i + 1]]`` (trailing newlines included).
        path: the index file.
    """

    def __init__(
        self,
        meta_file: str | os.PathLike,
        *,
        index_dir: str | os.PathLike | None = None,
        progress: bool = True,
    ) -> None:
        """Open (and if needed build) the index of ``meta_file``.

        Raises:
            MissingFileError: A ``FileNotFoundError``: if ``meta_file`` does not exist.
        """
        self.meta_file = str(meta_file)
        if not os.path.isfile(self.meta_file):
            raise MissingFileError(
                f"metadata file {self.meta_file} does not exist; check the path given to the "
                "dataset's registration."
            )
        self.path = index_path_for(self.meta_file, index_dir)
        self.key = _file_key(self.meta_file)
        if not self._is_current():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # One builder at a time (ranks, or jobs sharing the folder); the others wait
            # and then find the fresh index.
            with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not self._is_current():
                    build_line_index(self.meta_file, self.path, progress=progress)
        num_records = self._read_header()[4]
        self.offsets = np.memmap(
            self.path, dtype=np.int64, mode="r", offset=_HEADER_BYTES, shape=(num_records + 1,)
        )

    def _read_header(self) -> list[int]:
        with open(self.path, "rb") as f:
            return np.frombuffer(f.read(_HEADER_BYTES), dtype=np.int64).tolist()

    def _is_current(self) -> bool:
        try:
            magic, version, size, mtime_ns, num_records = self._read_header()[:5]
            index_bytes = self.path.stat().st_size
        except (OSError, ValueError):
            return False
        return (
            magic == _MAGIC
            and version == _VERSION
            and (size, mtime_ns) == self.key
            and index_bytes == _HEADER_BYTES + 8 * (num_records + 1)
        )

    def __len__(self) -> int:
        return int(self.offsets.size) - 1


class MetaFileDataset(Dataset):
    """A map-style dataset over a one-record-per-line file (JSON lines by default).

    Record ``i`` is read on demand with two ``pread`` calls (its :class:`LineIndex` entry,
    then its bytes) from the page cache every process on the machine shares: private memory
    is O(1) in the records, and any index costs the same, so use it with
    :class:`~trainkit.data.samplers.TrainingSampler` for a true global shuffle.
    :meth:`copy_lines` copies many records' lines at once (how a ``RankDataset`` loads its
    share). Blank lines are skipped; each access parses a fresh record.

    Register it like a list-returning function; the train loader then opens it on every rank
    instead of serialising records. Pickling (spawned loader workers) sends the paths; the
    receiver reopens both files and checks that the metadata file is unchanged::

        DatasetCatalog.register("big_train", lambda: MetaFileDataset("/data/train.jsonl"))
    """

    def __init__(
        self,
        meta_file: str | os.PathLike,
        *,
        parse: Callable[[str], Any] = json.loads,
        index_dir: str | os.PathLike | None = None,
    ) -> None:
        """Open ``meta_file``, building its index on first use or after it changed.

        Args:
            meta_file: one record per line, UTF-8.
            parse: line (str, without the newline) -> record.
            index_dir: folder for the index (default: next to ``meta_file``).

        Raises:
            MissingFileError: A ``FileNotFoundError``: if ``meta_file`` does not exist.
        """
        self._parse, self._index_dir = parse, index_dir
        self._open(LineIndex(meta_file, index_dir=index_dir))

    def _open(self, index: LineIndex) -> None:
        self._index, self._num_records = index, len(index)
        # pread, not a mapping: the pages of a file only this process maps count as its own
        # memory (RSS grows to the file size under random access); pread reads the shared
        # page cache. A syscall costs ~1 us, far below parsing a record.
        self._index_fd = os.open(index.path, os.O_RDONLY | os.O_CLOEXEC)
        self._meta_fd = os.open(index.meta_file, os.O_RDONLY | os.O_CLOEXEC)
        for fd in (self._index_fd, self._meta_fd):
            weakref.finalize(self, os.close, fd)

    @property
    def meta_file(self) -> str:
        """The metadata file."""
        return self._index.meta_file

    @property
    def index_path(self) -> Path:
        """The index file."""
        return self._index.path

    def __len__(self) -> int:
        return self._num_records

    def line(self, idx: int) -> bytes:
        """Return the raw bytes of record ``idx`` (without trailing newlines)."""
        idx = range(self._num_records)[idx]  # negative indices and bounds checks, like a list
        entry = os.pread(self._index_fd, 16, _HEADER_BYTES + 8 * idx)
        start, end = _TWO_INT64.unpack(entry)
        return os.pread(self._meta_fd, end - start, start).rstrip(b"\r\n")

    def __getitem__(self, idx: int) -> Any:
        return self._parse(self.line(idx).decode("utf-8"))

    def parse(self, line: bytes) -> Any:
        """Parse one record's raw line (trailing newlines are dropped first)."""
        return self._parse(line.rstrip(b"\r\n").decode("utf-8"))

    def copy_lines(self, indices: np.ndarray, write: Callable[[np.ndarray], Any]) -> array:
        """Pass the raw lines of records ``indices`` to ``write`` in order, gathered block by block.

        Args:
            indices: record indices (int64), best sorted: the reads then move forward.
            write: receives uint8 arrays, the lines one after another (newlines kept).

        Returns:
            The int64 end offset of each line within what ``write`` received.
        """
        offsets, ends, total = self._index.offsets, array("q"), 0
        with open(self.meta_file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            file_bytes = np.frombuffer(
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b"", dtype=np.uint8
            )
        for lo in range(0, indices.size, _GATHER_BLOCK):
            block = indices[lo : lo + _GATHER_BLOCK]
            starts, stops = offsets[block], offsets[block + 1]
            lengths = stops - starts
            block_ends = np.cumsum(lengths)
            # Byte j of the block's output comes from file byte j + (start - dst_start) of
            # its record: one repeat + one arange instead of a Python loop.
            shift = np.repeat(starts - (block_ends - lengths), lengths)
            write(file_bytes[shift + np.arange(shift.size, dtype=np.int64)])
            ends.extend((block_ends + total).tolist())
            total += int(block_ends[-1]) if block_ends.size else 0
        return ends

    def __getstate__(self) -> dict[str, Any]:
        return {
            "meta_file": self.meta_file,
            "parse": self._parse,
            "index_dir": self._index_dir,
            "key": self._index.key,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._parse, self._index_dir = state["parse"], state["index_dir"]
        if _file_key(state["meta_file"]) != tuple(state["key"]):
            raise RuntimeError(
                f"{state['meta_file']} changed since this dataset was opened; its records "
                "would no longer match the sampler's indices. Rebuild the dataset."
            )
        self._open(LineIndex(state["meta_file"], index_dir=self._index_dir, progress=False))
