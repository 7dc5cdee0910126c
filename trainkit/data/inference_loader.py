"""``InferenceLoader``: one pass over a test set in which every record counts once.

In a training loader a record that fails to map is replaced by another (the batch keeps its
size and the stream its length). In evaluation that would count a record twice, so here a
failed record is skipped: its batch is one element shorter, a warning names it, and the
loader counts it (:attr:`InferenceLoader.num_skipped_records`, which ``inference_on_dataset``
reports). A batch whose records all fail is left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from trainkit.data.batch_transfer import pack_in_worker, unpack_batch
from trainkit.data.mapping import RecordMapper, sample_context

__all__ = ["InferenceLoader"]


class _SkippingRecords(Dataset):
    """Map records by index; a record that fails is reported and left out of its batch."""

    def __init__(self, records: Any, mapper: RecordMapper | None) -> None:
        self.records = records
        self.mapper = mapper

    def __len__(self) -> int:
        return len(self.records)

    def __getitems__(self, indices: list[int]) -> tuple[list[Any], int]:
        elements, skipped = [], 0
        for index in indices:
            record = self.records[index]
            if self.mapper is None:
                elements.append(record)
                continue
            # Keyed by the record's index: evaluation draws nothing random, but a mapper
            # written for training may call sample_rng().
            with sample_context(0, int(index)):
                element = self.mapper.map_or_skip(record, f"record {index}")
            if element is None:
                skipped += 1
            else:
                elements.append(element)
        return elements, skipped


class _CountingCollate:
    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, mapped: tuple[list[Any], int]) -> tuple[Any, int, int]:
        elements, skipped = mapped
        # Packed in a worker for the trip to this process (trainkit.data.batch_transfer).
        return pack_in_worker(self.collate_fn(elements)), skipped, len(elements)


class InferenceLoader(DataLoader):
    """A torch ``DataLoader`` over a sampler's indices that skips (never replaces) failures.

    Attributes:
        num_skipped_records: records that failed to map in the current pass (reset by each
            new iteration).
    """

    def __init__(
        self,
        records: Any,
        mapper: RecordMapper | None,
        *,
        sampler: Any,
        batch_size: int,
        collate_fn: Callable[[list[Any]], Any],
        **kwargs: Any,
    ) -> None:
        """Create the loader.

        Args:
            records: unmapped records (map-style).
            mapper: maps a record (``None``: records are used as they are).
            sampler: this rank's indices, e.g. ``InferenceSampler``.
            batch_size: indices per batch.
            collate_fn: list of mapped samples -> batch.
            **kwargs: other ``DataLoader`` arguments (``num_workers``, ...).
        """
        # A private generator: otherwise every pass draws its workers' base seed from the
        # global torch RNG, and evaluating during training would shift the training stream.
        kwargs.setdefault("generator", torch.Generator().manual_seed(0))
        super().__init__(
            _SkippingRecords(records, mapper),
            batch_size=batch_size,
            sampler=sampler,
            drop_last=False,
            collate_fn=_CountingCollate(collate_fn),
            **kwargs,
        )
        self.num_skipped_records = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.num_skipped_records = 0
        for batch, skipped, size in super().__iter__():
            self.num_skipped_records += skipped
            if size:
                yield unpack_batch(batch)
