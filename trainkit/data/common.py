"""Dataset wrappers: serialised record lists, failure-tolerant mapping, iterable adapters."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from trainkit.data._dataset_from_list import (
    DatasetFromList,
    set_default_dataset_from_list_serialize_method,
)
from trainkit.data._map_dataset import MapDataset
from trainkit.data.samplers._base import StreamSampler

logger = logging.getLogger(__name__)

__all__ = [
    "AspectRatioGroupedDataset",
    "DatasetFromList",
    "MapDataset",
    "ToIterableDataset",
    "set_default_dataset_from_list_serialize_method",
]


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

    @property
    def shards_across_workers(self) -> bool:
        """Whether each loader worker reads only its own share (the train loader then does
        not shard this stream again)."""
        return self.shard_sampler

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
