"""``DatasetFromList`` and its serialisation methods (exported by ``trainkit.data.common``).

The default, :class:`_SharedSerializedList`, keeps one copy of the records per machine;
``set_default_dataset_from_list_serialize_method`` swaps it, as in detectron2.
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import logging
import pickle
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from trainkit.data.records.segment_sharing import share_segment
from trainkit.data.records.shared_segments import SegmentWriter, SharedSegment

logger = logging.getLogger(__name__)

__all__ = ["DatasetFromList", "set_default_dataset_from_list_serialize_method"]

SerializeMethod = Callable[[Any], Any]


class _SharedSerializedList:
    """trainkit's default serialisation method: a read-only list of pickled records.

    The records lie in one sealed, anonymous shared-memory segment
    (:mod:`~trainkit.data.records.shared_segments`) whose pages forked loader workers share
    and never write to (a list of Python objects would be copied into every worker as its
    reference counts change); spawned workers and the machine's other builders of the same
    records map the same pages (:mod:`~trainkit.data.records.segment_sharing`). Each item is
    a fresh unpickled record, safe to modify.
    """

    def __init__(self, lst: Iterable[Any]) -> None:
        """Serialise ``lst`` (any iterable: records are consumed one by one)."""
        # The only attribute: pickled, the segment travels as a handle (numpy views of it
        # would be pickled by value).
        self._segment = share_segment(_serialize_records(lst))

    @property
    def _buffer(self) -> np.ndarray:
        return self._segment.data

    @property
    def _ends(self) -> np.ndarray:
        return self._segment.ends

    @property
    def segment_identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the memory file (``None`` if private memory)."""
        return self._segment.identity

    def __len__(self) -> int:
        return int(self._segment.ends.size)

    def __getitem__(self, idx: int) -> Any:
        # SharedSegment.record's slice, written out here: every record a loader reads takes
        # this path, which is kept to as few modules as it can (tests/data/test_data_path.py).
        ends = self._segment.ends
        idx = range(ends.size)[idx]  # negative indices and bounds checks, like a list
        start = int(ends[idx - 1]) if idx > 0 else 0
        return pickle.loads(memoryview(self._segment.data[start : int(ends[idx])]))

    def __repr__(self) -> str:
        mib = self._segment.nbytes / 2**20
        return f"<{type(self).__name__}: {len(self)} records, {mib:.2f} MiB>"


_default_method: SerializeMethod = _SharedSerializedList


def _use_method(method: SerializeMethod) -> None:
    global _default_method
    _default_method = method


def set_default_dataset_from_list_serialize_method(new: SerializeMethod) -> contextlib.ExitStack:
    """Make ``new`` what ``DatasetFromList(lst, serialize=True)`` applies to ``lst``.

    As a context manager (as in detectron2) it changes the default inside the ``with`` block
    only; a plain call changes it for the rest of the process. Set it the same way on every
    rank: the catalog path then applies ``new`` on every rank instead of sharing one copy.

    Args:
        new: the serialisation method or class: list -> list-like object (``len``, indexing).

    Returns:
        A context manager that restores the previous default on exit.

    Raises:
        TypeError: If ``new`` is not callable.
    """
    if not callable(new):
        raise TypeError(
            f"set_default_dataset_from_list_serialize_method needs a callable that takes the "
            f"list of records, got {new!r} ({type(new).__name__})"
        )
    restore = contextlib.ExitStack()
    restore.callback(_use_method, _default_method)
    _use_method(new)
    return restore


class DatasetFromList(Dataset):
    """A map-style dataset over a list of records.

    With ``serialize=True`` the records go through the default serialisation method: trainkit's
    keeps them pickled in shared memory, one copy per machine (see :class:`_SharedSerializedList`).
    """

    def __init__(
        self, lst: Iterable[Any], copy: bool = True, serialize: bool | SerializeMethod = True
    ) -> None:
        """Wrap ``lst``.

        Args:
            lst: the records (with the default serialisation, any iterable, consumed one by one).
            copy: without serialisation, return a deep copy of a record on each access.
            serialize: ``True``: the default serialisation method; ``False``: the list as is; a
                callable: the method applied to ``lst`` (items as its result gives them).

        Raises:
            TypeError: If ``serialize`` is neither a bool nor callable.
        """
        if not isinstance(serialize, bool) and not callable(serialize):
            raise TypeError(
                f"DatasetFromList(serialize={serialize!r}): expected True, False or a "
                f"callable that serialises the list, got {type(serialize).__name__}"
            )
        self._copy, self._serialize = copy, serialize is not False
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
        """Build the machine's one serialised copy from the records ``load_fn`` returns.

        Kept for earlier trainkit code, where only local rank 0 called ``load_fn``: now every
        rank calls it (it may return any iterable) and the constructor shares one copy per
        machine by content (:mod:`trainkit.data.records.segment_sharing`).
        """
        return cls(load_fn(), copy=copy)

    @property
    def segment_identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the records' shared segment, alike where mapped (or ``None``)."""
        return self._lst.segment_identity if isinstance(self._lst, _SharedSerializedList) else None

    def __len__(self) -> int:
        return len(self._lst)

    def __getitem__(self, idx: int) -> Any:
        if self._copy and not self._serialize:
            return copy_module.deepcopy(self._lst[idx])
        return self._lst[idx]


# Pickles are written to the segment in chunks of this size. Small: every rank serialises
# the records it loads, and the allocator keeps what the small pickles of a chunk used (with
# 1 MiB chunks the catalog path held ~1.5 MiB more per machine than it shares).
_WRITE_CHUNK_BYTES = 1 << 18


def _serialize_records(records: Iterable[Any]) -> SharedSegment:
    # One record at a time: only one chunk of pickles is held privately, plus 8 bytes per
    # record for the ends; the pickles land directly in the segment's pages.
    with SegmentWriter("trainkit-dataset") as writer:
        ends = array("q")
        pending: list[bytes] = []
        total = written = 0
        for record in records:
            blob = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
            total += len(blob)
            ends.append(total)
            pending.append(blob)
            if total - written >= _WRITE_CHUNK_BYTES:
                writer.write(b"".join(pending))
                pending, written = [], total
        if pending:
            writer.write(b"".join(pending))
        segment = writer.finish(ends)
    logger.info("Serialised %d records into %.2f MiB", len(ends), segment.data.nbytes / 2**20)
    return segment
