"""Build train and test loaders from plain arguments or from a config (detectron2's builders).

``build_detection_train_loader`` and ``build_detection_test_loader`` are
:func:`~trainkit.config.configurable`: called with a config first they read it, called with
a dataset they take explicit arguments, with detectron2's signatures in both forms.
``build_train_loader`` / ``build_test_loader`` are the same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from trainkit.config import CfgNode, ConfigError, configurable
from trainkit.data._catalog_loading import get_detection_dataset_dicts, load_catalog_dataset
from trainkit.data._loader_config import (
    RecordView,
    build_train_sampler,
    check_train_loader_config,
    iter_records,
    per_rank_batch_size,
)
from trainkit.data._map_dataset import RecordMapper
from trainkit.data._stream_batches import StreamBatches
from trainkit.data.batching import BatchIndexStream, aspect_ratio_bucket_ids, record_aspect_ratios
from trainkit.data.common import DatasetFromList, MapDataset
from trainkit.data.composer import StepBatchComposer
from trainkit.data.loader import (
    BatchPlan,
    TrainLoader,
    trivial_batch_collator,
    worker_context_kwargs,
    worker_init_reset_seed,
)
from trainkit.data.samplers import InferenceSampler, TrainingSampler
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
    "load_catalog_dataset",
    "trivial_batch_collator",
    "worker_init_reset_seed",
]

Mapper = Callable[[Any], Any]


def _loader_kwargs(
    num_workers: int,
    prefetch_factor: int,
    persistent_workers: bool,
    pin_memory: bool,
    seed: int | None,
    extra: dict[str, Any],
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "num_workers": num_workers,
        "pin_memory": pin_memory,
        "persistent_workers": persistent_workers and num_workers > 0,
    }
    if num_workers > 0:
        kwargs.update(prefetch_factor=prefetch_factor, **worker_context_kwargs())
    if seed is not None:
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    kwargs.update(extra)  # the caller's DataLoader arguments win
    return kwargs


def build_batch_data_loader(
    dataset: Dataset | Sequence[Any],
    sampler: Sampler | Iterable[int] | None,
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
    seed: int | None = None,
    aspect_ratio_bins: Sequence[float] = (1.0,),
    aspect_ratios: np.ndarray | Sequence[float] | None = None,
    accumulate_steps: int = 1,
    **kwargs: Any,
) -> TrainLoader:
    """Build this rank's resumable loader of ``total_batch_size / (world size x k)`` samples.

    ``total_batch_size`` is the batch of one optimizer step over all ranks and
    ``k = accumulate_steps`` micro-batches. A ``MapDataset`` is taken apart once into its
    records and its mapper; the records' facts (aspect ratios) are read from the unmapped
    records. Then, for a map-style dataset and a trainkit training sampler, each step's batch
    is composed from the global stream and dealt to the ranks
    (:class:`~trainkit.data.composer.StepBatchComposer`): the same records per step for any
    world size, ``k`` and ``num_workers``. With any other sampler (or
    ``single_gpu_batch_size``) batches are composed from this rank's stream. An
    ``IterableDataset`` is read as a stream: its workers read disjoint shares and form the
    batches (:mod:`trainkit.data._stream_batches`).

    Args:
        dataset: records (list), a map-style dataset (``MapDataset`` for mapped records), or
            an ``IterableDataset``.
        sampler: a training sampler (or any sampler of this rank's indices); ``None`` only
            for an ``IterableDataset``.
        total_batch_size: samples of one optimizer step summed over ranks.
        aspect_ratio_grouping: batch only samples of the same aspect-ratio bucket.
        num_workers: loader worker processes per rank.
        collate_fn: list of samples -> batch (default: the list itself).
        drop_last: drop incomplete batches at the end of a finite sampler.
        single_gpu_batch_size: per-rank batch size instead of ``total_batch_size``.
        prefetch_factor: batches each worker loads ahead.
        persistent_workers: keep workers across iterations.
        pin_memory: copy batches to page-locked memory.
        seed: key of ``sample_rng()`` in mappers and of the workers' base seeds; default:
            the sampler's seed, else 0.
        aspect_ratio_bins: bucket boundaries (``DATALOADER.ASPECT_RATIO_BINS``); ``(1.0,)`` is
            detectron2's tall/wide split.
        aspect_ratios: ``width / height`` per dataset index; default: read from the records,
            which then need ``width`` and ``height``.
        accumulate_steps: micro-batches per optimizer step (``SOLVER.ACCUMULATE_STEPS``).
        **kwargs: further ``torch.utils.data.DataLoader`` arguments (e.g. ``timeout``).

    Returns:
        A :class:`~trainkit.data.loader.TrainLoader`.

    Raises:
        ConfigError: A ``ValueError``: if the batch does not split evenly over the ranks and
            micro-batches, or grouping lacks record sizes.
        ValueError: If a map-style dataset has no sampler or a stream has one.
    """
    records, mapper = _records_and_mapper(dataset)
    stream = isinstance(records, IterableDataset)
    if stream and sampler is not None:
        raise ValueError("an IterableDataset yields its own order: pass sampler=None")
    if not stream and sampler is None:
        raise ValueError(
            "a map-style dataset needs a sampler, e.g. TrainingSampler(len(dataset), seed=seed)"
        )
    if seed is None:
        seed = sampler.seed if isinstance(sampler, StreamSampler) else 0
    loader_kwargs = _loader_kwargs(
        num_workers, prefetch_factor, persistent_workers and not stream, pin_memory, None, kwargs
    )
    collate = collate_fn or trivial_batch_collator
    if stream:
        batch_size = _micro_batch_size(total_batch_size, single_gpu_batch_size, accumulate_steps)
        bucket_of = _bucket_of(aspect_ratio_bins) if aspect_ratio_grouping else None
        batches = StreamBatches(
            records, mapper, batch_size, bucket_of=bucket_of, collate_fn=collate, seed=seed
        )
        logger.info("Stream loader: batches of %d formed in the workers", batch_size)
        return TrainLoader(records, mapper, batches, seed=seed, loader_kwargs=loader_kwargs)
    bucket_ids = None
    if aspect_ratio_grouping:
        if aspect_ratios is None:
            aspect_ratios = record_aspect_ratios(iter_records(records))
        bucket_ids = aspect_ratio_bucket_ids(np.asarray(aspect_ratios), aspect_ratio_bins)
    plan = _batch_plan(
        sampler, total_batch_size, single_gpu_batch_size, accumulate_steps, bucket_ids, drop_last
    )
    return TrainLoader(
        records, mapper, plan, seed=seed, collate_fn=collate, loader_kwargs=loader_kwargs
    )


def _records_and_mapper(dataset: Any) -> tuple[Any, RecordMapper | None]:
    """Take a mapped dataset apart, once: (unmapped records, their mapper)."""
    if isinstance(dataset, list):
        return DatasetFromList(dataset, copy=False), None
    mapper = getattr(dataset, "mapper", None)
    if isinstance(dataset, (MapDataset, IterableDataset)) and isinstance(mapper, RecordMapper):
        return dataset.dataset, mapper  # MapDataset, or its iterable twin
    return dataset, None


def _micro_batch_size(
    total_batch_size: int | None, single_gpu_batch_size: int | None, accumulate_steps: int
) -> int:
    per_rank = per_rank_batch_size(total_batch_size, single_gpu_batch_size)
    if accumulate_steps < 1 or per_rank % accumulate_steps:
        raise ConfigError(
            f"the per-rank batch of {per_rank} does not split into SOLVER.ACCUMULATE_STEPS="
            f"{accumulate_steps} equal micro-batches; pick SOLVER.IMS_PER_BATCH divisible by "
            "world size x ACCUMULATE_STEPS."
        )
    return per_rank // accumulate_steps


def _batch_plan(
    sampler: Any,
    total_batch_size: int | None,
    single_gpu_batch_size: int | None,
    accumulate_steps: int,
    bucket_ids: np.ndarray | None,
    drop_last: bool,
) -> BatchPlan:
    if isinstance(sampler, StreamSampler) and not single_gpu_batch_size:
        # The sampler's own rank and world size: tests and custom sharding set them.
        return StepBatchComposer(
            sampler,
            total_batch_size or 0,
            rank=sampler.rank,
            world_size=sampler.world_size,
            accumulate_steps=accumulate_steps,
            bucket_ids=bucket_ids,
        )
    batch_size = _micro_batch_size(total_batch_size, single_gpu_batch_size, accumulate_steps)
    return BatchIndexStream(sampler, batch_size, bucket_ids=bucket_ids, drop_last=drop_last)


class _BucketOf:
    """Aspect-ratio bucket of a raw stream element (a picklable callable)."""

    def __init__(self, bins: Sequence[float]) -> None:
        self.bins = list(bins)
        aspect_ratio_bucket_ids(np.ones(1), self.bins)  # validates the bins now

    def __call__(self, element: Any) -> int:
        ratios = record_aspect_ratios([element])
        return int(aspect_ratio_bucket_ids(ratios, self.bins)[0])


def _bucket_of(bins: Sequence[float]) -> _BucketOf:
    return _BucketOf(bins)


def _name_of(names: str | Sequence[str]) -> str:
    return names if isinstance(names, str) else ",".join(names)


def _train_loader_from_config(
    cfg: CfgNode,
    mapper: Mapper | None = None,
    *,
    dataset: Dataset | Sequence[Any] | None = None,
    sampler: Sampler | None = None,
) -> dict[str, Any]:
    check_train_loader_config(cfg)  # fail before loading any data
    seed = cfg.SEED if cfg.SEED >= 0 else comm.shared_random_seed()
    if dataset is None:
        # Records are loaded on local rank 0 only, into one shared copy per machine.
        dataset = load_catalog_dataset(
            cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS
        )
    records = dataset if isinstance(dataset, list) else None
    if records is not None:
        dataset = DatasetFromList(records, copy=False)
    if mapper is not None:
        # Wrapped here, not by the explicit form, to name the dataset and apply the config's
        # failure limit; the explicit form then gets mapper=None.
        dataset = MapDataset(
            dataset,
            mapper,
            name=_name_of(cfg.DATASETS.TRAIN) or None,
            max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
        )
    if sampler is None and not isinstance(dataset, IterableDataset):
        # Unmapped records, read one at a time when they are not a list (repeat factors).
        raw_records = records if records is not None else RecordView(dataset)
        sampler = build_train_sampler(cfg, raw_records, len(dataset), seed)
    elif sampler is None:
        logger.info("No sampler: the train dataset is an IterableDataset")
    return {
        "dataset": dataset,
        "mapper": None,
        "sampler": sampler,
        # IMS_PER_BATCH is per optimizer step; the loader's batches are its micro-batches.
        "total_batch_size": cfg.SOLVER.IMS_PER_BATCH,
        "accumulate_steps": cfg.SOLVER.ACCUMULATE_STEPS,
        "aspect_ratio_grouping": cfg.DATALOADER.ASPECT_RATIO_GROUPING,
        "num_workers": cfg.DATALOADER.NUM_WORKERS,
        "prefetch_factor": cfg.DATALOADER.PREFETCH_FACTOR,
        "persistent_workers": cfg.DATALOADER.PERSISTENT_WORKERS,
        "pin_memory": cfg.DATALOADER.PIN_MEMORY,
        "aspect_ratio_bins": cfg.DATALOADER.ASPECT_RATIO_BINS,
        "seed": seed,
    }


@configurable(from_config=_train_loader_from_config)
def build_detection_train_loader(
    dataset: Dataset | Sequence[Any],
    *,
    mapper: Mapper | None,
    sampler: Sampler | None = None,
    total_batch_size: int,
    aspect_ratio_grouping: bool = True,
    num_workers: int = 0,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Build this rank's train loader; callable with a config or with explicit arguments.

    Config form: ``build_detection_train_loader(cfg, mapper=None, *, dataset=None,
    sampler=None)``. It reads ``DATASETS.TRAIN`` (unless ``dataset`` is given),
    ``SOLVER.IMS_PER_BATCH``, ``SEED`` and ``DATALOADER.*``; the shared seed is ``cfg.SEED``
    if >= 0, else one drawn once here on every rank. Further keyword arguments of the
    explicit form (e.g. ``aspect_ratio_grouping=False``) override what the config says.
    ``mapper=None`` uses the records as they are.

    Over a map-style dataset the result is a resumable
    :class:`~trainkit.data.loader.TrainLoader` (``state_dict()`` / ``load_state_dict()``,
    the same batches for any ``num_workers``, ``trainkit.data.sample_rng()`` in mappers).
    An ``IterableDataset`` gets a torch ``DataLoader``, which cannot resume.

    Args:
        dataset: records (list), a map-style dataset, or an ``IterableDataset``.
        mapper: record -> sample, or ``None`` to use records as they are. It may return
            ``None`` or raise to skip a record.
        sampler: yields this rank's indices; default :class:`TrainingSampler` (with
            ``kwargs["seed"]`` if given). Must be ``None`` for an ``IterableDataset``.
        total_batch_size: batch size summed over ranks.
        aspect_ratio_grouping: batch only samples of similar aspect ratio; the records need
            ``width`` and ``height``.
        num_workers: loader worker processes per rank.
        collate_fn: list of samples -> batch (default: the list itself).
        **kwargs: passed to :func:`build_batch_data_loader` (``seed``, ``prefetch_factor``,
            ``drop_last``, ``aspect_ratio_bins``, ... and ``DataLoader`` arguments).

    Returns:
        An iterable of batches, each a list of ``total_batch_size // world_size`` samples.

    Raises:
        ConfigError: A ``ValueError``: for an out-of-range ``DATALOADER``/``SOLVER`` setting
            (an indivisible batch size, an unknown sampler, ...), missing record sizes, or an
            empty dataset.
        ValueError: For a sampler given with an ``IterableDataset``.
        UnknownNameError: A ``KeyError``: for an unregistered dataset name.

    Collective:
        Config form: ``comm.shared_random_seed()`` when ``cfg.SEED < 0`` and
        :func:`load_catalog_dataset` when ``dataset`` is None. Explicit form without a
        sampler and without ``seed``: ``TrainingSampler``'s shared random seed. Every rank
        calls it.
    """
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
    if mapper is not None:
        dataset = MapDataset(dataset, mapper)
    if isinstance(dataset, IterableDataset):
        if sampler is not None:
            raise ValueError("an IterableDataset yields its own order: pass sampler=None")
    elif sampler is None:
        sampler = TrainingSampler(len(dataset), seed=kwargs.get("seed"))
    return build_batch_data_loader(
        dataset,
        sampler,
        total_batch_size,
        aspect_ratio_grouping=aspect_ratio_grouping,
        num_workers=num_workers,
        collate_fn=collate_fn,
        **kwargs,
    )


def _check_test_loader_config(cfg: CfgNode) -> None:
    # torch's own errors for these ("batch_size should be a positive integer value") do not
    # name the config keys.
    if cfg.TEST.IMS_PER_BATCH < 1:
        raise ConfigError(
            f"TEST.IMS_PER_BATCH must be >= 1, got {cfg.TEST.IMS_PER_BATCH}; set it to the "
            "images per test batch on each rank."
        )
    if cfg.DATALOADER.NUM_WORKERS < 0:
        raise ConfigError(
            f"DATALOADER.NUM_WORKERS must be >= 0, got {cfg.DATALOADER.NUM_WORKERS}; use 0 to "
            "load in the evaluating process."
        )


def _test_loader_from_config(
    cfg: CfgNode, dataset_name: str | Sequence[str], mapper: Mapper | None = None
) -> dict[str, Any]:
    _check_test_loader_config(cfg)  # fail before loading any data
    # The given name(s), not DATASETS.TEST: each test set is evaluated on its own.
    dataset = load_catalog_dataset(dataset_name)
    if mapper is not None:
        dataset = MapDataset(
            dataset,
            mapper,
            name=_name_of(dataset_name),
            max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
        )
    iterable = isinstance(dataset, IterableDataset)
    return {
        "dataset": dataset,
        "mapper": None,
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
    ``TEST.IMS_PER_BATCH`` samples per batch and ``DATALOADER.NUM_WORKERS`` workers.

    The default :class:`InferenceSampler` gives each rank a contiguous shard: every record
    is seen exactly once across ranks (no padding); the last batch may be smaller.

    Args:
        dataset: records (list), a map-style dataset, or an ``IterableDataset``.
        mapper: record -> sample, or ``None`` to use records as they are.
        sampler: yields this rank's indices; default :class:`InferenceSampler`. Must be
            ``None`` for an ``IterableDataset``.
        batch_size: samples per batch on this rank.
        num_workers: loader worker processes.
        collate_fn: list of samples -> batch (default: the list itself).

    Returns:
        A torch ``DataLoader`` (with ``len()`` for a map-style dataset).

    Raises:
        ConfigError: A ``ValueError``: config form: for a TEST.IMS_PER_BATCH below 1, a
            negative DATALOADER.NUM_WORKERS, or an empty dataset.
        ValueError: If a sampler is given with an ``IterableDataset``.
        UnknownNameError: A ``KeyError``: for an unregistered dataset name (config form).

    Collective:
        Config form: :func:`load_catalog_dataset` (over the local process group); every
        rank calls it.
    """
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
    if mapper is not None:
        dataset = MapDataset(dataset, mapper)
    if isinstance(dataset, IterableDataset):
        if sampler is not None:
            raise ValueError("an IterableDataset yields its own order: pass sampler=None")
    elif sampler is None:
        sampler = InferenceSampler(len(dataset))
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=False,
        num_workers=num_workers,
        collate_fn=collate_fn or trivial_batch_collator,
        worker_init_fn=worker_init_reset_seed,
        **(worker_context_kwargs() if num_workers > 0 else {}),
    )


build_train_loader = build_detection_train_loader
build_test_loader = build_detection_test_loader
