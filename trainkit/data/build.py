"""Build train and test loaders from plain arguments or from a config (detectron2's builders).

The config forms check what they read (:func:`check_train_loader_config`, before any data
is loaded), load the named datasets and hand the records, the mapper, the sampler named by
``DATALOADER.SAMPLER_TRAIN`` and the settings straight to the loader.

``build_detection_train_loader`` and ``build_detection_test_loader`` are
:func:`~trainkit.config.configurable`: called with a config first they read it, called with
a dataset they take explicit arguments, with detectron2's signatures in both forms.
``build_train_loader`` / ``build_test_loader`` are the same functions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from trainkit.config import CfgNode, ConfigError, configurable
from trainkit.data.batch_loader import build_batch_data_loader, records_and_mapper
from trainkit.data.batch_plan import split_batch
from trainkit.data.catalog_loading import get_detection_dataset_dicts, load_catalog_dataset
from trainkit.data.common import DatasetFromList, MapDataset
from trainkit.data.grouping import BucketOf
from trainkit.data.inference_loader import InferenceLoader
from trainkit.data.loader import (
    trivial_batch_collator,
    worker_context_kwargs,
    worker_init_reset_seed,
)
from trainkit.data.mapping import as_record_mapper
from trainkit.data.samplers import (
    InferenceSampler,
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
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


def _name_of(names: str | Sequence[str]) -> str:
    return names if isinstance(names, str) else ",".join(names)


TRAIN_SAMPLERS = ("TrainingSampler", "RepeatFactorTrainingSampler", "RandomSubsetTrainingSampler")


def check_train_loader_config(cfg: CfgNode, world_size: int | None = None) -> None:
    """Check the ``DATALOADER`` and batch settings the train loader uses, without data.

    Args:
        cfg: the config.
        world_size: the job's process count; ``None`` means the current job's.

    Raises:
        ConfigError: A ``ValueError`` naming the first setting that is out of range and its
            valid range.
    """
    world_size = comm.get_world_size() if world_size is None else world_size
    split_batch(cfg.SOLVER.IMS_PER_BATCH, world_size, cfg.SOLVER.ACCUMULATE_STEPS)
    _check_num_workers(cfg, "the training process")
    loader = cfg.DATALOADER
    if loader.NUM_WORKERS > 0 and loader.PREFETCH_FACTOR < 1:
        raise ConfigError(
            f"DATALOADER.PREFETCH_FACTOR must be >= 1 with workers, got {loader.PREFETCH_FACTOR}"
        )
    if loader.MAX_CONSECUTIVE_FAILURES < 1:
        raise ConfigError(
            "DATALOADER.MAX_CONSECUTIVE_FAILURES must be >= 1, got "
            f"{loader.MAX_CONSECUTIVE_FAILURES}"
        )
    _check_sampler_settings(loader)
    if loader.ASPECT_RATIO_GROUPING:
        BucketOf(loader.ASPECT_RATIO_BINS)  # validates the bins


def _check_sampler_settings(loader: CfgNode) -> None:
    """Check DATALOADER.SAMPLER_TRAIN and the settings of the sampler it names."""
    if loader.SAMPLER_TRAIN not in TRAIN_SAMPLERS:
        raise ConfigError(
            f"unknown DATALOADER.SAMPLER_TRAIN {loader.SAMPLER_TRAIN!r}; choose one of "
            f"{', '.join(TRAIN_SAMPLERS)}"
        )
    if loader.SAMPLER_TRAIN == "RandomSubsetTrainingSampler":
        if not 0.0 < loader.RANDOM_SUBSET_RATIO <= 1.0:
            raise ConfigError(
                f"DATALOADER.RANDOM_SUBSET_RATIO must be in (0, 1], got "
                f"{loader.RANDOM_SUBSET_RATIO}; use 1.0 to train on every record."
            )
    if loader.SAMPLER_TRAIN == "RepeatFactorTrainingSampler" and loader.REPEAT_THRESHOLD < 0:
        raise ConfigError(
            f"DATALOADER.REPEAT_THRESHOLD must be >= 0, got {loader.REPEAT_THRESHOLD}; use 0 "
            "to repeat no record."
        )


def _check_sampler_settings(loader: CfgNode) -> None:
    """Check DATALOADER.SAMPLER_TRAIN and the settings of the sampler it names."""
    if loader.SAMPLER_TRAIN not in TRAIN_SAMPLERS:
        raise ConfigError(
            f"unknown DATALOADER.SAMPLER_TRAIN {loader.SAMPLER_TRAIN!r}; choose one of "
            f"{', '.join(TRAIN_SAMPLERS)}"
        )
    if loader.SAMPLER_TRAIN == "RandomSubsetTrainingSampler":
        if not 0.0 < loader.RANDOM_SUBSET_RATIO <= 1.0:
            raise ConfigError(
                f"DATALOADER.RANDOM_SUBSET_RATIO must be in (0, 1], got "
                f"{loader.RANDOM_SUBSET_RATIO}; use 1.0 to train on every record."
            )
    if loader.SAMPLER_TRAIN == "RepeatFactorTrainingSampler" and loader.REPEAT_THRESHOLD < 0:
        raise ConfigError(
            f"DATALOADER.REPEAT_THRESHOLD must be >= 0, got {loader.REPEAT_THRESHOLD}; use 0 "
            "to repeat no record."
        )


def _train_sampler(cfg: CfgNode, records: Sequence[Any], size: int, seed: int) -> Sampler:
    """The sampler ``DATALOADER.SAMPLER_TRAIN`` names (checked before), with the shared seed.

    ``records`` are the unmapped records, read by ``RepeatFactorTrainingSampler`` only.
    """
    name = cfg.DATALOADER.SAMPLER_TRAIN
    logger.info("Using training sampler %s with seed %d", name, seed)
    if name == "RandomSubsetTrainingSampler":
        return RandomSubsetTrainingSampler(
            size, cfg.DATALOADER.RANDOM_SUBSET_RATIO, seed_shuffle=seed, seed_subset=seed
        )
    if name == "RepeatFactorTrainingSampler":
        factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
            records, cfg.DATALOADER.REPEAT_THRESHOLD
        )
        return RepeatFactorTrainingSampler(factors, seed=seed)
    return TrainingSampler(size, seed=seed)


def _check_num_workers(cfg: CfgNode, where: str) -> None:
    # torch's own errors for these ("batch_size should be a positive integer value") do not
    # name the config keys.
    if cfg.DATALOADER.NUM_WORKERS < 0:
        raise ConfigError(
            f"DATALOADER.NUM_WORKERS must be >= 0, got {cfg.DATALOADER.NUM_WORKERS}; use 0 to "
            f"load in {where}."
        )


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
        # Every rank loads; a machine keeps one shared copy of the records (by content).
        dataset = load_catalog_dataset(
            cfg.DATASETS.TRAIN, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS
        )
    as_stream = getattr(dataset, "as_stream", None)
    if callable(as_stream):  # a RankDataset: this rank's shares, epoch after epoch
        dataset = as_stream()
    records = dataset if isinstance(dataset, list) else records_and_mapper(dataset)[0]
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
    # The loader gets the records and this mapper as they are: named after the datasets,
    # with the config's failure limit.
    mapper = as_record_mapper(
        mapper,
        name=_name_of(cfg.DATASETS.TRAIN) or type(dataset).__name__,
        max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
    )
    if sampler is None and not isinstance(dataset, IterableDataset):
        # The unmapped records (read by RepeatFactorTrainingSampler only).
        sampler = _train_sampler(cfg, records, len(dataset), seed)
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
    sampler=None)``. It reads ``DATASETS.TRAIN`` (unless ``dataset`` is given; a
    ``RankDataset`` is read as its stream of shares, ``RankDataset.as_stream()``),
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
        Config form: ``comm.shared_random_seed()`` when ``cfg.SEED < 0``. Explicit form
        without a sampler and without ``seed``: ``TrainingSampler``'s shared random seed.
        Every rank calls it. Loading the catalog's records involves no collective.
    """
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
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


