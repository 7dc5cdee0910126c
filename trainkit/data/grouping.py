"""Aspect-ratio grouping: each record's bucket, and the one implementation of grouping.

The batch plans, the loader workers of a stream dataset, ``AspectRatioGroupedDataset`` and
``GroupedBatchSampler`` all form their batches with :class:`Buckets`; bucket ids come from
the records' ``width`` and ``height`` and ``DATALOADER.ASPECT_RATIO_BINS``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from trainkit.config import ConfigError

__all__ = ["BucketOf", "Buckets", "aspect_ratio_bucket_ids", "record_aspect_ratios"]


def record_aspect_ratios(records: Iterable[dict[str, Any]] | Dataset) -> np.ndarray:
    """Return ``width / height`` of every record (of a map-style dataset: read one by one).

    Raises:
        ConfigError: A ``ValueError``: if a record lacks a positive ``width`` or ``height``.
    """
    if isinstance(records, Dataset):
        dataset = records
        records = (dataset[i] for i in range(len(dataset)))  # type: ignore[arg-type]
    ratios = []
    for i, record in enumerate(records):
        try:
            width, height = float(record["width"]), float(record["height"])
        except (KeyError, TypeError) as e:
            raise ConfigError(
                f"record {i} has no 'width'/'height' ({type(e).__name__}: {e}); aspect-ratio "
                "grouping needs them in every record. Add them, or set "
                "DATALOADER.ASPECT_RATIO_GROUPING False."
            ) from None
        if width <= 0 or height <= 0:
            raise ConfigError(
                f"record {i} has a non-positive size {width}x{height}; fix its 'width'/'height', "
                "or set DATALOADER.ASPECT_RATIO_GROUPING False."
            )
        ratios.append(width / height)
    return np.asarray(ratios, dtype=np.float64)


def aspect_ratio_bucket_ids(aspect_ratios: np.ndarray, bins: Sequence[float]) -> np.ndarray:
    """Return the bucket of each aspect ratio: ``i`` such that ``bins[i-1] <= ratio < bins[i]``.

    ``len(bins)`` increasing boundaries give ``len(bins) + 1`` buckets; ``[1.0]`` separates
    tall from wide images (a square one counts as wide).

    Raises:
        ConfigError: A ``ValueError``: if ``bins`` is empty, not strictly increasing, or not
            positive.
    """
    edges = np.asarray(list(bins), dtype=np.float64)
    if edges.size == 0 or (edges <= 0).any() or (np.diff(edges) <= 0).any():
        raise ConfigError(
            "DATALOADER.ASPECT_RATIO_BINS must be positive and strictly increasing, got "
            f"{list(bins)}; (1.0,) splits tall from wide images."
        )
    ratios = np.asarray(aspect_ratios, dtype=np.float64)
    return np.searchsorted(edges, ratios, side="right").astype(np.int16)


class BucketOf:
    """The aspect-ratio bucket of one record (picklable: stream datasets group in workers)."""

    def __init__(self, bins: Sequence[float]) -> None:
        """Take ``DATALOADER.ASPECT_RATIO_BINS`` (checked now)."""
        self.bins = list(bins)
        aspect_ratio_bucket_ids(np.ones(1), self.bins)

    @property
    def num_buckets(self) -> int:
        """How many buckets the bins make."""
        return len(self.bins) + 1

    def __call__(self, record: Any) -> int:
        return int(aspect_ratio_bucket_ids(record_aspect_ratios([record]), self.bins)[0])


class Buckets:
    """Items waiting for a batch, by bucket: the one implementation of grouping.

    Each item joins its bucket; a bucket that reaches ``batch_size`` is emptied and returned
    as a batch, so a batch never mixes buckets and follows the order of the items as closely
    as grouping allows. The waiting items (``waiting``: bucket -> items in arrival order) are
    the whole state.
    """

    def __init__(self, batch_size: int, waiting: dict[Hashable, list[Any]] | None = None) -> None:
        """Start with ``waiting`` (default: nothing) for batches of ``batch_size``."""
        self.batch_size = batch_size
        self.waiting: dict[Hashable, list[Any]] = {} if waiting is None else waiting

    @classmethod
    def from_lists(cls, batch_size: int, lists: Sequence[list[Any]]) -> Buckets:
        """Start from the waiting items of buckets ``0, 1, ...`` as a position stores them."""
        return cls(batch_size, {i: list(items) for i, items in enumerate(lists)})

    def to_lists(self, num_buckets: int) -> list[list[Any]]:
        """Return new lists of the waiting items of buckets ``0 .. num_buckets - 1``.

        The items themselves are shared, not copied: nothing changes an item once made.
        """
        return [list(self.waiting.get(i, ())) for i in range(num_buckets)]

    def add(self, bucket: Hashable, item: Any) -> list[Any] | None:
        """Put ``item`` into ``bucket``; return the bucket's batch if it is now full."""
        items = self.waiting.setdefault(bucket, [])
        items.append(item)
        if len(items) < self.batch_size:
            return None
        # Emptied before returning: a consumer that stops here never comes back for it.
        self.waiting[bucket] = []
        return items

    def rest(self) -> Iterator[list[Any]]:
        """Empty the buckets in bucket order, each non-empty one as a last, smaller batch."""
        for bucket in sorted(self.waiting):
            batch, self.waiting[bucket] = self.waiting[bucket], []
            if batch:
                yield batch
