"""Build train loaders from plain arguments or from a config (detectron2's builders).

``build_detection_train_loader`` and ``build_detection_test_loader`` (from
:mod:`trainkit.data.inference_loader`; detectron2 imports it from here) are
:func:`~trainkit.config.configurable` with detectron2's signatures: given a config they check
it before loading any data, then hand the records, the mapper, the sampler and the settings
straight to the loader. ``build_train_loader`` / ``build_test_loader`` are the same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, IterableDataset, Sampler

from trainkit.config import CfgNode, ConfigError, configurable
from trainkit.data.batch_plan import BatchPlan, micro_batch_size, split_batch
from trainkit.data.catalog import (
    get_detection_dataset_dicts,
    joined_names,
    load_catalog_dataset,
)
from trainkit.data.common import DatasetFromList, records_and_mapper
from trainkit.data.dataset_mapper import DatasetMapper
from trainkit.data.grouping import BucketOf, aspect_ratio_bucket_ids, record_bucket_ids
from trainkit.data.inference_loader import build_detection_test_loader, build_test_loader
from trainkit.data.loader import TrainLoader
from trainkit.data.loader_workers import (
    check_num_workers,
    trivial_batch_collator,
    worker_init_reset_seed,
)
from trainkit.data.mapping import as_record_mapper, check_max_failures
from trainkit.data.mixed_plan import make_train_plan
from trainkit.data.mixed_sets import check_mix_config, mixed_sets
from trainkit.data.samplers import (
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.data.samplers.distributed_sampler import check_subset_ratio
from trainkit.data.samplers.global_stream import GlobalStreamSampler
from trainkit.data.samplers.mixed import MixedTrainingSampler
from trainkit.data.stream_batches import StreamBatches
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = [
    "build_batch_data_loader",
    "build_detection_test_loader",
    "build_detection_train_loader",
    "build_train_sampler",
    "build_test_loader",
    "build_train_loader",
    "check_train_loader_config",
    "get_detection_dataset_dicts",
    "load_catalog_dataset",
    "trivial_batch_collator",
    "worker_init_reset_seed",
]

Mapper = Callable[[Any], Any]


TRAIN_SAMPLERS = ("TrainingSampler", "RepeatFactorTrainingSampler", "RandomSubsetTrainingSampler")


def check_train_loader_config(cfg: CfgNode, world_size: int | None = None) -> None:
    """Check the ``DATALOADER`` and batch settings the train loader uses, without data.

    Args:
        cfg: the config.
        world_size: the job's process count (``None``: the current job's).

    Raises:
        ConfigError: A ``ValueError`` naming the first setting out of range and its range.
    """
    world_size = comm.get_world_size() if world_size is None else world_size
    split_batch(cfg.SOLVER.IMS_PER_BATCH, world_size, cfg.SOLVER.ACCUMULATE_STEPS)
    check_num_workers(cfg, "the training process")
    loader = cfg.DATALOADER
    if loader.NUM_WORKERS > 0 and loader.PREFETCH_FACTOR < 1:
        raise ConfigError(
            f"DATALOADER.PREFETCH_FACTOR must be >= 1 with loader workers (DATALOADER.NUM_WORKERS "
            f"> 0), got {loader.PREFETCH_FACTOR}"
        )
    check_max_failures(loader.MAX_CONSECUTIVE_FAILURES)
    sampler = loader.SAMPLER_TRAIN
    if sampler not in TRAIN_SAMPLERS:
        raise ConfigError(
            f"unknown DATALOADER.SAMPLER_TRAIN {sampler!r}; choose one of "
            f"{', '.join(TRAIN_SAMPLERS)}"
        )
    if sampler == "RandomSubsetTrainingSampler":
        check_subset_ratio(loader.RANDOM_SUBSET_RATIO)
    if sampler == "RepeatFactorTrainingSampler" and loader.REPEAT_THRESHOLD < 0:
        raise ConfigError(
            f"DATALOADER.REPEAT_THRESHOLD must be >= 0, got {loader.REPEAT_THRESHOLD}; use 0 "
            "to repeat no record."
        )
    if loader.ASPECT_RATIO_GROUPING:
        BucketOf(loader.ASPECT_RATIO_BINS)  # validates the bins
    if cfg.DATASETS.TRAIN_WEIGHTS:
        check_mix_config(cfg)


def build_train_sampler(
    cfg: CfgNode,
    records: Sequence[Any],
    seed: int,
    *,
    rank: int | None = None,
    world_size: int | None = None,
) -> GlobalStreamSampler:
    """Return the training sampler ``DATALOADER.SAMPLER_TRAIN`` names, with the shared seed.

    Args:
        cfg: the config (checked before by :func:`check_train_loader_config`).
        records: the unmapped records (read by ``RepeatFactorTrainingSampler`` only; the
            others read their length).
        seed: the data seed, the same on every rank.
        rank, world_size: whose share the sampler yields (default: this process's).
    """
    name = cfg.DATALOADER.SAMPLER_TRAIN
    logger.info("Using training sampler %s with seed %d", name, seed)
    size, shard = len(records), {"rank": rank, "world_size": world_size}
    if name == "RandomSubsetTrainingSampler":
        return RandomSubsetTrainingSampler(
            size,
            cfg.DATALOADER.RANDOM_SUBSET_RATIO,
            seed_shuffle=seed,
            seed_subset=seed,
            **shard,
        )
    if name == "RepeatFactorTrainingSampler":
        factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
            records, cfg.DATALOADER.REPEAT_THRESHOLD, sqrt=cfg.DATALOADER.REPEAT_SQRT
        )
        return RepeatFactorTrainingSampler(factors, seed=seed, **shard)
    return TrainingSampler(size, seed=seed, **shard)


def _train_loader_from_config(
    cfg: CfgNode,
    mapper: Mapper | None = None,
    *,
    dataset: Dataset | Sequence[Any] | None = None,
    sampler: Sampler | None = None,
) -> dict[str, Any]:
    check_train_loader_config(cfg)  # fail before loading any data
    seed = cfg.SEED if cfg.SEED >= 0 else comm.shared_random_seed()
    if cfg.DATASETS.TRAIN_WEIGHTS and (dataset is not None or sampler is not None):
        raise ConfigError(
            "DATASETS.TRAIN_WEIGHTS mixes the DATASETS.TRAIN sets, which build_train_loader "
            "loads itself; pass no dataset= or sampler=, or set DATASETS.TRAIN_WEIGHTS ()."
        )
    if cfg.DATASETS.TRAIN_WEIGHTS:
        dataset, sampler = mixed_sets(cfg, seed)
    elif dataset is None:
        # Every rank loads; a machine keeps one shared copy of the records (by content).
        dataset = load_catalog_dataset(
            cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS
        )
    as_stream = getattr(dataset, "as_stream", None)
    if callable(as_stream):  # a RankDataset: this rank's shares, epoch after epoch
        dataset = as_stream()
    records, own_mapper = (
        (dataset, None) if isinstance(dataset, list) else records_and_mapper(dataset)
    )
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
    if mapper is None and own_mapper is None:
        mapper = DatasetMapper(cfg, True)  # detectron2's default: read and augment images
    # The loader gets the records and this mapper as they are: named after the datasets,
    # with the config's failure limit.
    mapper = as_record_mapper(
        mapper,
        name=joined_names(cfg.DATASETS.TRAIN) or type(dataset).__name__,
        max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
    )
    if sampler is None and not isinstance(dataset, IterableDataset):
        # The unmapped records (read by RepeatFactorTrainingSampler only).
        sampler = build_train_sampler(cfg, records, seed)
    elif sampler is None:
        logger.info("No sampler: the train dataset is an IterableDataset")
    return {
        "dataset": dataset,
        "mapper": mapper,
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
    sampler=None)`` reads ``DATASETS.TRAIN`` (unless ``dataset`` is given; a ``RankDataset``
    is read as its stream of shares), ``SOLVER.IMS_PER_BATCH``, ``SEED`` (if < 0, a shared
    seed is drawn here on every rank) and ``DATALOADER.*``; explicit keyword arguments (e.g.
    ``aspect_ratio_grouping=False``) override it. ``mapper=None`` maps with
    ``DatasetMapper(cfg, True)`` (records need a ``file_name``), unless ``dataset`` is a
    ``MapDataset`` with its own mapper. The result is :func:`build_batch_data_loader`'s.

    Args:
        dataset, mapper, total_batch_size, num_workers, collate_fn: as in
            :func:`build_batch_data_loader` (a mapper may return ``None`` or raise to skip a
            record; in this explicit form ``mapper=None`` maps nothing, as in detectron2).
        sampler: default :class:`TrainingSampler` (with ``kwargs["seed"]`` if given); must
            be ``None`` for an ``IterableDataset``.
        aspect_ratio_grouping: batch only samples of similar aspect ratio (from the records'
            ``width`` and ``height``, else from their image headers, read lazily).
        **kwargs: passed to :func:`build_batch_data_loader` (``seed``, ``prefetch_factor``,
            ``drop_last``, ``aspect_ratio_bins``, ... and ``DataLoader`` arguments).

    Raises:
        ConfigError: A ``ValueError``: for an out-of-range ``DATALOADER``/``SOLVER`` setting
            (an indivisible batch size, an unknown sampler, ...), a record with neither a size
            nor a ``file_name`` under grouping, or an empty dataset.
        ValueError: For a sampler given with an ``IterableDataset``.
        UnknownNameError: A ``KeyError``: for an unregistered dataset name.

    Collective:
        Config form: ``comm.shared_random_seed()`` when ``cfg.SEED < 0``. Explicit form
        without a sampler and without ``seed``: ``TrainingSampler``'s shared random seed.
        Every rank calls it. Loading the catalog's records involves no collective.
    """
    if sampler is None and not isinstance(dataset, IterableDataset):
        sampler = TrainingSampler(len(dataset), seed=kwargs.get("seed"))
    return build_batch_data_loader(
        dataset,
        sampler,
        total_batch_size,
        mapper=mapper,
        aspect_ratio_grouping=aspect_ratio_grouping,
        num_workers=num_workers,
        collate_fn=collate_fn,
        **kwargs,
    )


def build_batch_data_loader(
    dataset: Dataset | Sequence[Any],
    sampler: Sampler | Iterable[int] | None,
    total_batch_size: int | None,
    *,
    mapper: Callable[[Any], Any] | None = None,
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
    records and its mapper; aspect ratios are read from the unmapped records. A map-style
    dataset gets a batch plan (:func:`~trainkit.data.mixed_plan.make_train_plan`: over a
    trainkit training sampler the same records per step for any world size, ``k`` and
    ``num_workers``); an ``IterableDataset`` is a stream dataset whose loader workers form the
    batches (:mod:`trainkit.data.stream_batches`; it resumes with the same ``num_workers``).

    Args:
        dataset: records (list), a map-style dataset (``MapDataset`` for mapped records), or
            an ``IterableDataset``.
        sampler: this rank's indices (a training sampler or any other); ``None`` only for an
            ``IterableDataset``.
        total_batch_size: samples of one optimizer step summed over ranks.
        mapper: record -> sample, applied by the loader (a ``RecordMapper`` or any
            callable); ``None`` maps nothing, or takes the mapper of a ``MapDataset``.
        aspect_ratio_grouping, aspect_ratio_bins, aspect_ratios: batch only samples of one
            bucket of ``width / height`` (per dataset index; default: read from the records'
            ``width``/``height`` now, or, for records without them, from their images' headers
            as the plan reaches each record) between ``bins``
            (``DATALOADER.ASPECT_RATIO_BINS``; ``(1.0,)`` is detectron2's tall/wide split).
        num_workers, prefetch_factor, persistent_workers, pin_memory: the ``DataLoader``'s,
            per rank (workers never persist for a stream dataset).
        collate_fn: list of samples -> batch (default: the list itself).
        drop_last: drop incomplete batches at the end of a finite sampler.
        single_gpu_batch_size: per-rank batch size instead of ``total_batch_size``.
        seed: key of ``sample_rng()`` and of the workers' base seeds (default: the sampler's
            seed, else 0).
        accumulate_steps: micro-batches per optimizer step (``SOLVER.ACCUMULATE_STEPS``).
        **kwargs: further ``torch.utils.data.DataLoader`` arguments (e.g. ``timeout``).

    Raises:
        ConfigError: A ``ValueError``: if the batch does not split evenly over the ranks and
            micro-batches, or grouping finds a record with neither a size nor a
            ``file_name``.
        ValueError: If a map-style dataset has no sampler or a stream has one.
    """
    records, mapper = records_and_mapper(dataset, mapper)
    stream = isinstance(records, IterableDataset)
    if stream and sampler is not None:
        raise ValueError("an IterableDataset yields its own order: pass sampler=None")
    if not stream and sampler is None:
        raise ValueError(
            "a map-style dataset needs a sampler, e.g. TrainingSampler(len(dataset), seed=seed)"
        )
    if seed is None:
        trainkit_sampler = isinstance(sampler, (GlobalStreamSampler, MixedTrainingSampler))
        seed = sampler.seed if trainkit_sampler else 0
    loader_kwargs = {
        "num_workers": num_workers,
        "prefetch_factor": prefetch_factor,
        "persistent_workers": persistent_workers,
        "pin_memory": pin_memory,
        **kwargs,  # the caller's DataLoader arguments win
    }
    collate = collate_fn or trivial_batch_collator
    if stream:
        batch_size = micro_batch_size(total_batch_size, single_gpu_batch_size, accumulate_steps)
        bucket_of = BucketOf(aspect_ratio_bins) if aspect_ratio_grouping else None
        source: BatchPlan | StreamBatches = StreamBatches(
            records,
            mapper,
            batch_size,
            bucket_of=bucket_of,
            collate_fn=collate,
            seed=seed,
            drop_last=drop_last,
        )
        logger.info("Stream dataset: batches of %d formed in the loader workers", batch_size)
    else:
        bucket_ids = None
        if aspect_ratio_grouping and aspect_ratios is None:
            # Sizes read now from the records; those without: from image headers, lazily.
            bucket_ids = record_bucket_ids(records, aspect_ratio_bins)
        elif aspect_ratio_grouping:
            bucket_ids = aspect_ratio_bucket_ids(np.asarray(aspect_ratios), aspect_ratio_bins)
        source = make_train_plan(
            sampler,
            total_batch_size,
            single_gpu_batch_size,
            accumulate_steps,
            bucket_ids,
            drop_last,
        )
    return TrainLoader(
        records, mapper, source, seed=seed, collate_fn=collate, loader_kwargs=loader_kwargs
    )


build_train_loader = build_detection_train_loader
