"""``DatasetFromList`` and its serialisation methods (exported by ``trainkit.data.common``).

The default method, :class:`_SharedSerializedList`, pickles the records into one flat
byte buffer plus an int64 array of end offsets, held in a sealed anonymous shared-memory
segment (:mod:`trainkit.data._shared_buffer`). Identical records built by several processes
of one machine end up in one segment (:mod:`trainkit.data._segment_share`): every rank
may call ``DatasetFromList(lst)`` itself, as detectron2 code does, and the machine still
holds one copy. ``set_default_dataset_from_list_serialize_method`` swaps the default, as in
detectron2.
"""

from __future__ import annotations

import copy as copy_module
import logging
import pickle
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from torch.utils.data import Dataset

from trainkit.data._segment_share import share_segment
from trainkit.data._shared_buffer import (
    SegmentHandle,
    SegmentWriter,
    SharedSegment,
    attach_segment,
)
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = ["DatasetFromList", "set_default_dataset_from_list_serialize_method"]

SerializeMethod = Callable[[Any], Any]


class _SharedSerializedList:
    """trainkit's default serialisation method: a read-only list of pickled records.

    Forked loader workers share the two buffers and never write to them, whereas reading
    a list of millions of Python objects bumps their reference counts and gradually copies
    every page into every worker ("copy-on-read"). Spawned workers map the same pages
    (pickling sends a handle, not the bytes). Other processes on the machine that build the
    same records map this segment too and free their own. Each item is a fresh unpickled
    record, so callers may modify what they get.
    """

    def __init__(self, lst: Iterable[Any]) -> None:
        """Serialise ``lst`` (any iterable: records are consumed one by one)."""
        self._set_segment(share_segment(_serialize_records(lst)))

    @classmethod
    def from_segment(cls, segment: SharedSegment) -> _SharedSerializedList:
        """Wrap an existing segment of records."""
        obj = cls.__new__(cls)
        obj._set_segment(segment)
        return obj

    def _set_segment(self, segment: SharedSegment) -> None:
        self._segment = segment
        self._buffer = segment.data
        self._ends = segment.ends

    @property
    def segment_identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the memory file (``None`` if private memory)."""
        return self._segment.identity

    def __getstate__(self) -> dict[str, Any]:
        # The numpy views would be pickled by value; the segment pickles as a handle.
        return {"segment": self._segment}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._set_segment(state["segment"])

    def __len__(self) -> int:
        return int(self._ends.size)

    def __getitem__(self, idx: int) -> Any:
        idx = range(len(self))[idx]  # negative indices and bounds checks, like a list
        start = int(self._ends[idx - 1]) if idx > 0 else 0
        return pickle.loads(memoryview(self._buffer[start : int(self._ends[idx])]))

    def __repr__(self) -> str:
        mib = self._segment.nbytes / 2**20
        return f"<{type(self).__name__}: {len(self)} records, {mib:.2f} MiB>"


_default_method: SerializeMethod = _SharedSerializedList


class _RestoreDefaultMethod:
    """Returned by the setter: as a context manager, restores the previous default on exit."""

    def __init__(self, previous: SerializeMethod) -> None:
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        global _default_method
        _default_method = self._previous


def set_default_dataset_from_list_serialize_method(
    new: SerializeMethod,
) -> _RestoreDefaultMethod:
    """Make ``new`` what ``DatasetFromList(lst, serialize=True)`` applies to ``lst``.

    Use it as a context manager (as in detectron2) to change the default only inside the
    ``with`` block; a plain call changes it for the rest of the process. ``new`` takes the
    list and returns a list-like object (``len`` and indexing); the catalog path
    (``DatasetFromList.from_local_leader``) then calls ``new`` on every rank instead of
    sharing one copy per machine. Set it the same way on every rank.

    Args:
        new: the serialisation method or class.

    Returns:
        A context manager that restores the previous default on exit.

    Raises:
        TypeError: If ``new`` is not callable.
    """
    global _default_method
    if not callable(new):
        raise TypeError(
            f"set_default_dataset_from_list_serialize_method needs a callable that takes the "
            f"list of records, got {new!r} ({type(new).__name__})"
        )
    previous, _default_method = _default_method, new
    return _RestoreDefaultMethod(previous)


class DatasetFromList(Dataset):
    """A map-style dataset over a list of records.

    With ``serialize=True`` the records go through the default serialisation method:
    trainkit's keeps them pickled in shared memory, one copy per machine however many
    ranks build the same list, shared with every loader worker (forked or spawned); every
    ``__getitem__`` returns a fresh copy. :meth:`from_local_leader` builds the same without
    loading the records on more than one rank per machine.
    """

    def __init__(
        self,
        lst: Iterable[Any],
        copy: bool = True,
        serialize: bool | SerializeMethod = True,
    ) -> None:
        """Wrap ``lst``.

        Args:
            lst: the records (with the default serialisation any iterable: records are
                consumed one by one).
            copy: without serialisation, return a deep copy of a record on each access.
            serialize: ``True`` applies the default serialisation method (see
                :func:`set_default_dataset_from_list_serialize_method`), ``False`` keeps
                the list as is, and a callable is the method applied to ``lst`` (items are
                then returned as the method's result gives them).

        Raises:
            TypeError: If ``serialize`` is neither a bool nor callable.
        """
        if not isinstance(serialize, bool) and not callable(serialize):
            raise TypeError(
                f"DatasetFromList(serialize={serialize!r}): expected True, False or a "
                f"callable that serialises the list, got {type(serialize).__name__}"
            )
        self._copy = copy
        self._serialize = serialize is not False
        if not self._serialize:
            self._lst: Any = lst if isinstance(lst, Sequence) else list(lst)
            return
        method = _default_method if serialize is True else serialize
        if method is not _SharedSerializedList:
            logger.info("Serialising the dataset with %r", method)
        self._lst = method(lst)

    @classmethod
    def from_local_leader(
        cls, load_fn: Callable[[], Iterable[Any]], *, copy: bool = True
    ) -> DatasetFromList:
        """Build one serialised copy per machine: only local rank 0 calls ``load_fn``.

        Local rank 0 streams the records returned by ``load_fn`` into a shared-memory
        segment; the other local ranks attach to that segment (same pages) and never
        materialise the records. With one process per machine, without a process group,
        or without a local process group (logged), every rank calls ``load_fn`` and the
        ranks of a machine still share one copy by content (as the constructor does). A
        rank that cannot attach (e.g. ``/proc`` is hidden) logs why and loads its own copy.
        With a custom default serialisation method, every rank calls ``load_fn`` and the
        method.

        Args:
            load_fn: returns the records (a list or any iterable, e.g. a generator, which
                is never materialised as a whole).
            copy: passed to the constructor (serialised records are fresh copies anyway).

        Returns:
            The dataset on every rank.

        Raises:
            RuntimeError: On every local rank when ``load_fn`` failed on local rank 0 (that
                rank re-raises the original error).

        Collective:
            Two ``all_gather`` calls over the local process group, made by every rank of
            the job (none when sharing is off). Every rank must call this together.
        """
        group, reason = _local_group()
        if group is None or _default_method is not _SharedSerializedList:
            if reason:
                logger.warning("Each rank loads the records itself: %s", reason)
            return cls(load_fn(), copy=copy)
        segment = _leader_segment(group, load_fn)
        dataset = cls.__new__(cls)
        dataset._copy, dataset._serialize = copy, True
        dataset._lst = _SharedSerializedList.from_segment(share_segment(segment))
        return dataset

    @property
    def segment_identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the shared-memory segment holding the records.

        Equal on every process that maps the same copy; ``None`` for records that are not
        in a shared segment (``serialize=False``, a custom method, private memory).
        """
        if isinstance(self._lst, _SharedSerializedList):
            return self._lst.segment_identity
        return None

    def __len__(self) -> int:
        return len(self._lst)

    def __getitem__(self, idx: int) -> Any:
        if self._copy and not self._serialize:
            return copy_module.deepcopy(self._lst[idx])
        return self._lst[idx]


def _leader_segment(group: Any, load_fn: Callable[[], Iterable[Any]]) -> SharedSegment:
    """Local rank 0 serialises and offers its segment; the others attach (2 all_gathers)."""
    is_leader = comm.get_local_rank() == 0
    segment: SharedSegment | None = None
    offer: dict[str, Any] | None = None
    error: BaseException | None = None
    if is_leader:
        try:
            segment = _serialize_records(load_fn())
            offer = {"handle": segment.handle(), "error": None}
        except Exception as e:  # reported to the other ranks so that nobody hangs
            error = e
            offer = {"handle": None, "error": f"{type(e).__name__}: {e}"}
    leader_offer = comm.all_gather(offer, group=group)[0]
    if leader_offer["error"] is not None:
        if error is not None:
            raise error
        raise RuntimeError(
            f"local rank 0 failed to load the dataset ({leader_offer['error']}); see its log"
        )
    fallback: str | None = None
    if not is_leader:
        try:
            segment, fallback = _attach_or_load(leader_offer["handle"], load_fn)
        except Exception as e:
            error = e
            fallback = f"failed: {type(e).__name__}: {e}"
    outcomes = comm.all_gather(fallback, group=group)
    if error is not None:
        raise error
    assert segment is not None
    if is_leader:
        private = {rank: why for rank, why in enumerate(outcomes) if why is not None}
        logger.info(
            "Serialised %d records into %.2f MiB of shared memory for %d local ranks%s",
            int(segment.ends.size),
            segment.nbytes / 2**20,
            len(outcomes) - len(private),
            f" (private copies on local ranks {private})" if private else "",
        )
    return segment


_WRITE_CHUNK_BYTES = 1 << 20  # pickles are written to the segment in chunks of this size


def _serialize_records(records: Iterable[Any]) -> SharedSegment:
    # Streams: at any time only one chunk of pickles is held privately, plus 8 bytes per
    # record for the ends; the pickles land directly in the segment's pages.
    writer = SegmentWriter("trainkit-dataset")
    try:
        ends = array("q")
        pending: list[bytes] = []
        pending_bytes = total = 0
        for record in records:
            blob = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
            total += len(blob)
            ends.append(total)
            pending.append(blob)
            pending_bytes += len(blob)
            if pending_bytes >= _WRITE_CHUNK_BYTES:
                writer.write(b"".join(pending))
                pending, pending_bytes = [], 0
        if pending:
            writer.write(b"".join(pending))
        segment = writer.finish(ends)
    except BaseException:
        writer.abort()
        raise
    logger.info("Serialised %d records into %.2f MiB", len(ends), segment.data.nbytes / 2**20)
    return segment


def _local_group() -> tuple[Any, str | None]:
    """Return (local process group, None), or (None, why records cannot be shared)."""
    if comm.get_world_size() == 1:
        return None, None
    try:
        local_size = comm.get_local_size()
    except RuntimeError as e:
        return None, str(e)
    if local_size == 1:
        return None, None  # one rank per machine: nothing to share between ranks
    return comm.get_local_process_group(), None


def _attach_or_load(
    handle: SegmentHandle | None, load_fn: Callable[[], Iterable[Any]]
) -> tuple[SharedSegment, str | None]:
    """Attach to the leader's segment; if impossible, load privately and say why."""
    if handle is None:
        reason = "local rank 0 could not create shared memory"
    else:
        try:
            return attach_segment(handle), None
        except (OSError, ValueError) as e:
            reason = f"cannot attach to local rank 0's segment ({type(e).__name__}: {e})"
    logger.warning("%s; loading a private copy of the records on this rank", reason)
    return _serialize_records(load_fn()), reason
