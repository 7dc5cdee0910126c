"""Dataset wrappers: serialised record lists, failure-tolerant mapping, iterable adapters."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from trainkit.data._dataset_from_list import (
    DatasetFromList,
    set_default_dataset_from_list_serialize_method,
)
from trainkit.data._sample_context import sample_context
from trainkit.data.samplers._base import StreamSampler

logger = logging.getLogger(__name__)

__all__ = [
    "AspectRatioGroupedDataset",
    "DatasetFromList",
    "MapDataset",
    "ToIterableDataset",
    "set_default_dataset_from_list_serialize_method",
]

_RETRY_SALT = 0x7E7A11  # keys the choice of replacement records


def _retry_index(seed: int, key: int, attempt: int, size: int) -> int:
    # A pure function of (seed, failing sample, attempt): the replacement is the same
    # whichever worker or restart hits the failure, so the stream stays reproducible.
    seq = np.random.SeedSequence([seed, key, attempt, _RETRY_SALT])
    return int(seq.generate_state(1, dtype=np.uint64)[0] % size)


def _short_repr(obj: Any, limit: int = 200) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class MapDataset(Dataset):
    """Apply ``map_func`` to each record of a map-style dataset, skipping records that fail.

    A record fails when ``map_func`` returns ``None`` or raises (e.g. ``OSError`` for an
    unreadable file). The failure is logged with the index and a running count, and a
    replacement index is tried, chosen deterministically from (seed, sample, attempt).
    After ``max_consecutive_failures`` failures in a row for one sample it raises
    ``RuntimeError`` naming the dataset and the last failing record.

    Every ``map_func`` call runs inside a sample context, so ``trainkit.data.sample_rng()``
    works in the mapper: the train loader keys it by the global stream position; a plain
    ``dataset[i]`` keys it by ``i`` (seed 0).
    """

    def __init__(
        self,
        dataset: Dataset | Sequence[Any],
        map_func: Callable[[Any], Any],
        *,
        max_consecutive_failures: int = 20,
        name: str | None = None,
    ) -> None:
        """Wrap ``dataset``.

        Args:
            dataset: a map-style dataset (or list) of records.
            map_func: record -> mapped sample, or ``None`` to skip the record.
            max_consecutive_failures: failures in a row before giving up
                (``DATALOADER.MAX_CONSECUTIVE_FAILURES``).
            name: dataset name used in messages (default: the dataset's class name).
        """
        if max_consecutive_failures < 1:
            raise ValueError(
                f"DATALOADER.MAX_CONSECUTIVE_FAILURES must be >= 1, got {max_consecutive_failures}"
            )
        self.dataset = dataset
        self._map_func = map_func
        self._max_failures = max_consecutive_failures
        self._name = name or type(dataset).__name__
        self._num_failures_total = 0  # per process: each worker counts its own

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def num_failures(self) -> int:
        """Records that failed in this process so far (each loader worker counts its own)."""
        return self._num_failures_total

    def __getitem__(self, idx: int) -> Any:
        return self.map_at(idx, seed=0, position=idx)

    def map_at(self, idx: int, *, seed: int, position: int, batch: int | None = None) -> Any:
        """Map record ``idx`` for the sample at global stream ``position`` of stream ``seed``.

        ``batch`` identifies the sample's batch for ``trainkit.data.batch_rng()``.

        Raises:
            RuntimeError: After ``max_consecutive_failures`` failed records in a row.
        """
        last_error: BaseException | None = None
        for attempt in range(self._max_failures):
            record = None
            try:
                record = self.dataset[idx]  # reading the record may fail too
                with sample_context(seed, position, batch):
                    result = self._map_func(record)
            except Exception as e:  # any mapper error counts as an unreadable record
                result, last_error = None, e
            if result is not None:
                return result
            self._num_failures_total += 1
            reason = (
                f"{type(last_error).__name__}: {last_error}"
                if last_error
                else "mapper returned None"
            )
            failed_idx = idx
            idx = _retry_index(seed, position, attempt, len(self.dataset))
            logger.warning(
                "Skipping record %d of %s %s (%s); trying record %d instead "
                "(%d consecutive failures, %d in this process)",
                failed_idx,
                self._name,
                _short_repr(record, 160),
                reason,
                idx,
                attempt + 1,
                self._num_failures_total,
            )
        raise RuntimeError(
            f"{self._max_failures} records of dataset {self._name!r} failed to load in a row; "
            f"the last was index {failed_idx}: {_short_repr(record)} ({reason}). Check the files "
            "and the mapper, or raise DATALOADER.MAX_CONSECUTIVE_FAILURES."
        ) from last_error


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
