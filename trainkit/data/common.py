"""Dataset wrappers: serialised record lists, failure-tolerant mapping, iterable adapters."""

from __future__ import annotations

import copy as copy_module
import itertools
import logging
import pickle
from array import array
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from trainkit.data._map_dataset import MapDataset
from trainkit.data._shared_buffer import (
    SegmentHandle,
    SegmentWriter,
    SharedSegment,
    attach_segment,
)
from trainkit.data.samplers._base import StreamSampler
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = ["AspectRatioGroupedDataset", "DatasetFromList", "MapDataset", "ToIterableDataset"]


class DatasetFromList(Dataset):
    """A map-style dataset over a list of records.

    With ``serialize=True`` the records are pickled into one flat uint8 buffer plus an int64
    array of end offsets. Forked loader workers then share these two buffers and never write
    to them, whereas reading from a list of millions of Python objects bumps their reference
    counts and gradually copies every page into every worker ("copy-on-read"). Each
    ``__getitem__`` unpickles a fresh record, so callers may modify what they get.

    The buffers live in an anonymous shared-memory segment (see
    :mod:`trainkit.data._shared_buffer`): spawned loader workers map the same pages instead
    of unpickling a copy, and :meth:`from_local_leader` builds one segment per machine that
    every local rank maps. The segment has no name in the file system, so nothing can leak;
    the kernel frees it with the last process that maps it, crashed or not.
    """

    def __init__(self, lst: Iterable[Any], copy: bool = True, serialize: bool = True) -> None:
        """Wrap ``lst``.

        Args:
            lst: the records (any iterable when serialising: they are consumed one by one).
            copy: without serialisation, return a deep copy of a record on each access.
            serialize: store the records serialised (recommended for loader workers).
        """
        self._copy = copy
        self._serialize = serialize
        if not serialize:
            self._lst = list(lst)
            return
        self._set_segment(_serialize_records(lst))

    @classmethod
    def from_local_leader(
        cls, load_fn: Callable[[], Iterable[Any]], *, copy: bool = True
    ) -> DatasetFromList:
        """Build one serialised copy per machine: only local rank 0 calls ``load_fn``.

        Local rank 0 streams the records returned by ``load_fn`` into a shared-memory
        segment; the other local ranks attach to that segment (same pages) and never
        materialise the records. With one process per machine, without a process group,
        or without a local process group (logged), every rank calls ``load_fn`` and keeps a
        private copy. A rank that cannot attach (e.g. ``/proc`` is hidden) logs why and
        loads its own copy.

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
        if group is None:
            if reason:
                logger.warning("Each rank keeps its own copy of the records: %s", reason)
            return cls(load_fn(), copy=copy)
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
        offers = comm.all_gather(offer, group=group)
        leader_offer = offers[0]
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
        dataset = cls.__new__(cls)
        dataset._copy, dataset._serialize = copy, True
        dataset._set_segment(segment)
        return dataset

    def _set_segment(self, segment: SharedSegment) -> None:
        self._segment = segment
        self._buffer = segment.data
        self._ends = segment.ends

    @property
    def segment_identity(self) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of the shared-memory segment holding the records.

        Equal on every process that maps the same copy; ``None`` for private records.
        """
        return self._segment.identity if self._serialize else None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # The numpy views would be pickled by value; the segment pickles as a handle.
        state.pop("_buffer", None)
        state.pop("_ends", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._serialize:
            self._set_segment(self._segment)

    def __len__(self) -> int:
        return int(self._ends.size) if self._serialize else len(self._lst)

    def __getitem__(self, idx: int) -> Any:
        if not self._serialize:
            return copy_module.deepcopy(self._lst[idx]) if self._copy else self._lst[idx]
        idx = range(len(self))[idx]  # negative indices and bounds checks, like a list
        start = int(self._ends[idx - 1]) if idx > 0 else 0
        return pickle.loads(memoryview(self._buffer[start : int(self._ends[idx])]))


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


def _worker_share(iterable: Iterable[Any], chunk_size: int) -> Iterator[Any]:
    info = get_worker_info()
    if info is None or info.num_workers == 1:
        yield from iterable
        return
    # Chunk j goes to worker j % num_workers: together the workers yield each item once.
    it = iter(iterable)
    for chunk_idx in itertools.count():
        chunk = list(itertools.islice(it, chunk_size))
        if not chunk:
            return
        if chunk_idx % info.num_workers == info.id:
            yield from chunk


class ToIterableDataset(IterableDataset):
    """Turn a map-style dataset and a sampler into an iterable dataset.

    With ``shard_sampler=True`` each loader worker yields only its chunks of the sampler's
    stream (chunk ``j`` of ``shard_chunk_size`` indices goes to worker ``j % num_workers``),
    so all workers together yield every index once. trainkit's own samplers compute a
    worker's share directly; other samplers are drawn in full and filtered.
    """

    def __init__(
        self,
        dataset: Dataset,
        sampler: Sampler | Iterable[int],
        shard_sampler: bool = True,
        shard_chunk_size: int = 1,
    ) -> None:
        """Wrap ``dataset``.

        Args:
            dataset: a map-style dataset.
            sampler: yields indices of ``dataset`` (already sharded across ranks).
            shard_sampler: split the stream across loader workers.
            shard_chunk_size: consecutive indices each worker takes at a time.
        """
        if isinstance(dataset, IterableDataset):
            raise TypeError("ToIterableDataset needs a map-style dataset, got an IterableDataset")
        if shard_chunk_size < 1:
            raise ValueError(f"shard_chunk_size must be >= 1, got {shard_chunk_size}")
        self.dataset = dataset
        self.sampler = sampler
        self.shard_sampler = shard_sampler
        self.shard_chunk_size = shard_chunk_size

    def _indices(self) -> Iterable[int]:
        info = get_worker_info()
        if not self.shard_sampler or info is None or info.num_workers == 1:
            return self.sampler
        if isinstance(self.sampler, StreamSampler):
            return self.sampler.iter_worker_share(info.id, info.num_workers, self.shard_chunk_size)
        return _worker_share(self.sampler, self.shard_chunk_size)

    def __iter__(self) -> Iterator[Any]:
        for idx in self._indices():
            yield self.dataset[idx]

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]  # finite samplers only, as in torch


class AspectRatioGroupedDataset(IterableDataset):
    """Batch an iterable of mapped dicts by orientation (``width > height`` or not).

    Kept for detectron2 compatibility. Every sample crosses the worker queue alone and is
    grouped in the main process, and two buckets barely reduce padding; the train loader
    instead groups *indices* into more buckets before loading (``ASPECT_RATIO_BINS``).
    """

    def __init__(self, dataset: Iterable[dict[str, Any]], batch_size: int) -> None:
        """Wrap ``dataset``.

        Args:
            dataset: yields dicts with ``"width"`` and ``"height"``.
            batch_size: samples per batch.
        """
        self.dataset = dataset
        self.batch_size = batch_size
        self._buckets: list[list[Any]] = [[], []]

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        for sample in self.dataset:
            bucket = self._buckets[0 if sample["width"] > sample["height"] else 1]
            bucket.append(sample)
            if len(bucket) == self.batch_size:
                batch = bucket[:]
                del bucket[:]  # clear before yielding: the consumer may stop here
                yield batch
