"""detectron2's dataset wrappers: record lists, failure-tolerant mapping, iterable adapters.

``DatasetFromList`` lives in :mod:`trainkit.data.records.dataset_from_list`, the mapping itself in
:mod:`trainkit.data.mapping.record_mapper`, grouping in :mod:`trainkit.data.plans.grouping`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from trainkit.data.mapping.record_mapper import RecordMapper, as_record_mapper
from trainkit.data.plans.global_stream import GlobalStreamSampler
from trainkit.data.plans.grouping import Buckets
from trainkit.data.records.dataset_from_list import (
    DatasetFromList,
    set_default_dataset_from_list_serialize_method,
)

__all__ = [
    "AspectRatioGroupedDataset",
    "DatasetFromList",
    "MapDataset",
    "ToIterableDataset",
    "records_and_mapper",
    "set_default_dataset_from_list_serialize_method",
]


class ToIterableDataset(IterableDataset):
    """Turn a map-style dataset and a sampler into an iterable dataset.

    With ``shard_sampler=True`` each loader worker yields only its chunks of the sampler's
    indices (chunk ``j`` of ``shard_chunk_size`` indices goes to worker ``j % num_workers``),
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
        """Wrap ``dataset`` (map-style) and ``sampler`` (its indices, sharded across ranks)."""
        if isinstance(dataset, IterableDataset):
            raise TypeError("ToIterableDataset needs a map-style dataset, got an IterableDataset")
        if shard_chunk_size < 1:
            raise ValueError(f"shard_chunk_size must be >= 1, got {shard_chunk_size}")
        self.dataset, self.sampler = dataset, sampler
        self.shard_sampler, self.shard_chunk_size = shard_sampler, shard_chunk_size

    @property
    def shards_across_workers(self) -> bool:
        """Whether each loader worker reads only its share (the train loader then does not)."""
        return self.shard_sampler

    def _indices(self) -> Iterable[int]:
        info = get_worker_info()
        if not self.shard_sampler or info is None or info.num_workers == 1:
            return self.sampler
        worker, num_workers, size = info.id, info.num_workers, self.shard_chunk_size
        if isinstance(self.sampler, GlobalStreamSampler):
            return self.sampler.iter_worker_share(worker, num_workers, size)
        indices = iter(self.sampler)
        chunks = iter(lambda: list(itertools.islice(indices, size)), [])
        return (i for j, chunk in enumerate(chunks) if j % num_workers == worker for i in chunk)

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
        """Batch ``dataset``'s dicts (with ``"width"`` and ``"height"``) by ``batch_size``."""
        self.dataset, self.batch_size = dataset, batch_size
        self._buckets = Buckets(batch_size, {0: [], 1: []})

    def __iter__(self) -> Iterator[list[dict[str, Any]]]:
        for sample in self.dataset:
            batch = self._buckets.add(0 if sample["width"] > sample["height"] else 1, sample)
            if batch is not None:
                yield batch


class _Mapped:
    """What ``MapDataset`` and its iterable twin share: the records and their ``RecordMapper``."""

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
            dataset: a map-style dataset (or list) of records, or an ``IterableDataset``.
            map_func: record -> sample, or ``None`` to skip it (a ``RecordMapper`` used as is).
            max_consecutive_failures: ``DATALOADER.MAX_CONSECUTIVE_FAILURES``.
            name: dataset name used in messages (default: the dataset's class name).

        Raises:
            ConfigError: A ``ValueError``: if ``max_consecutive_failures`` is not positive.
        """
        self.dataset = dataset
        self.mapper = as_record_mapper(
            map_func,
            max_consecutive_failures=max_consecutive_failures,
            name=name or type(dataset).__name__,
        )

    def __len__(self) -> int:
        # Of an iterable: an upper bound when elements fail, as in detectron2 (TypeError if
        # unsized).
        return len(self.dataset)  # type: ignore[arg-type]

    @property
    def num_failures(self) -> int:
        """Records that failed in this process so far (each loader worker counts its own)."""
        return self.mapper.num_failures


class MapDataset(_Mapped, Dataset):
    """Apply ``map_func`` to each record of a dataset, skipping records that fail.

    A dataset view over a :class:`~trainkit.data.mapping.record_mapper.RecordMapper` (what
    fails, how it is logged and replaced). Given an ``IterableDataset`` the result is an
    iterable dataset (not of this class, as in detectron2) that maps each element and skips
    those that fail. On a map-style dataset a mapper may call ``trainkit.data.sample_rng()``,
    keyed by the global stream position in the train loader, by ``i`` (seed 0) in a plain
    ``dataset[i]``; an iterable has no global position, so its mapper cannot.
    """

    def __new__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> Any:
        # Unpickling calls cls.__new__(cls) without arguments: dataset is None then.
        if isinstance(dataset, IterableDataset):
            return _MapIterableDataset(dataset, *args, **kwargs)
        return super().__new__(cls)

    @property
    def _map_func(self) -> Callable[[Any], Any]:
        # detectron2's attribute name for the mapping function.
        return self.mapper.map_func

    def __getitem__(self, idx: int) -> Any:
        return self.map_at(idx, seed=0, position=idx)

    def map_at(self, idx: int, *, seed: int, position: int, batch: int | None = None) -> Any:
        """Map record ``idx`` for the sample at global ``position`` of stream ``seed``.

        ``batch`` keys ``batch_rng()``; failures are replaced by :meth:`RecordMapper.map_replacing`.
        """
        element, _ = self.mapper.map_replacing(
            self.dataset, idx, seed=seed, position=position, batch=batch
        )
        return element


class _MapIterableDataset(_Mapped, IterableDataset):
    """What ``MapDataset(iterable_dataset, map_func)`` builds: maps elements, skips failures."""

    def __iter__(self) -> Iterator[Any]:
        failures_in_a_row = 0
        for ordinal, element in enumerate(self.dataset):
            result = self.mapper.map_or_skip(element, f"element {ordinal}")
            failures_in_a_row = 0 if result is not None else failures_in_a_row + 1
            self.mapper.check_in_a_row(failures_in_a_row, f"element {ordinal}", element)
            if result is not None:
                yield result


def records_and_mapper(
    dataset: Any, mapper: Callable[[Any], Any] | None = None
) -> tuple[Any, RecordMapper | None]:
    """Take a dataset apart, once: ``(unmapped records, their RecordMapper or None)``.

    A list becomes a :class:`DatasetFromList`. Given ``mapper``, ``dataset`` is the records;
    else a ``MapDataset`` (or its iterable twin) gives its records and mapper, anything else none.
    """
    dataset = DatasetFromList(dataset, copy=False) if isinstance(dataset, list) else dataset
    if mapper is not None:
        return dataset, as_record_mapper(mapper)
    own = getattr(dataset, "mapper", None)
    if isinstance(dataset, (MapDataset, IterableDataset)) and isinstance(own, RecordMapper):
        return dataset.dataset, own  # MapDataset, or its iterable twin
    return dataset, None
