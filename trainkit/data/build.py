"""Build train and test loaders from plain arguments or from a config."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset, Sampler

from trainkit.config import CfgNode
from trainkit.data.batching import BatchIndexStream, aspect_ratio_bucket_ids, record_aspect_ratios
from trainkit.data.catalog import DatasetCatalog
from trainkit.data.common import AspectRatioGroupedDataset, DatasetFromList, MapDataset
from trainkit.data.loader import (
    TrainLoader,
    trivial_batch_collator,
    worker_context_kwargs,
    worker_init_reset_seed,
)
from trainkit.data.samplers import (
    InferenceSampler,
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.data.samplers._base import StreamSampler
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = [
    "build_batch_data_loader",
    "build_detection_test_loader",
    "build_detection_train_loader",
    "build_test_loader",
    "build_train_loader",
    "check_train_loader_config",
    "get_detection_dataset_dicts",
    "trivial_batch_collator",
    "worker_init_reset_seed",
]

_TRAIN_SAMPLERS = ("TrainingSampler", "RepeatFactorTrainingSampler", "RandomSubsetTrainingSampler")


def _catalog_part(name: str, *, as_list: bool = True) -> Any:
    """Call ``name``'s catalog function; a generator stays one unless ``as_list``.

    Raises:
        ValueError: If the dataset is empty (for a generator: once it turns out empty).
    """
    part = DatasetCatalog.get(name)
    if not _is_lazy_dataset(part) and not isinstance(part, (list, tuple)):
        part = list(part) if as_list else _non_empty(name, part)
    if isinstance(part, (list, tuple, Dataset)) and len(part) == 0:
        raise ValueError(f"dataset {name!r} is empty; check its registration function")
    return part


def _non_empty(name: str, records: Iterable[Any]) -> Iterator[Any]:
    count = 0
    for count, record in enumerate(records, 1):  # noqa: B007 - count is read afterwards
        yield record
    if count == 0:
        raise ValueError(f"dataset {name!r} is empty; check its registration function")


def _names(names: str | Sequence[str]) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ValueError("no dataset given: set DATASETS.TRAIN to registered dataset names")
    return names


def _is_lazy_dataset(obj: Any) -> bool:
    # A map-style dataset object (e.g. MetaFileDataset) reads its records on demand; a list,
    # tuple or generator is records to serialise.
    return isinstance(obj, Dataset) and not isinstance(obj, (list, tuple))


def get_detection_dataset_dicts(names: str | Sequence[str]) -> list[dict[str, Any]]:
    """Fetch the records of the named datasets from ``DatasetCatalog`` and concatenate them.

    This materialises every record in this process; the loaders built here avoid it on
    all but local rank 0 (see :meth:`DatasetFromList.from_local_leader`).

    Raises:
        ValueError: If no name is given or a dataset is empty.
        KeyError: If a name is not registered (the message lists the registered ones).
    """
    records: list[dict[str, Any]] = []
    for name in _names(names):
        records.extend(_catalog_part(name))
    return records


def _iter_dataset_dicts(names: list[str], first: Sequence[Any] | None = None) -> Iterator[Any]:
    # Streams one catalog function's records at a time into the serialiser, so local rank 0
    # never holds the concatenation of all of them. ``first``: names[0]'s records, if fetched.
    for i, name in enumerate(names):
        part = first if i == 0 and first is not None else _catalog_part(name, as_list=False)
        first = None
        if _is_lazy_dataset(part):
            raise ValueError(
                f"dataset {name!r} is a lazy dataset ({type(part).__name__}) while others in "
                f"{names} are lists of records; register all of them one way."
            )
        yield from part
        del part


def _is_local_leader() -> bool:
    # Without a local group every rank loads for itself (and from_local_leader says why).
    if comm.get_world_size() == 1:
        return True
    try:
        return comm.get_local_rank() == 0
    except RuntimeError:
        return True


def load_catalog_dataset(names: str | Sequence[str]) -> Dataset:
    """Return the named catalog datasets as one map-style dataset, one copy per machine.

    Catalog functions that return records (a list or a generator) are called on local rank
    0 only and serialised into shared memory that every local rank maps
    (:meth:`DatasetFromList.from_local_leader`). Functions that return a map-style dataset
    (e.g. ``lambda: MetaFileDataset(path)``) are called on every rank: such datasets read
    records on demand and cost O(1) memory per process. Several names are concatenated.

    Raises:
        ValueError: If no name is given, a dataset is empty, or record lists and lazy
            datasets are mixed.
        KeyError: If a name is not registered.

    Collective:
        One ``all_gather`` over the local process group (which kind of dataset the names
        hold), then :meth:`DatasetFromList.from_local_leader`'s. Every rank calls it.
    """
    names = _names(names)
    first: Any = None
    kind: dict[str, Any] | None = None
    error: BaseException | None = None
    if _is_local_leader():
        # The first function tells the kind; what it returned is reused, not fetched twice.
        try:
            first = _catalog_part(names[0], as_list=False)
            kind = {"lazy": _is_lazy_dataset(first), "error": None}
        except Exception as e:  # reported to the other ranks so that nobody hangs
            error = e
            kind = {"lazy": False, "error": f"{type(e).__name__}: {e}"}
    leader_kind = _gather_on_machine(kind)[0]
    if leader_kind["error"] is not None:
        if error is not None:
            raise error
        raise RuntimeError(f"local rank 0 failed to load {names}: {leader_kind['error']}")
    if leader_kind["lazy"]:
        parts = [
            first if i == 0 and first is not None else _catalog_part(name)
            for i, name in enumerate(names)
        ]
        if not all(_is_lazy_dataset(part) for part in parts):
            raise ValueError(f"datasets {names} mix lazy datasets and record lists")
        return parts[0] if len(parts) == 1 else ConcatDataset(parts)
    return DatasetFromList.from_local_leader(
        lambda: _iter_dataset_dicts(names, first), copy=False
    )


def _gather_on_machine(obj: Any) -> list[Any]:
    """All-gather ``obj`` over this machine's ranks ([obj] when there is nothing to gather).

    Collective:
        ``all_gather`` over the local process group when it exists and has > 1 rank.
    """
    if comm.get_world_size() == 1:
        return [obj]
    try:
        group = comm.get_local_process_group()
    except RuntimeError:
        return [obj]  # every rank lacks it alike: each loads its own copy
    return comm.all_gather(obj, group=group)


def check_train_loader_config(cfg: CfgNode, world_size: int | None = None) -> None:
    """Check the ``DATALOADER`` and batch settings ``build_train_loader`` uses, without data.

    Args:
        cfg: the config.
        world_size: the job's process count; ``None`` means the current job's.

    Raises:
        ValueError: Naming the first setting that is out of range and its valid range.
    """
    _check_total_batch(cfg.SOLVER.IMS_PER_BATCH, world_size)
    loader = cfg.DATALOADER
    if loader.NUM_WORKERS < 0:
        raise ValueError(f"DATALOADER.NUM_WORKERS must be >= 0, got {loader.NUM_WORKERS}")
    if loader.NUM_WORKERS > 0 and loader.PREFETCH_FACTOR < 1:
        raise ValueError(
            f"DATALOADER.PREFETCH_FACTOR must be >= 1 with workers, got {loader.PREFETCH_FACTOR}"
        )
    if loader.MAX_CONSECUTIVE_FAILURES < 1:
        raise ValueError(
            "DATALOADER.MAX_CONSECUTIVE_FAILURES must be >= 1, got "
            f"{loader.MAX_CONSECUTIVE_FAILURES}"
        )
    if loader.SAMPLER_TRAIN not in _TRAIN_SAMPLERS:
        raise ValueError(
            f"unknown DATALOADER.SAMPLER_TRAIN {loader.SAMPLER_TRAIN!r}; choose one of "
            f"{', '.join(_TRAIN_SAMPLERS)}"
        )
    if loader.ASPECT_RATIO_GROUPING:
        aspect_ratio_bucket_ids(np.ones(1), loader.ASPECT_RATIO_BINS)  # validates the bins


def _per_rank_batch_size(total_batch_size: int | None, single_gpu_batch_size: int | None) -> int:
    if single_gpu_batch_size:
        if total_batch_size:
            raise ValueError("give either total_batch_size or single_gpu_batch_size, not both")
        return single_gpu_batch_size
    world_size = comm.get_world_size()
    _check_total_batch(total_batch_size, world_size)
    return total_batch_size // world_size  # type: ignore[operator]


def _check_total_batch(total: int | None, world_size: int | None) -> None:
    world_size = comm.get_world_size() if world_size is None else world_size
    if not total or total < 1 or total % world_size:
        raise ValueError(
            f"SOLVER.IMS_PER_BATCH={total} is not a positive multiple of the world size "
            f"({world_size}); pick a positive multiple of {world_size} or change --num-gpus."
        )


def _dataset_records(dataset: Any) -> Iterator[dict[str, Any]]:
    # Grouping reads width/height from the unmapped records: unwrap MapDatasets to find them.
    # A generator: one record at a time, never a list of all of them.
    while isinstance(dataset, MapDataset):
        dataset = dataset.dataset
    return (dataset[i] for i in range(len(dataset)))


def _iterable_loader(
    dataset: IterableDataset,
    batch_size: int,
    aspect_ratio_grouping: bool,
    drop_last: bool,
    collate_fn: Callable[[list[Any]], Any] | None,
    loader_kwargs: dict[str, Any],
) -> Any:
    # detectron2's path for iterable datasets: the dataset shards itself across workers.
    if not aspect_ratio_grouping:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            drop_last=drop_last,
            collate_fn=collate_fn or trivial_batch_collator,
            worker_init_fn=worker_init_reset_seed,
            **loader_kwargs,
        )
    samples = DataLoader(
        dataset,
        collate_fn=operator.itemgetter(0),
        worker_init_fn=worker_init_reset_seed,
        **loader_kwargs,
    )
    grouped = AspectRatioGroupedDataset(samples, batch_size)
    return grouped if collate_fn is None else map(collate_fn, grouped)


def build_batch_data_loader(
    dataset: Dataset | Sequence[Any],
    sampler: Sampler | None,
    total_batch_size: int | None,
    *,
    aspect_ratio_grouping: bool = False,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = True,
    single_gpu_batch_size: int | None = None,
    prefetch_factor: int = 2,
    persistent_workers: bool = False,
    pin_memory: bool = False,
    aspect_ratio_bins: Sequence[float] = (1.0,),
    aspect_ratios: np.ndarray | Sequence[float] | None = None,
    seed: int | None = None,
) -> Any:
    """Build a loader whose batches hold ``total_batch_size // world_size`` samples per rank.

    For a map-style dataset with a sampler it returns a :class:`~trainkit.data.loader.TrainLoader`:
    batches are composed in this process (grouped by aspect-ratio bucket when asked) and
    loaded whole by the workers, so the stream does not depend on ``num_workers``, and the
    loader has ``state_dict()`` / ``load_state_dict()``. An ``IterableDataset`` (no sampler)
    gets a plain torch ``DataLoader`` (grouping, if asked, by orientation in this process).

    Args:
        dataset: map-style dataset (or list) of mapped samples, or an ``IterableDataset``.
        sampler: yields this rank's indices; ``None`` only for an ``IterableDataset``.
        total_batch_size: batch size summed over ranks.
        aspect_ratio_grouping: batch only samples of the same aspect-ratio bucket.
        num_workers: loader worker processes per rank.
        collate_fn: list of samples -> batch (default: the list itself).
        drop_last: drop incomplete batches at the end of a finite sampler.
        single_gpu_batch_size: per-rank batch size instead of ``total_batch_size``.
        prefetch_factor: batches each worker loads ahead.
        persistent_workers: keep workers across iterations.
        pin_memory: copy batches to page-locked memory.
        aspect_ratio_bins: bucket boundaries (``DATALOADER.ASPECT_RATIO_BINS``); ``(1.0,)`` is
            detectron2's tall/wide split.
        aspect_ratios: ``width / height`` per dataset index; default: read from the records
            (unwrapping ``MapDataset``), which need ``width`` and ``height``.
        seed: key of ``sample_rng()`` in mappers; default: the sampler's seed, else 0.

    Returns:
        An iterable of batches.

    Raises:
        ValueError: If the batch size does not divide by the world size, if a map-style
            dataset has no sampler, or if grouping lacks record sizes.
    """
    batch_size = _per_rank_batch_size(total_batch_size, single_gpu_batch_size)
    loader_kwargs = {
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "persistent_workers": persistent_workers and num_workers > 0,
    }
    if num_workers > 0:
        loader_kwargs.update(prefetch_factor=prefetch_factor, **worker_context_kwargs())
    if isinstance(dataset, IterableDataset):
        if sampler is not None:
            raise ValueError("an IterableDataset yields its own order: pass sampler=None")
        return _iterable_loader(
            dataset, batch_size, aspect_ratio_grouping, drop_last, collate_fn, loader_kwargs
        )
    if sampler is None:
        raise ValueError(
            "a map-style dataset needs a sampler, e.g. TrainingSampler(len(dataset), seed=seed)"
        )
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
    bucket_ids = None
    if aspect_ratio_grouping:
        ratios = (
            record_aspect_ratios(_dataset_records(dataset))
            if aspect_ratios is None
            else aspect_ratios
        )
        bucket_ids = aspect_ratio_bucket_ids(np.asarray(ratios), aspect_ratio_bins)
    stream = BatchIndexStream(sampler, batch_size, bucket_ids=bucket_ids, drop_last=drop_last)
    if seed is None:
        seed = sampler.seed if isinstance(sampler, StreamSampler) else 0
    return TrainLoader(
        dataset, stream, seed=seed, collate_fn=collate_fn, loader_kwargs=loader_kwargs
    )


class _RecordView(Sequence):
    """The unmapped records of a dataset as a read-only sequence, unpickled one at a time."""

    def __init__(self, dataset: Any) -> None:
        while isinstance(dataset, MapDataset):
            dataset = dataset.dataset
        self._dataset = dataset

    def __len__(self) -> int:
        return len(self._dataset)

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return [self._dataset[i] for i in range(len(self))[idx]]
        return self._dataset[idx]


def _build_train_sampler(
    cfg: CfgNode, records: Sequence[dict[str, Any]] | None, size: int, seed: int
) -> Sampler:
    name = cfg.DATALOADER.SAMPLER_TRAIN
    logger.info("Using training sampler %s with seed %d", name, seed)
    if name == "TrainingSampler":
        return TrainingSampler(size, seed=seed)
    if name == "RandomSubsetTrainingSampler":
        return RandomSubsetTrainingSampler(
            size, cfg.DATALOADER.RANDOM_SUBSET_RATIO, seed_shuffle=seed, seed_subset=seed
        )
    if name == "RepeatFactorTrainingSampler":
        if records is None:
            raise ValueError(
                "RepeatFactorTrainingSampler needs the records: pass dataset as a list of dicts "
            "or a dataset of dicts"
            )
        factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
            records, cfg.DATALOADER.REPEAT_THRESHOLD
        )
        return RepeatFactorTrainingSampler(factors, seed=seed)
    raise ValueError(
        f"unknown DATALOADER.SAMPLER_TRAIN {name!r}; choose one of {', '.join(_TRAIN_SAMPLERS)}"
    )


def build_train_loader(
    cfg: CfgNode,
    mapper: Callable[[Any], Any] | None = None,
    *,
    dataset: Dataset | Sequence[Any] | None = None,
    sampler: Sampler | None = None,
) -> TrainLoader:
    """Build this rank's resumable train loader from ``cfg``.

    Reads ``DATASETS.TRAIN``, ``SOLVER.IMS_PER_BATCH``, ``SEED`` and ``DATALOADER.*``. The
    shared seed is ``cfg.SEED`` if >= 0, else one drawn once here on every rank.

    Args:
        cfg: the config.
        mapper: record -> sample (``None``: records are used as they are). It may return
            ``None`` or raise to skip a record, and may call ``trainkit.data.sample_rng()``.
        dataset: records (list) or a map-style dataset instead of ``DATASETS.TRAIN``.
        sampler: instead of the one named by ``DATALOADER.SAMPLER_TRAIN``.

    Returns:
        A :class:`~trainkit.data.loader.TrainLoader`.

    Raises:
        ValueError: For an indivisible batch size, an unknown sampler, or missing sizes.
        KeyError: For an unregistered dataset name.

    Collective:
        ``comm.shared_random_seed()`` when ``cfg.SEED < 0`` (on every rank, same line), and
        :func:`load_catalog_dataset` when ``dataset`` is None.
    """
    check_train_loader_config(cfg)  # fail before loading any data
    seed = cfg.SEED if cfg.SEED >= 0 else comm.shared_random_seed()
    names = ",".join(cfg.DATASETS.TRAIN) or None
    if dataset is None:
        # Records are loaded on local rank 0 only, into one shared copy per machine.
        dataset = load_catalog_dataset(cfg.DATASETS.TRAIN)
    records = dataset if isinstance(dataset, list) else None
    if records is not None:
        dataset = DatasetFromList(records, copy=False)
    if mapper is not None:
        dataset = MapDataset(
            dataset,
            mapper,
            name=names,
            max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
        )
    # Unmapped records, read one at a time (repeat factors, aspect ratios) when not a list.
    raw_records = records if records is not None else _RecordView(dataset)
    if sampler is None:
        sampler = _build_train_sampler(cfg, raw_records, len(dataset), seed)
    grouping = cfg.DATALOADER.ASPECT_RATIO_GROUPING
    ratios = record_aspect_ratios(raw_records) if grouping else None
    return build_batch_data_loader(
        dataset,
        sampler,
        cfg.SOLVER.IMS_PER_BATCH,
        aspect_ratio_grouping=grouping,
        num_workers=cfg.DATALOADER.NUM_WORKERS,
        prefetch_factor=cfg.DATALOADER.PREFETCH_FACTOR,
        persistent_workers=cfg.DATALOADER.PERSISTENT_WORKERS,
        pin_memory=cfg.DATALOADER.PIN_MEMORY,
        aspect_ratio_bins=cfg.DATALOADER.ASPECT_RATIO_BINS,
        aspect_ratios=ratios,
        seed=seed,
    )


def build_test_loader(
    cfg: CfgNode, dataset_name: str | Sequence[str], mapper: Callable[[Any], Any] | None = None
) -> DataLoader:
    """Build a loader that passes over this rank's contiguous shard of a test set once.

    Batches hold ``TEST.IMS_PER_BATCH`` samples (per rank; the last may be smaller). Every
    record is seen exactly once across ranks (:class:`InferenceSampler`, no padding).

    Raises:
        KeyError: For an unregistered dataset name.

    Collective:
        :func:`load_catalog_dataset` (over the local process group); every rank calls it.
    """
    dataset = load_catalog_dataset(dataset_name)
    if mapper is not None:
        name = dataset_name if isinstance(dataset_name, str) else ",".join(dataset_name)
        dataset = MapDataset(
            dataset,
            mapper,
            name=name,
            max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
        )
    return DataLoader(
        dataset,
        sampler=InferenceSampler(len(dataset)),
        batch_size=cfg.TEST.IMS_PER_BATCH,
        drop_last=False,
        num_workers=cfg.DATALOADER.NUM_WORKERS,
        collate_fn=trivial_batch_collator,
        worker_init_fn=worker_init_reset_seed,
        **(worker_context_kwargs() if cfg.DATALOADER.NUM_WORKERS > 0 else {}),
    )


build_detection_train_loader = build_train_loader
build_detection_test_loader = build_test_loader
