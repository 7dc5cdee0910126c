"""Test loaders: one pass over a test set in which every record counts once.

``build_detection_test_loader`` (in detectron2's ``data.build``) builds an :class:`InferenceLoader`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from trainkit.config import CfgNode, ConfigError, configurable
from trainkit.data.catalog import joined_names, load_catalog_dataset
from trainkit.data.common import MapDataset, records_and_mapper
from trainkit.data.dataset_mapper import DatasetMapper
from trainkit.data.loading.loader import PackedCollate, trivial_batch_collator, unpack_batch
from trainkit.data.loading.loader_workers import loader_kwargs
from trainkit.data.mapping.record_mapper import RecordMapper, as_record_mapper, sample_context
from trainkit.data.samplers import InferenceSampler
from trainkit.data.train_config import check_num_workers

__all__ = ["InferenceLoader", "build_detection_test_loader", "build_test_loader"]

Mapper = Callable[[Any], Any]


class _SkippingRecords(Dataset):
    """Map records by index; a record that fails is reported and left out of its batch."""

    def __init__(self, records: Any, mapper: RecordMapper | None) -> None:
        self.records, self.mapper = records, mapper

    def __len__(self) -> int:
        return len(self.records)

    def __getitems__(self, indices: list[int]) -> tuple[list[Any], int, int]:
        elements = []
        for index in indices:
            record = self.records[index]
            if self.mapper is None:
                elements.append(record)
                continue
            # Keyed by the record's index: evaluation draws nothing random, but a mapper
            # written for training may call sample_rng().
            with sample_context(0, int(index)):
                element = self.mapper.map_or_skip(record, f"record {index}")
            if element is not None:
                elements.append(element)
        return elements, len(indices) - len(elements), len(elements)


class InferenceLoader(DataLoader):
    """A torch ``DataLoader`` over a sampler's indices that skips (never replaces) failures.

    A training loader replaces a record that fails to map (its batch keeps its size, the
    epoch its length); in evaluation that would count a record twice, so here its batch is
    one element shorter, a warning names it and the loader counts it (which
    ``inference_on_dataset`` reports). A batch whose records all fail is left out.

    Attributes:
        num_skipped_records: records that failed to map in the current pass (each iteration's).
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
        """Load ``records`` (map-style) in batches of ``batch_size`` of ``sampler``'s indices.

        ``mapper`` (``None``: none) maps a record, ``collate_fn`` a list of samples; ``kwargs``
        are other ``DataLoader`` arguments (``num_workers``, ...).
        """
        super().__init__(
            _SkippingRecords(records, mapper),
            batch_size=batch_size,
            sampler=sampler,
            drop_last=False,
            collate_fn=PackedCollate(collate_fn),  # with the skip count and size
            # Seed 0: a private generator for the loader workers (see loader_kwargs).
            **loader_kwargs(kwargs, 0),
        )
        self.num_skipped_records = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.num_skipped_records = 0
        for batch, skipped, size in super().__iter__():
            self.num_skipped_records += skipped
            if size:
                yield unpack_batch(batch)


def _test_loader_from_config(
    cfg: CfgNode, dataset_name: str | Sequence[str], mapper: Mapper | None = None
) -> dict[str, Any]:
    # Fail before loading any data.
    if cfg.TEST.IMS_PER_BATCH < 1:
        raise ConfigError(
            f"TEST.IMS_PER_BATCH must be >= 1, got {cfg.TEST.IMS_PER_BATCH}; set it to the "
            "images per test batch on each rank."
        )
    check_num_workers(cfg, "the evaluating process")
    # The given name(s), not DATASETS.TEST: each test set is evaluated on its own.
    dataset = load_catalog_dataset(dataset_name)
    if mapper is None:
        mapper = DatasetMapper(cfg, False)  # detectron2's default: read and resize images
    mapper = as_record_mapper(
        mapper,
        name=joined_names(dataset_name),
        max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
    )
    iterable = isinstance(dataset, IterableDataset)
    return {
        "dataset": dataset,
        "mapper": mapper,
        "sampler": None if iterable else InferenceSampler(len(dataset)),
        "batch_size": cfg.TEST.IMS_PER_BATCH,
        "num_workers": cfg.DATALOADER.NUM_WORKERS,
    }


@configurable(from_config=_test_loader_from_config)
def build_detection_test_loader(
    dataset: Dataset | Sequence[Any],
    *,
    mapper: Mapper | None,
    sampler: Sampler | None = None,
    batch_size: int = 1,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader:
    """Build a loader that passes over this rank's share of a test set once per iteration.

    Config form: ``build_detection_test_loader(cfg, dataset_name, mapper=None)`` loads the
    named dataset(s) from ``DatasetCatalog`` (one copy of the records per machine) with
    ``TEST.IMS_PER_BATCH`` samples per batch and ``DATALOADER.NUM_WORKERS`` workers;
    ``mapper=None`` maps with ``DatasetMapper(cfg, False)``. Each record is seen once across
    ranks (:class:`InferenceSampler`); the last batch may be smaller.

    Args:
        dataset: records (list), a map-style dataset, or an ``IterableDataset``.
        mapper: record -> sample, or ``None`` to use records as they are (explicit form).
        sampler: this rank's indices (default :class:`InferenceSampler`); ``None`` for a stream.
        batch_size, num_workers: samples per batch on this rank, and its loader workers.
        collate_fn: list of samples -> batch (default: the list itself).

    Returns:
        For a map-style dataset an :class:`InferenceLoader` (a torch ``DataLoader`` with
        ``len()``): a record that fails to map is skipped and reported, never replaced.

    Raises:
        ConfigError: A ``ValueError``: config form: for a TEST.IMS_PER_BATCH below 1, a
            negative DATALOADER.NUM_WORKERS, or an empty dataset.
        ValueError: If a sampler is given with an ``IterableDataset``.
        UnknownNameError: A ``KeyError``: for an unregistered dataset name (config form).
    """
    workers = loader_kwargs({"num_workers": num_workers}, 0)
    collate = collate_fn or trivial_batch_collator
    if isinstance(dataset, IterableDataset):
        if sampler is not None:
            raise ValueError("an IterableDataset yields its own order: pass sampler=None")
        if mapper is not None:  # skips the elements that fail (MapDataset's iterable form)
            dataset = MapDataset(dataset, as_record_mapper(mapper))
        return DataLoader(dataset, batch_size=batch_size, collate_fn=collate, **workers)
    records, record_mapper = records_and_mapper(dataset, mapper)
    sampler = InferenceSampler(len(records)) if sampler is None else sampler
    return InferenceLoader(
        records, record_mapper, sampler=sampler, batch_size=batch_size, collate_fn=collate,
        **workers,
    )  # fmt: skip


build_test_loader = build_detection_test_loader