def _check_test_loader_config(cfg: CfgNode) -> None:
    if cfg.TEST.IMS_PER_BATCH < 1:
        raise ConfigError(
            f"TEST.IMS_PER_BATCH must be >= 1, got {cfg.TEST.IMS_PER_BATCH}; set it to the "
            "images per test batch on each rank."
        )
    _check_num_workers(cfg, "the evaluating process")


def _test_loader_from_config(
    cfg: CfgNode, dataset_name: str | Sequence[str], mapper: Mapper | None = None
) -> dict[str, Any]:
    _check_test_loader_config(cfg)  # fail before loading any data
    # The given name(s), not DATASETS.TEST: each test set is evaluated on its own.
    dataset = load_catalog_dataset(dataset_name)
    mapper = as_record_mapper(
        mapper,
        name=_name_of(dataset_name),
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
        An :class:`~trainkit.data.inference_loader.InferenceLoader` (a torch ``DataLoader``
        with ``len()``) for a map-style dataset: a record whose mapper returns ``None`` or
        raises is skipped and reported, never replaced, so every record counts once.

    Raises:
        ConfigError: A ``ValueError``: config form: for a TEST.IMS_PER_BATCH below 1, a
            negative DATALOADER.NUM_WORKERS, or an empty dataset.
        ValueError: If a sampler is given with an ``IterableDataset``.
        UnknownNameError: A ``KeyError``: for an unregistered dataset name (config form).

    """
    if isinstance(dataset, list):
        dataset = DatasetFromList(dataset, copy=False)
    workers = {
        "num_workers": num_workers,
        "worker_init_fn": worker_init_reset_seed,
        **(worker_context_kwargs() if num_workers > 0 else {}),
    }
    collate = collate_fn or trivial_batch_collator
    if isinstance(dataset, IterableDataset):
        if sampler is not None:
            raise ValueError("an IterableDataset yields its own order: pass sampler=None")
        if mapper is not None:  # skips the elements that fail (MapDataset's iterable form)
            dataset = MapDataset(dataset, as_record_mapper(mapper))
        return DataLoader(dataset, batch_size=batch_size, collate_fn=collate, **workers)
    if mapper is None:
        records, record_mapper = records_and_mapper(dataset)
    else:
        records, record_mapper = dataset, as_record_mapper(mapper)
    if sampler is None:
        sampler = InferenceSampler(len(records))
    return InferenceLoader(
        records, record_mapper, sampler=sampler, batch_size=batch_size, collate_fn=collate,
        **workers,
    )  # fmt: skip


build_train_loader = build_detection_train_loader
build_test_loader = build_detection_test_loader
