"""What a train loader reads from a config: its checks, the seed rule, the sampler, the sets.

:func:`train_loader_arguments` is the one reading of a config into a train loader's
arguments, which ``build_detection_train_loader(cfg)`` and
:meth:`TrainDataSpec.from_config <trainkit.data.spec.TrainDataSpec.from_config>` both take,
so a run, its dry run and its replay get the same records, mapper and sampler. Every setting
is checked before any data is loaded (:func:`check_train_loader_config`); the data seed
follows one rule (:func:`resolve_data_seed`).

``DATASETS.TRAIN_WEIGHTS`` mixes map-style ``DATASETS.TRAIN`` sets with
``DATALOADER.SAMPLER_TRAIN "TrainingSampler"`` (:func:`mixed_sets`); a stream, or another
sampler, is a ``ConfigError`` with weights rather than a silently different mix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from torch.utils.data import ConcatDataset, Dataset, IterableDataset, Sampler

from trainkit.config import CfgNode, ConfigError
from trainkit.config.provenance import ORIGIN_RUN_TIME, record_changes
from trainkit.data.catalog import joined_names, load_catalog_parts
from trainkit.data.common import DatasetFromList, records_and_mapper
from trainkit.data.dataset_mapper import DatasetMapper
from trainkit.data.mapping.record_mapper import as_record_mapper, check_max_failures
from trainkit.data.plans.batch_plan import split_batch
from trainkit.data.plans.grouping import BucketOf
from trainkit.data.plans.mixed_sampler import MixedTrainingSampler, mix_weights
from trainkit.data.samplers import (
    RandomSubsetTrainingSampler,
    RepeatFactorTrainingSampler,
    TrainingSampler,
)
from trainkit.data.samplers.distributed_sampler import check_subset_ratio
from trainkit.utils import comm

logger = logging.getLogger(__name__)

__all__ = [
    "TRAIN_SAMPLERS",
    "build_train_sampler",
    "check_mix_config",
    "check_num_workers",
    "check_train_loader_config",
    "mixed_sets",
    "resolve_data_seed",
    "resolve_random_seed",
    "train_loader_arguments",
    "with_seed",
]

TRAIN_SAMPLERS = ("TrainingSampler", "RepeatFactorTrainingSampler", "RandomSubsetTrainingSampler")


def resolve_data_seed(seed: int) -> int:
    """Return the data seed of a run whose config says ``SEED = seed``: the one seed rule.

    A seed >= 0 is the data seed. A negative one asks for a random seed: rank 0 draws it and every
    rank gets the same (the global stream, ``sample_rng()`` and the workers' seeds are keyed by it).

    Collective:
        ``comm.shared_random_seed()`` on every rank when ``seed < 0``.
    """
    return seed if seed >= 0 else comm.shared_random_seed()


def resolve_random_seed(cfg: CfgNode) -> CfgNode:
    """Return ``cfg`` with ``SEED < 0`` replaced by a seed drawn once and shared by all ranks.

    The seed rule applied once (:func:`resolve_data_seed`): loaders and checkpoints share it.

    Collective:
        ``shared_random_seed`` on every rank when ``cfg.SEED < 0``.
    """
    if cfg.SEED >= 0:
        return cfg
    seed = resolve_data_seed(cfg.SEED)
    logger.info("SEED=%d: the data stream of this run uses the shared seed %d", cfg.SEED, seed)
    return with_seed(cfg, seed, "a random seed shared by all ranks")


def with_seed(cfg: CfgNode, seed: int, why: str) -> CfgNode:
    """Return a frozen copy of ``cfg`` with ``SEED`` set to ``seed``.

    Args:
        why: the key's origin (``run time: why``: ``--print-config``, ``config_origins.yaml``).
    """
    out = cfg.clone()
    out.defrost()
    out.SEED = seed
    out.freeze()
    record_changes(cfg, out, f"{ORIGIN_RUN_TIME}: {why}")
    return out


def check_num_workers(cfg: CfgNode, where: str) -> None:
    """Raise a ``ConfigError`` unless ``DATALOADER.NUM_WORKERS`` is >= 0.

    torch's own error does not name the key. ``where``: what loads without loader workers.
    """
    if cfg.DATALOADER.NUM_WORKERS < 0:
        raise ConfigError(
            f"DATALOADER.NUM_WORKERS must be >= 0, got {cfg.DATALOADER.NUM_WORKERS}; use 0 to "
            f"load in {where}."
        )


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
) -> TrainingSampler | RepeatFactorTrainingSampler:
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
        ratio = cfg.DATALOADER.RANDOM_SUBSET_RATIO
        return RandomSubsetTrainingSampler(
            size, ratio, seed_shuffle=seed, seed_subset=seed, **shard
        )
    if name == "RepeatFactorTrainingSampler":
        factors = RepeatFactorTrainingSampler.repeat_factors_from_category_frequency(
            records, cfg.DATALOADER.REPEAT_THRESHOLD, sqrt=cfg.DATALOADER.REPEAT_SQRT
        )
        return RepeatFactorTrainingSampler(factors, seed=seed, **shard)
    return TrainingSampler(size, seed=seed, **shard)


def check_mix_config(cfg: CfgNode) -> None:
    """Check ``DATASETS.TRAIN_WEIGHTS`` against ``DATASETS.TRAIN`` and the sampler, without data.

    Raises:
        ConfigError: A ``ValueError``: for a wrong number of weights, a weight that is not
            positive, or a sampler other than ``TrainingSampler``.
    """
    mix_weights(cfg.DATASETS.TRAIN_WEIGHTS, _train_names(cfg))
    sampler = cfg.DATALOADER.SAMPLER_TRAIN
    if sampler != "TrainingSampler":
        raise ConfigError(
            f"DATASETS.TRAIN_WEIGHTS mixes the training sets with one TrainingSampler per set; "
            f"DATALOADER.SAMPLER_TRAIN {sampler!r} cannot be mixed: set it to "
            "'TrainingSampler', or DATASETS.TRAIN_WEIGHTS () to concatenate the sets."
        )


def mixed_sets(
    cfg: CfgNode, seed: int, *, rank: int | None = None, world_size: int | None = None
) -> tuple[ConcatDataset, MixedTrainingSampler]:
    """Return the ``DATASETS.TRAIN`` sets, concatenated, and the sampler that mixes them.

    Each set is loaded on its own (one shared copy per machine each), so its size is known.

    Args:
        cfg: the config (checked by :func:`check_mix_config`).
        seed: the run's data seed, shared by all ranks.
        rank, world_size: whose share the sampler yields (default: this process's).

    Returns:
        The sets as one dataset (set ``i``'s records after set ``i - 1``'s) and the
        :class:`~trainkit.data.plans.mixed_sampler.MixedTrainingSampler` over them.

    Raises:
        ConfigError: A ``ValueError``: for a stream dataset, or as the catalog loading does.
    """
    names = _train_names(cfg)
    parts = []
    for name in names:
        part, _ = load_catalog_parts(name, filter_empty=cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS)
        if isinstance(part, IterableDataset) or callable(getattr(part, "as_stream", None)):
            raise ConfigError(
                f"DATASETS.TRAIN_WEIGHTS mixes map-style datasets only; {name!r} is a stream "
                f"dataset ({type(part).__name__}): set DATASETS.TRAIN_WEIGHTS () to chain "
                "streams, or register the set as records."
            )
        parts.append(part)
    sizes, batch = [len(part) for part in parts], cfg.SOLVER.IMS_PER_BATCH
    sampler = MixedTrainingSampler(
        sizes, cfg.DATASETS.TRAIN_WEIGHTS, seed, names=names, rank=rank, world_size=world_size
    )
    logger.info(
        "Mixing %s by weights %s (per step of %d records: %s, ...)",
        *(names, sampler.weights, batch, sampler.counts(batch, 0, [0] * len(parts))),
    )
    return ConcatDataset(parts), sampler


def train_loader_arguments(
    cfg: CfgNode,
    mapper: Callable[[Any], Any] | None = None,
    *,
    dataset: Dataset | Sequence[Any] | None = None,
    sampler: Sampler | None = None,
    world_size: int | None = None,
    rank: int | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Return the train loader's arguments a config gives, checked before any data is loaded.

    What ``build_detection_train_loader``'s config form reads (its docstring says how), the
    ``DATASETS.TRAIN`` sets mixed by ``DATASETS.TRAIN_WEIGHTS`` if set.

    Args:
        cfg: the config.
        mapper, dataset, sampler: what the caller gives instead of the config's.
        world_size, rank: whose sampler (default: this process's).
        seed: the data seed (default: ``SEED`` through :func:`resolve_data_seed`).

    Returns:
        The keyword arguments of ``build_detection_train_loader``'s explicit form (and of
        :meth:`~trainkit.data.spec.TrainDataSpec.from_arguments`), ``dataset_sizes`` among them.

    Raises:
        ConfigError: A ``ValueError``: as :func:`check_train_loader_config`, as the catalog,
            or for ``dataset`` or ``sampler`` with ``DATASETS.TRAIN_WEIGHTS``.
        UnknownNameError: A ``KeyError``: for an unregistered dataset name.

    Collective:
        :func:`resolve_data_seed` when ``seed`` is None and ``cfg.SEED < 0``.
    """
    check_train_loader_config(cfg, world_size)  # fail before loading any data
    seed = resolve_data_seed(cfg.SEED) if seed is None else seed
    weights, shard = cfg.DATASETS.TRAIN_WEIGHTS, {"rank": rank, "world_size": world_size}
    if weights and (dataset is not None or sampler is not None):
        raise ConfigError(
            "DATASETS.TRAIN_WEIGHTS mixes the DATASETS.TRAIN sets, which build_train_loader "
            "loads itself; pass no dataset= or sampler=, or set DATASETS.TRAIN_WEIGHTS ()."
        )
    sizes = None
    if weights:
        dataset, sampler = mixed_sets(cfg, seed, **shard)
        sizes = dict(zip(sampler.names, sampler.sizes))
    elif dataset is None:
        filter_empty = cfg.DATALOADER.FILTER_EMPTY_ANNOTATIONS
        dataset, sizes = load_catalog_parts(cfg.DATASETS.TRAIN, filter_empty=filter_empty)
    as_stream = getattr(dataset, "as_stream", None)
    if callable(as_stream):  # a RankDataset: this rank's shares, epoch after epoch
        dataset = as_stream()
    dataset = DatasetFromList(dataset, copy=False) if isinstance(dataset, list) else dataset
    records, own_mapper = records_and_mapper(dataset)
    if mapper is None and own_mapper is None:
        mapper = DatasetMapper(cfg, True)  # detectron2's default: read and augment images
    # The loader gets the records and this mapper as they are: named after the datasets,
    # with the config's failure limit.
    mapper = as_record_mapper(
        mapper,
        name=joined_names(cfg.DATASETS.TRAIN) or type(dataset).__name__,
        max_consecutive_failures=cfg.DATALOADER.MAX_CONSECUTIVE_FAILURES,
    )
    if sampler is None and not isinstance(records, IterableDataset):
        # The unmapped records (read by RepeatFactorTrainingSampler only).
        sampler = build_train_sampler(cfg, records, seed, **shard)
    elif sampler is None:
        logger.info("No sampler: the train dataset is an IterableDataset")
    loader = cfg.DATALOADER
    return {
        "dataset": dataset,
        "mapper": mapper,
        "sampler": sampler,
        # IMS_PER_BATCH is per optimizer step; the loader's batches are its micro-batches.
        "total_batch_size": cfg.SOLVER.IMS_PER_BATCH,
        "accumulate_steps": cfg.SOLVER.ACCUMULATE_STEPS,
        "aspect_ratio_grouping": loader.ASPECT_RATIO_GROUPING,
        "aspect_ratio_bins": loader.ASPECT_RATIO_BINS,
        "num_workers": loader.NUM_WORKERS,
        "prefetch_factor": loader.PREFETCH_FACTOR,
        "persistent_workers": loader.PERSISTENT_WORKERS,
        "pin_memory": loader.PIN_MEMORY,
        "seed": seed,
        "dataset_sizes": sizes,
    }


def _train_names(cfg: CfgNode) -> list[str]:
    train = cfg.DATASETS.TRAIN
    return [train] if isinstance(train, str) else list(train)
